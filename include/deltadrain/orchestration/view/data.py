"""What the operator's view shows, as plain data: a source's counts (waited for in a shared pool),
the index's row of each pipeline, a pipeline's page and its last batches with their quality checks.

Reads go through `deltadrain.observe.tables` (delta-rs): no Spark JVM in the API server.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from deltadrain.config import DeltadrainConfig, PipelineConfig
from deltadrain.names import MAINTENANCE_DAG, ingest_dag_id
from deltadrain.run.outcome import Outcome
from deltadrain.sources import LakeSide, SourceNote, source_of

log = logging.getLogger(__name__)

COMMITTED = (Outcome.COMMITTED, Outcome.ALREADY_COMMITTED)  # the runs whose batch a quality check is of
SUMMARY_RUNS = 10  # numbered runs the index page reads per pipeline to find its last committed batch
SOURCE_WAIT_S = 10  # the longest a page waits for a source's counts (Valkey's own timeouts are 3 s)


# -- reading -----------------------------------------------------------------------------------------


def source_counts(cfg: DeltadrainConfig, pipeline: PipelineConfig, until: float | None = None) -> dict:
    """PENDING / CLAIMED from the source, with the checkpoint as delta-rs reads it. Errors are reported
    by type only (messages may hold hosts), but for what the source answered (SourceNote). `until`
    (time.monotonic()): when the source's calls give up (their own waits run to 30 s)."""
    from deltadrain.observe import notes as states
    from deltadrain.observe import tables as lakeview

    try:
        counts = states.source_counts(cfg, pipeline, LakeSide(lambda: lakeview.checkpoint(cfg, pipeline)),
                                      until=until, quick=True, with_reason=False)
    except SourceNote as exc:  # e.g. a topic deleted or recreated under the lake's checkpoint
        return {"PENDING": None, "CLAIMED": None, "source_note": str(exc)}
    except Exception as exc:  # the view still shows the lake side
        return {"PENDING": None, "CLAIMED": None, "source_note": f"source unreachable ({type(exc).__name__})"}
    if counts["PENDING"] is None:  # a server that cannot be reached: said in a note, with its address
        return {"PENDING": None, "CLAIMED": None, "notes": counts["notes"]}
    return _claims(counts, pipeline)


def _claims(counts: dict, pipeline: PipelineConfig) -> dict:
    """What the page shows of a source's counts: totals, who holds claims (stale ones flagged), partitions,
    and the open gaps: what the next run reports (Valkey: entries removed before the group read them,
    or recorded by a run no commit carried yet; Kafka: offsets retention deleted past the checkpoint)."""
    from deltadrain.observe import tables as lakeview
    from deltadrain.observe.status import mark_stale

    mark_stale(counts, source_of(pipeline).stale_after_ms(pipeline))
    return {"PENDING": counts["PENDING"], "CLAIMED": counts["CLAIMED"], "claimed_by": counts["claimed_by"],
            "oldest_claim_idle_ms": counts["oldest_claim_idle_ms"], "STALE_CLAIMED": counts["STALE_CLAIMED"],
            "stale_after_ms": counts["stale_after_ms"],
            "partitions": {k: {"pending": v["pending"], "claimed": v["claimed"]}
                           for k, v in counts["partitions"].items()},
            "open_gaps": [lakeview.gap_row(g) for g in counts.get("gaps") or []],
            "dead_runs": counts.get("dead_runs") or [], "splits": counts.get("splits") or [],
            "notes": counts.get("notes") or []}


def with_lake_notes(cfg: DeltadrainConfig, pipeline: PipelineConfig, notes: list[dict] | None) -> list[dict]:
    """The notes of a page or index row (states, not failures: shown in grey): the lake's (a pipeline
    never run) before the source's (a topic not created yet, a stream never written, a server down)."""
    from deltadrain.observe import notes as states
    from deltadrain.observe import tables as lakeview

    never = states.never_run(pipeline, lakeview.open_table(str(cfg.target_path(pipeline))) is not None,
                             cfg.source_file)
    return ([never] if never else []) + list(notes or [])


def with_checks(cfg: DeltadrainConfig, pipeline: PipelineConfig, runs: list[dict]) -> list[dict]:
    """`runs` (metrics rows), each that committed its batch given that batch's newest check as `quality`
    (None: not checked yet, and then `owed`: whether a quality task is to check it). Other runs have
    no `quality`: their number may be a later run's batch."""
    from deltadrain.observe import tables as lakeview

    others = [r for r in runs if r.get("batch") and r.get("outcome") not in COMMITTED]
    # A try that committed and then failed is recorded as an error: its commit names its run.
    made = lakeview.committed_runs(cfg, pipeline) if others else set()
    committed = [r for r in runs if r.get("batch") and (r.get("outcome") in COMMITTED
                                                        or (r["batch"], r.get("run_id")) in made)]
    checks = lakeview.batch_checks(cfg, pipeline, [r["batch"] for r in committed])
    for r in committed:
        r["quality"] = checks.get(r["batch"])
    if unchecked := [r for r in committed if r["quality"] is None]:
        try:
            floor = lakeview.owed_from(cfg, pipeline)
        except Exception:  # it only qualifies "not checked": the page shows the rest
            log.exception("deltadrain view: what pipeline %s owes a check could not be read", pipeline.name)
            return runs
        for r in unchecked:
            r["owed"] = floor is not None and r["batch"] >= floor
    return runs


def pipeline_summary(cfg: DeltadrainConfig, pipeline: PipelineConfig) -> dict:
    """The index page's row of a pipeline: lag, dead letters, what needs a look, its last run and the
    last committed batch with its check. A lake it cannot read is said in the row, not raised: one
    pipeline must not take the index down."""
    from deltadrain.observe import tables as lakeview

    row: dict[str, Any] = {"pipeline": pipeline.name, "source": pipeline.source.kind, "lag": None, "DEAD": None, "source_note": None,
           "lake_note": None, "stale_messages": 0, "open_gaps": 0, "last_run": None, "last_committed": None,
           "notes": []}
    with lakeview.one_read():  # in the pool's thread: each row opens its own tables once
        counts = bounded_source_counts(cfg, pipeline)
        row.update(lag=counts["PENDING"] + counts["CLAIMED"] if counts["PENDING"] is not None else None,
                   source_note=counts.get("source_note"), stale_messages=counts.get("STALE_CLAIMED") or 0,
                   open_gaps=len(counts.get("open_gaps") or []), notes=list(counts.get("notes") or []))
        try:
            last = lakeview.last_batches(cfg, pipeline, 1)
            numbered = with_checks(cfg, pipeline, lakeview.last_batches(cfg, pipeline, SUMMARY_RUNS, numbered=True))
            row.update(DEAD=lakeview.dlq_counts(cfg, pipeline).get("DEAD", 0), last_run=last[0] if last else None,
                       last_committed=next((r for r in numbered if "quality" in r), None),
                       notes=with_lake_notes(cfg, pipeline, row["notes"]))
        except Exception as exc:
            log.exception("deltadrain view: the lake of pipeline %s could not be read", pipeline.name)
            row["lake_note"] = f"lake unreadable ({type(exc).__name__})"
    return row


def pipeline_summaries(cfg: DeltadrainConfig, pipelines: list[PipelineConfig]) -> list[dict]:
    """pipeline_summary of each, side by side: a source that does not answer costs its wait once."""
    if len(pipelines) <= 1:
        return [pipeline_summary(cfg, p) for p in pipelines]
    with ThreadPoolExecutor(max_workers=min(8, len(pipelines))) as pool:
        return list(pool.map(lambda p: pipeline_summary(cfg, p), pipelines))


def bounded_source_counts(cfg: DeltadrainConfig, pipeline: PipelineConfig) -> dict:
    """source_counts, waited for at most SOURCE_WAIT_S. Kafka's broker calls give up a second before
    (their own waits run to 30 s), so a broker that is down is named unreachable and frees its pool
    thread about when the page stops waiting; a source still past the wait is said to be slow."""
    from concurrent.futures import TimeoutError as Late

    # In the caller's context: a Kafka source reads the target's history, which the page reads too (one_read).
    until = time.monotonic() + SOURCE_WAIT_S - 1  # from the ask: the pool may start the call later
    future = _source_pool().submit(contextvars.copy_context().run, source_counts, cfg, pipeline, until)
    try:
        return future.result(timeout=SOURCE_WAIT_S)
    except Late:
        return {"PENDING": None, "CLAIMED": None, "source_note": f"source did not answer within {SOURCE_WAIT_S} s"}


@functools.cache
def _source_pool() -> ThreadPoolExecutor:
    """Where source calls run, so that a page can stop waiting for one; shared, so slow sources cannot
    pile up threads. Made on the first page, not when Airflow loads the plugin in every process."""
    return ThreadPoolExecutor(max_workers=8, thread_name_prefix="deltadrain-view-source")


def pipeline_view(cfg: DeltadrainConfig, pipeline: PipelineConfig, dlq_state: str | None = "DEAD",
                  dlq_limit: int = 100, batches: int = 10) -> dict:
    """Everything the page shows, as plain data (the JSON endpoint returns it as is)."""
    from deltadrain.observe import tables as lakeview

    began = time.monotonic()
    out: dict = {"pipeline": pipeline.name, "source": pipeline.source.kind,
                 "partitions": source_of(pipeline).reads(pipeline),
                 "on_gap": pipeline.source.on_gap, "ingest_dag": ingest_dag_id(pipeline.name)}
    with lakeview.one_read():
        out.update(bounded_source_counts(cfg, pipeline))
        out["notes"] = with_lake_notes(cfg, pipeline, out.get("notes"))
        out["PUBLISHED"] = lakeview.published_count(cfg, pipeline)
        counts = lakeview.dlq_counts(cfg, pipeline)
        out["DEAD"], out["REPLAYED"] = counts.get("DEAD", 0), counts.get("REPLAYED", 0)
        out["lag"] = (out["PENDING"] + out["CLAIMED"]) if out["PENDING"] is not None else None
        out["last_commit"] = lakeview.last_commit(cfg, pipeline)
        out["data_files"], out["maintenance_dag"] = lakeview.data_files(cfg, pipeline), MAINTENANCE_DAG
        out["gaps"] = lakeview.recorded_gaps(cfg, pipeline)
        out["last_batches"] = with_checks(cfg, pipeline, lakeview.last_batches(cfg, pipeline, batches))
        out["dead_letters"] = lakeview.dead_letters(cfg, pipeline, dlq_state, dlq_limit)
    out["read_seconds"] = round(time.monotonic() - began, 3)
    return out


def _jsonable(value):
    """`value` in JSON's types (datetimes as ISO text, bytes decoded): the JSON endpoints return it."""
    from datetime import datetime

    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value
