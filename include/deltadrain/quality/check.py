"""The check: run a pipeline's suite on one batch's rows or on the whole table, and apply its failure policy.

- A batch's rows are the rows whose `_dd_batch` is the batch: every target row carries the batch
  that wrote it, so the filter is exact, and Delta's file statistics on `_dd_batch` skip every
  other file. The batch's commit (checkpoint.find_commit) supplies the table version and drain run.
- Every check appends one row to the results table and renders Data Docs (quality.results, quality.gx).
- Failure policy: `fail` raises QualityFailed (after the results row is written), `warn` logs and
  returns, `quarantine` moves the batch's offending rows to the quarantine table (quality.quarantine).
"""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime, timedelta

from deltadrain.config import DeltadrainConfig, PipelineConfig
from deltadrain.lake.checkpoint import find_commit
from deltadrain.lake.delta import is_table, snapshot_txn, table_id
from deltadrain.lake.metrics import batch_finished_at
from deltadrain.paths import command_line
from deltadrain.quality.checks import build_checks, suite_name
from deltadrain.quality.errors import BatchesFailed, QualityError, QualityFailed
from deltadrain.quality.gx import docs_dir, run_gx, summarize
from deltadrain.quality.owed import catch_up
from deltadrain.quality.quarantine import (
    offending_rows,
    quarantine,
    take_back_rewritten,
    unreported,
    with_unreported,
)
from deltadrain.quality.results import QualityReport, results_path, write_result

log = logging.getLogger(__name__)

RECHECKS = 2  # a batch check checks again this often when rows were rewritten under it (take_back_rewritten)


def new_check_id() -> str:
    return f"dq-{datetime.now(UTC).strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}"


def batch_rows(cfg: DeltadrainConfig, pipeline: PipelineConfig, spark, batch: int):
    """(rows the batch's commit added, table version, drain run id, commit time or None when
    find_commit does not reach the commit file: older than the newest 200 commits, or removed by
    log cleanup); raises if the batch is not committed."""
    from pyspark.sql import functions as F

    target = str(cfg.target_path(pipeline))
    if not is_table(spark, target):
        raise QualityError(f"pipeline '{pipeline.name}': no target table at {target}; nothing to check")
    commit = find_commit(target, pipeline.name, batch)
    if commit is not None:
        version, drain_run, at = commit["version"], (commit["meta"] or {}).get("run_id"), commit.get("timestamp")
    else:  # commit file gone (log cleanup) or never written: the txn says which
        committed, version = snapshot_txn(target, pipeline.name)
        if committed is None or batch > committed or batch < 1:
            raise QualityError(f"pipeline '{pipeline.name}': batch {batch} is not committed "
                               f"(the table holds batches up to {committed or 0})")
        drain_run = at = None
    rows = spark.read.format("delta").load(target).where(F.col("_dd_batch") == F.lit(batch))
    return rows, version, drain_run, at


def check_batches(cfg: DeltadrainConfig, pipeline: PipelineConfig, spark, batches: list[int],
                  run_id: str | None = None, owed: bool = False, settle: timedelta = timedelta(0)) -> dict:
    """check_batch for each batch, all of them even when one fails. One batch: its report. Several:
    one summary of them (success, failed expectations per batch, rows, quarantined, each report).
    With `owed`, first the committed batches that have no result yet (catch_up); the summary then
    says which (`caught_up`) and how many are left for the next check (`still_owed`); `settle`
    leaves out the ones committed less than that long ago (the daily DAG leaves an hour).
    Raises BatchesFailed (with that summary) when a batch failed under `on_failure: fail`, after all ran."""
    caught_up, left = catch_up(cfg, pipeline, spark, batches, settle) if owed else ([], 0)
    if caught_up or left:
        log.warning("pipeline %s: batches %s were committed without a quality result; checking them now%s",
                    pipeline.name, caught_up, f" ({left} more are left for the next check)" if left else "")
    batches = [*caught_up, *batches]
    reports, failure, unchecked = [], None, {}
    for batch in batches:
        try:
            reports.append(check_batch(cfg, pipeline, spark, batch, run_id=run_id))
        except QualityFailed as exc:
            reports.append(exc.report)
            failure = failure or exc
        except Exception as exc:
            if batch not in caught_up:
                raise
            # One owed batch that cannot be checked must not keep the task's own batches unchecked.
            log.exception("pipeline %s: owed batch %d could not be checked", pipeline.name, batch)
            unchecked[batch] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
    if unchecked:
        # After the others ran: the task fails (and is retried); the batches stay owed until checked.
        raise QualityError(f"pipeline '{pipeline.name}': owed batches could not be checked: "
                           + "; ".join(f"batch {b}: {e}" for b, e in unchecked.items())
                           + f" (batches {[r.batch for r in reports]} were checked; the next quality task tries "
                           f"them again, or check one by hand: {command_line(f'quality {pipeline.name} --batch N', cfg.source_file)})")
    if len(reports) == 1:
        out = reports[0].as_dict()
    else:  # several, or none (`deltadrain quality --owed` with nothing owed)
        out = {"pipeline": pipeline.name, "scope": "batches", "batches": batches,
               "policy": pipeline.quality.on_failure, "success": all(r.success for r in reports),
               "failed": [f"batch {r.batch}: {name}" for r in reports for name in r.failed],
               "rows_checked": sum(r.rows_checked for r in reports),
               "quarantined": sum(r.quarantined for r in reports),
               "data_docs": reports[-1].data_docs if reports else str(docs_dir(pipeline) / "index.html"),
               "results_table": str(results_path(cfg)), "reports": [r.as_dict() for r in reports]}
    if owed:
        out.update(caught_up=caught_up, still_owed=left)
    if failure is not None:
        raise BatchesFailed(out, failure)
    return out


def check_batch(cfg: DeltadrainConfig, pipeline: PipelineConfig, spark, batch: int,
                run_id: str | None = None) -> QualityReport:
    """Validate the rows batch `batch` wrote; apply the pipeline's failure policy.

    Under `quarantine`, rows a reprocess replay rewrote during the check are left in the target
    (take_back_rewritten) and the batch is checked again at once: their new values are judged too.
    """
    run_id = run_id or new_check_id()
    moved = taken_back = 0
    adopted_runs: list[str] = []
    adopted_failed: list[str] = []
    for again in range(RECHECKS + 1):
        report = _check_batch_once(cfg, pipeline, spark, batch, run_id if not again else f"{run_id}.{again}")
        moved, taken_back = moved + report.quarantined, taken_back + report.taken_back
        adopted_runs += report.adopted_runs
        adopted_failed = with_unreported(adopted_failed, report.adopted_failed)
        if not report.taken_back:
            break
        if again < RECHECKS:
            log.warning("pipeline %s batch %d: checking it again for the %d rewritten row(s)", pipeline.name,
                        batch, report.taken_back)
        else:
            log.warning("pipeline %s batch %d: rows were rewritten under each of %d checks; the %d left in the "
                        "target are judged by the next whole-table check", pipeline.name, batch, RECHECKS + 1,
                        report.taken_back)
    # The last round's results, and what all rounds moved or adopted (each round's results row has its own).
    report.quarantined, report.taken_back = moved, taken_back
    report.adopted_runs, report.adopted_failed = adopted_runs, adopted_failed
    report.failed = with_unreported(report.failed, adopted_failed)
    report.success = not report.failed
    return report


def _check_batch_once(cfg: DeltadrainConfig, pipeline: PipelineConfig, spark, batch: int,
                      run_id: str) -> QualityReport:
    from pyspark import StorageLevel

    rows, version, drain_run, committed_at = batch_rows(cfg, pipeline, spark, batch)
    rows = rows.persist(StorageLevel.MEMORY_AND_DISK)  # GX runs one Spark job per metric
    try:
        # A batch that added no rows (all duplicates or dead letters) has no newest event to judge.
        skip = ("fresh_within",) if rows.isEmpty() else ()
        landed = None
        if not skip and any(c.kind == "fresh_within" for c in build_checks(pipeline)):
            landed = committed_at or batch_finished_at(spark, cfg, pipeline, batch)
            if landed is None:
                log.warning("pipeline %s batch %d: when it landed is unknown (no commit file among the recent "
                            "ones, no metrics row): fresh_within is not judged", pipeline.name, batch)
                skip = ("fresh_within",)
        return _check(cfg, pipeline, spark, rows, "batch", batch, version, drain_run, run_id, skip, fresh_at=landed)
    finally:
        rows.unpersist()


def check_table(cfg: DeltadrainConfig, pipeline: PipelineConfig, spark, run_id: str | None = None) -> QualityReport:
    """Validate the whole target table (the daily DAG). Never quarantines: `quarantine` acts as `warn`."""
    from deltadrain.lake.delta import table_version

    target = str(cfg.target_path(pipeline))
    if not is_table(spark, target):
        raise QualityError(f"pipeline '{pipeline.name}': no target table at {target}; nothing to check")
    version = table_version(target)
    rows = spark.read.format("delta").option("versionAsOf", version).load(target)
    return _check(cfg, pipeline, spark, rows, "table", None, version, None, run_id)


def freshness_reference(fresh_at: datetime | None) -> datetime:
    """The "now" `fresh_within` is judged at, as a naive local time like the timestamps PySpark
    collects (see gx_expectation): when a batch landed (aware, or naive local as collected), so that
    a batch checked late (owed, a retry, after a reprocess) is judged as it was when it landed, not
    failed for the time its check waited; else now (the whole table)."""
    return fresh_at.astimezone().replace(tzinfo=None) if fresh_at is not None else datetime.now()


def _check(cfg, pipeline: PipelineConfig, spark, rows, scope: str, batch: int | None, version: int | None,
           drain_run: str | None, run_id: str | None, skip: tuple[str, ...] = (),
           fresh_at: datetime | None = None) -> QualityReport:
    checks = [c for c in build_checks(pipeline) if c.kind not in skip]
    run_id = run_id or new_check_id()
    table = table_id(str(cfg.target_path(pipeline)))  # the table `rows` were read from, before GX runs
    now = freshness_reference(fresh_at)
    run_name = f"{scope}-{batch}-{run_id}" if batch is not None else f"{scope}-{run_id}"
    gx_result, index = run_gx(rows, pipeline, checks, run_name, now)
    results = summarize(checks, gx_result)
    failed = [r["expectation"] for r in results if not r["success"]]
    counted = [r["element_count"] for r in results if r.get("element_count") is not None]
    report = QualityReport(
        pipeline=pipeline.name, scope=scope, batch=batch, suite=suite_name(pipeline),
        policy=pipeline.quality.on_failure, success=not failed,
        rows_checked=counted[0] if counted else rows.count(), results=results, failed=failed,
        table_version=version, run_id=run_id, batch_run_id=drain_run, checked_at=datetime.now(UTC),
        data_docs=str(index), results_table=str(results_path(cfg)), table_id=table)
    policy = pipeline.quality.on_failure
    if policy == "quarantine" and scope == "batch":
        assert batch is not None  # a batch's check
        # First the stale copies a crashed check left of rows rewritten since: this round's MERGE
        # would match such a copy, insert nothing, and its DELETE then remove the rewritten row.
        take_back_rewritten(spark, cfg, pipeline, batch, table)
        # Before this round moves anything: its own rows would otherwise look like an earlier check's.
        earlier = unreported(spark, cfg, pipeline, batch, table)
        offending = offending_rows(rows, checks, results) if failed else None
        if offending is not None:
            moved = quarantine(spark, cfg, pipeline, batch, offending, run_id, table)
            report.taken_back = take_back_rewritten(spark, cfg, pipeline, batch, table)
            report.quarantined = max(0, moved - report.taken_back)
        if earlier.runs:
            log.warning("pipeline %s batch %d: check(s) %s moved rows to the quarantine and died before writing "
                        "their result; this check reports them (%d row(s) no longer in the target%s)", pipeline.name,
                        batch, ", ".join(earlier.runs), earlier.rows,
                        f": {'; '.join(earlier.reasons)}" if earlier.reasons else "")
            report.adopted_runs, report.adopted_failed = earlier.runs, earlier.reasons
            report.quarantined += earlier.rows
            report.failed = failed = with_unreported(failed, earlier.reasons)
            report.success = not failed
    write_result(spark, cfg, report)
    where = f"batch {batch}" if scope == "batch" else "table"
    if not failed:
        log.info("pipeline %s %s: data quality passed (%d rows); Data Docs %s", pipeline.name, where,
                 report.rows_checked, index)
        return report
    if policy == "fail":
        raise QualityFailed(report)
    log.warning("pipeline %s %s: data quality failed: %s; %d row(s) quarantined; Data Docs %s", pipeline.name,
                where, "; ".join(failed), report.quarantined, index)
    return report
