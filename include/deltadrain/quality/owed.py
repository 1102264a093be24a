"""Which batches are owed a check: the ones a drain task leaves (batches_to_check), and the committed
ones with no result yet (owed_batches). A batch check with `owed` first takes those on: a drain try
that died after its commit hands its batch to no quality task, even when that was the pipeline's
first Airflow drain (first_scheduled).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from deltadrain.config import DeltadrainConfig, PipelineConfig
from deltadrain.lake.checkpoint import carries_batch, committed_batch
from deltadrain.lake.delta import is_table, recent_commits, table_id
from deltadrain.names import ingest_run_prefix
from deltadrain.quality.results import results_path

FIRST_SCHEDULED_SCAN = 200  # commits looked over for the ingest DAG's first batch (the view looks as far)
CATCH_UP = 20  # owed batches a batch check takes on besides its own; the next check takes the rest


def batch_to_check(summary) -> int | None:
    """The batch a drain run's summary (RunSummary or its JSON dict) leaves to check, or None.

    `already_committed` counts: its batch was written by an earlier attempt whose check may never
    have run, and checking twice is harmless (see quarantine).
    """
    get = summary.get if isinstance(summary, dict) else lambda key: getattr(summary, key, None)
    batch = get("batch")
    if get("outcome") in ("committed", "already_committed") and batch:
        return int(batch)
    return None


def batches_to_check(summary: dict) -> list[int]:
    """The batches a drain task's summary leaves to check: all the batches of a catch-up
    (`deltadrain.catchup`), or the one of a single run."""
    if summary.get("batches") is not None:
        return [int(b) for b in summary["batches"]]
    batch = batch_to_check(summary)
    return [] if batch is None else [batch]


def owed_batches(checked: set[int], requested: list[int], committed: int | None,
                 limit: int = CATCH_UP, settling: frozenset[int] = frozenset(),
                 first_scheduled: int | None = None) -> tuple[list[int], int]:
    """The committed batches with no result yet, besides `requested` and the `settling` ones (committed
    too recently: their own ingest run checks them): (the oldest `limit`, how many more).

    A drain try that commits and then fails (its acknowledgement, the group offsets, a kill) hands
    no batch to its quality task, and a check that dies (a crash between quarantine's MERGE and
    DELETE) writes no result: the next check takes them on. Owed means from the pipeline's first
    check on; before it, with none yet, from the batches asked for or `first_scheduled` (the oldest
    batch the ingest DAG's drain committed), whichever is older: a pipeline drained for a while with the
    CLI is not made to check its whole history, and the first Airflow drain that committed and then
    failed does not leave its batch unchecked.
    """
    starts = checked or {*requested, *(() if first_scheduled is None else (first_scheduled,))}
    if committed is None or not starts:
        return [], 0
    floor = max(1, min(starts))
    owed = [b for b in range(floor, committed + 1) if b not in checked and b not in requested and b not in settling]
    return owed[:limit], max(0, len(owed) - limit)


def checked_batches(spark, cfg: DeltadrainConfig, pipeline: PipelineConfig, table: str | None = None) -> set[int]:
    """The batches of `pipeline` with a batch-scope row in the results table, of the target table
    whose Delta id is `table`: after the target was deleted and created again, its batch numbers
    start over, and the old table's results must not make its new batches look checked. Rows
    written before results named their table (null) count for any."""
    from pyspark.sql import functions as F

    path = str(results_path(cfg))
    if not is_table(spark, path):
        return set()
    results = spark.read.format("delta").load(path)
    rows = results.where((F.col("pipeline") == F.lit(pipeline.name)) & (F.col("scope") == F.lit("batch"))
                         & F.col("batch").isNotNull())
    if table is not None and "table_id" in results.columns:
        rows = rows.where(F.col("table_id").isNull() | (F.col("table_id") == F.lit(table)))
    return {int(r.batch) for r in rows.select("batch").distinct().collect()}


def catch_up(cfg: DeltadrainConfig, pipeline: PipelineConfig, spark, requested: list[int],
             settle: timedelta = timedelta(0)) -> tuple[list[int], int]:
    """owed_batches against the results table and the target's newest committed batch, leaving out
    the batches committed less than `settle` ago."""
    target = str(cfg.target_path(pipeline))
    if not is_table(spark, target):
        return [], 0
    committed = committed_batch(target, pipeline.name)
    settling: frozenset[int] = frozenset()
    if settle > timedelta(0) and committed is not None:
        since = datetime.now(UTC) - settle
        settling = frozenset(c["meta"]["batch"] for c in recent_commits(target, 200, since=since)
                             if carries_batch(c["meta"], pipeline.name))
    checked = checked_batches(spark, cfg, pipeline, table_id(target))
    first = None if checked or committed is None else first_scheduled(spark, target, pipeline.name)
    return owed_batches(checked, requested, committed, settling=settling, first_scheduled=first)


def first_scheduled(spark, target: str, pipeline: str, scan: int = FIRST_SCHEDULED_SCAN) -> int | None:
    """The oldest batch among the target's last `scan` commits that a drain of the pipeline's ingest
    DAG committed (its run id says so): its DAG run's quality task was to check it. Read only while
    the pipeline has no check yet; a batch whose commit file log cleanup removed is not found."""
    return oldest_scheduled((c["meta"] for c in recent_commits(target, scan)), pipeline)


def oldest_scheduled(metas, pipeline: str) -> int | None:
    """The oldest batch among commit metadata `metas` that a drain of the pipeline's ingest DAG
    committed, by its run id's prefix. Pure: first_scheduled (Spark) and the view (delta-rs) share it."""
    prefix = ingest_run_prefix(pipeline)
    return min((m["batch"] for m in metas
                if carries_batch(m, pipeline) and str(m.get("run_id") or "").startswith(prefix)), default=None)
