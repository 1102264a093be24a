"""Quarantine: move a batch's offending rows from the target to `<lake>/_deltadrain/quarantine/<pipeline>`.

Why it loses nothing: the offending rows are first MERGEd into the quarantine
table (insert-only, keyed on message id + batch + source position, so a rerun adds nothing), and
only then DELETEd from the target (a MERGE ... WHEN MATCHED DELETE on the same keys and the row's
`_dd_run_id`: a row a reprocess rewrote meanwhile stays, see take_back_rewritten). A crash
between the two leaves the rows in both tables; the next check of that batch finds them again in
the target, the quarantine MERGE skips them, and the DELETE completes. A crash after the DELETE and
before the results row leaves rows no result accounts for: the next check of the batch reports them
as its own (unreported, `adopted_runs`) rather than a clean pass. The DELETE commit carries no
SetTransaction and no `pipeline`/`batch` metadata, so the drain's checkpoint (the newest commit
naming the pipeline, else the txn) is untouched. It must not run concurrently with a drain of the
same pipeline (the drain's MERGE would lose the race and stop): the ingest DAG runs it right after
the drain, and a whole-table check never quarantines (it reports, with `quarantine` acting as `warn`).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from deltadrain import failpoints
from deltadrain.config import DeltadrainConfig, PipelineConfig
from deltadrain.config.lakeurl import LakeUrl
from deltadrain.lake.delta import (
    add_missing_columns,
    ensure_table,
    is_table,
    merge_into,
    of_table,
    retry_conflicts,
    sql_literal,
    sql_name,
)
from deltadrain.quality.checks import Check, violation
from deltadrain.quality.results import results_path

log = logging.getLogger(__name__)

TXN_KEYS = ("spark.databricks.delta.write.txnAppId", "spark.databricks.delta.write.txnVersion")
USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"


def quarantine_path(cfg: DeltadrainConfig, pipeline: PipelineConfig) -> Path | LakeUrl:
    return cfg.quarantine_path(pipeline)


def offending_rows(df, checks: list[Check], failed: list[dict]):
    """The rows breaking a failed row-level check, each with `_dq_reason` naming every check it breaks."""
    from pyspark.sql import functions as F

    # A check GX could not evaluate (its column missing, say) names no rows: it is reported, not moved on.
    bad = [checks[i] for i, r in enumerate(failed)
           if not r["success"] and checks[i].row_level and not r.get("error") and checks[i].column in df.columns]
    if not bad:
        return None
    flagged = df.select("*", *[violation(c, df).alias(f"_dq_v{i}") for i, c in enumerate(bad)])
    reason = F.concat_ws("; ", *[F.when(F.col(f"_dq_v{i}"), F.lit(c.name)) for i, c in enumerate(bad)])
    any_bad = F.lit(False)
    for i in range(len(bad)):
        any_bad = any_bad | F.col(f"_dq_v{i}")
    return flagged.where(any_bad).withColumn("_dq_reason", reason).drop(*[f"_dq_v{i}" for i in range(len(bad))])


def quarantine_keys(id_field: str, left: str):
    """`left` row is source row `s`: null-safe on the id (a null id is itself a reason to quarantine),
    and the source position keeps duplicates of one id apart."""
    from pyspark.sql import functions as F

    cond = F.col(f"{left}._dd_batch") == F.col("s._dd_batch")
    for column in (f"`{id_field}`", "_dd_partition", "_dd_position"):
        cond = cond & F.col(f"{left}.{column}").eqNullSafe(F.col(f"s.{column}"))
    return cond


def quarantine_keys_sql(id_field: str, left: str) -> str:
    """quarantine_keys as SQL text, for a MERGE condition."""
    cond = f"{left}._dd_batch = s._dd_batch"
    for column in (sql_name(id_field), "_dd_partition", "_dd_position"):
        cond += f" AND {left}.{column} <=> s.{column}"
    return cond


def quarantine(spark, cfg: DeltadrainConfig, pipeline: PipelineConfig, batch: int, rows, run_id: str,
               table: str | None) -> int:
    """Move `rows` (offending rows of `batch` of the target whose Delta id is `table`, with
    `_dq_reason`) from the target to the quarantine table.

    Quarantine first (idempotent), then delete from the target: see the module docstring.
    """
    from pyspark.sql import functions as F

    target, qpath = str(cfg.target_path(pipeline)), str(quarantine_path(cfg, pipeline))
    id_field = pipeline.payload_schema.id_field
    staged = (rows.withColumn("_dq_run_id", F.lit(run_id)).withColumn("_dq_quarantined_at", F.current_timestamp())
              .withColumn("_dq_table_id", F.lit(table).cast("string")))
    staged = staged.localCheckpoint()  # the window and the delete below must not re-evaluate against a changed target
    moved = staged.count()
    if moved == 0:
        return 0
    ensure_table(spark, qpath, staged.schema)
    add_missing_columns(spark, qpath, staged.schema)  # a quarantine table from before `_dq_table_id`
    # A copy another target table of this name left at the same place (the table and the source made
    # anew: batch 1 again at the same positions) is not this row's: matching it would insert nothing,
    # and the DELETE below would then leave the row in neither table. Copies from before the column
    # (null) still match, as they did.
    same_table = "(q._dq_table_id IS NULL OR q._dq_table_id <=> s._dq_table_id)"
    retry_conflicts(lambda: merge_into(spark, qpath, staged, f"{quarantine_keys_sql(id_field, 'q')} AND {same_table}",
                                       "WHEN NOT MATCHED THEN INSERT *", alias="q"))
    failpoints.fail("before_quarantine_delete")  # tests: a crash here leaves the rows in both tables
    keys = staged.select(f"`{id_field}`", "_dd_batch", "_dd_partition", "_dd_position", "_dd_run_id").distinct()
    # Only the rows as they were checked: one a reprocess replay rewrote since (a new _dd_run_id) stays.
    cond = (f"{quarantine_keys_sql(id_field, 't')} AND t._dd_run_id <=> s._dd_run_id "
            f"AND t._dd_batch = {sql_literal(batch)}")  # the batch prunes other batches' files
    # No txn and no pipeline/batch keys in this commit's metadata: the drain's checkpoint ignores it.
    for key in TXN_KEYS:
        spark.conf.unset(key)
    spark.conf.set(USER_METADATA, json.dumps({"deltadrain_quality": 1, "quarantine": {
        "pipeline": pipeline.name, "of_batch": batch, "rows": moved, "run_id": run_id}}, sort_keys=True))
    try:
        retry_conflicts(lambda: merge_into(spark, target, keys, cond, "WHEN MATCHED THEN DELETE"))
    finally:
        spark.conf.unset(USER_METADATA)
    failpoints.fail("after_quarantine_delete")  # tests: a crash here leaves moved rows no results row names
    return moved


@dataclass
class Unreported:
    """Rows of a batch in the quarantine table that no results row accounts for (see unreported)."""

    runs: list[str]  # the checks that moved them
    rows: int  # of those, the rows no longer in the target: this check will not move them again
    reasons: list[str]  # the checks those rows broke


def unreported(spark, cfg: DeltadrainConfig, pipeline: PipelineConfig, batch: int, table: str | None) -> Unreported:
    """The quarantine rows of `batch` moved by checks that wrote no results row: a check that died
    after its DELETE (or between its MERGE and DELETE) and before write_result. Without this, the
    next check would find the batch clean and report it passed with nothing quarantined.

    A results row accounts for the rows of its own `run_id` and of its `adopted_runs`. Copies of
    rows still in the target are the next quarantine's to move and count; they are adopted but not
    counted here. Rows of another target table of the same name (deleted and created again) are not
    this batch's: `_dq_table_id` tells them apart. Rows from before it (null) count for any table,
    and only when moved after the batch's last result: before this function, the check that finished
    a crashed check's move counted that check's rows as its own.
    """
    from pyspark.sql import functions as F

    qpath, rpath = str(quarantine_path(cfg, pipeline)), str(results_path(cfg))
    if not is_table(spark, qpath):
        return Unreported([], 0, [])
    copies = of_table(spark.read.format("delta").load(qpath).where(F.col("_dd_batch") == F.lit(batch)), table)
    older = F.col("_dq_table_id").isNull() if "_dq_table_id" in copies.columns else F.lit(True)
    # Per run: one quarantine MERGE wrote its rows, with one table id and one timestamp.
    seen = copies.groupBy("_dq_run_id").agg(F.max(older.cast("int")).alias("older"),
                                             F.max("_dq_quarantined_at").alias("at")).collect()
    if not seen:  # most checks: the batch has nothing in the quarantine yet, and the results are not read
        return Unreported([], 0, [])
    accounted, last = set(), None
    if is_table(spark, rpath):
        results = spark.read.format("delta").load(rpath).where(
            (F.col("pipeline") == F.lit(pipeline.name)) & (F.col("scope") == F.lit("batch"))
            & (F.col("batch") == F.lit(batch)))
        adopted = F.col("adopted_runs") if "adopted_runs" in results.columns else F.array().cast("array<string>")
        for r in results.select("run_id", adopted.alias("adopted"), "checked_at").collect():
            accounted |= {r.run_id, *(r.adopted or [])}
            last = r.checked_at if last is None or (r.checked_at and r.checked_at > last) else last
    runs = {r._dq_run_id for r in seen if r._dq_run_id not in accounted
            and not (r.older and last is not None and r.at is not None and r.at <= last)}
    if not runs:
        return Unreported([], 0, [])
    rows = spark.read.format("delta").load(str(cfg.target_path(pipeline))).where(F.col("_dd_batch") == F.lit(batch))
    gone = (copies.where(F.col("_dq_run_id").isin(sorted(runs))).alias("s")
            .join(rows.alias("t"), quarantine_keys(pipeline.payload_schema.id_field, "t"), "left_anti"))
    counted = gone.groupBy("_dq_reason").count().collect()
    return Unreported(sorted(runs), sum(r["count"] for r in counted),
                      reasons_of([r._dq_reason for r in counted if r._dq_reason]))


def reasons_of(dq_reasons: list[str]) -> list[str]:
    """The check names in `_dq_reason` values (each names every check its row breaks, "; "-joined), once each."""
    return sorted({name for reason in dq_reasons for name in reason.split("; ") if name})


def with_unreported(failed: list[str], reasons: list[str]) -> list[str]:
    """The failed checks of a report that adopts unreported quarantine rows: its own, then the ones
    only those rows broke (the check that moved them judged them; this one no longer sees them)."""
    return [*failed, *(name for name in reasons if name not in failed)]


def take_back_rewritten(spark, cfg: DeltadrainConfig, pipeline: PipelineConfig, batch: int,
                        table: str | None) -> int:
    """Drop the quarantine copies of `batch`'s rows that the target (Delta id `table`) still holds
    rewritten (another `_dd_run_id`): a reprocess replay rewrote them between a check and its DELETE,
    which then left them (see quarantine), or after a crash there. Their new values were never
    checked: they stay in the target for the next check, and a row is in one table or the other.
    Another table's copies at the same place are that table's, and stay. Returns how many."""
    from pyspark.sql import functions as F

    target, qpath = str(cfg.target_path(pipeline)), str(quarantine_path(cfg, pipeline))
    if not is_table(spark, qpath):
        return 0
    id_field = pipeline.payload_schema.id_field
    of_batch = F.col("_dd_batch") == F.lit(batch)  # both tables: Delta's statistics skip other batches' files
    copies = of_table(spark.read.format("delta").load(qpath).where(of_batch), table)
    rows = spark.read.format("delta").load(target).where(of_batch)
    rewritten = quarantine_keys(id_field, "t") & ~F.col("t._dd_run_id").eqNullSafe(F.col("s._dd_run_id"))
    stale = (copies.alias("s").join(rows.alias("t"), rewritten, "left_semi")
             .select(f"`{id_field}`", "_dd_batch", "_dd_partition", "_dd_position", "_dd_run_id").localCheckpoint())
    count = stale.count()
    if count:
        log.warning("pipeline %s batch %d: %d row(s) were rewritten after they were checked (a reprocess replay): "
                    "they stay in the target and leave the quarantine", pipeline.name, batch, count)
        same = f"{quarantine_keys_sql(id_field, 'q')} AND q._dd_run_id <=> s._dd_run_id"
        retry_conflicts(lambda: merge_into(spark, qpath, stale, same, "WHEN MATCHED THEN DELETE", alias="q"))
    return count
