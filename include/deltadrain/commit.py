"""Commit: MERGE the batch into the target on the message id, with the checkpoint in the same commit.

The MERGE is insert-only and carries the SetTransaction (appId = pipeline, version = batch) and
the positions as commit metadata. Its condition adds a window on the source time so that the
rows a MERGE must read do not grow with the table: a redelivered message keeps its position and
so its source time, and a business id repeated later is caught within `dedup_window`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime

from deltadrain import failpoints
from deltadrain.checkpoint import find_commit
from deltadrain.lake import is_conflict, snapshot_txn, table_version
from deltadrain.outcome import Outcome, decide

TXN_APP = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"
USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"
CONFLICT_RETRIES = 4


@dataclass
class CommitResult:
    outcome: Outcome
    observed_batch: int | None
    table_version: int | None
    inserted: int
    conflict: str | None = None


def merge_condition(id_field: str, window_start: datetime | None, id_range: tuple[str, str] | None = None):
    """The MERGE's match: same id, within the dedup window. `id_range` (the batch's lowest and highest
    id) changes nothing about which rows match, but as literals Delta can skip every file whose id
    statistics lie outside it: with ids that grow over time (sequence numbers, ULIDs, UUIDv7) the
    MERGE then reads little more than the files of the last batches."""
    from pyspark.sql import functions as F

    target_id = F.col(f"t.`{id_field}`")
    cond = target_id == F.col(f"s.`{id_field}`")
    if window_start is not None:
        cond = cond & (F.col("t._dd_source_ts") >= F.lit(window_start))
    if id_range is not None:
        cond = cond & (target_id >= F.lit(id_range[0])) & (target_id <= F.lit(id_range[1]))
    return cond


def _landed(spark, path: str, pipeline: str, batch: int, run_id: str) -> bool:
    commit = find_commit(spark, path, pipeline, batch)
    return commit is not None and (commit["meta"] or {}).get("run_id") == run_id


def commit_batch(spark, path: str, *, pipeline: str, expected_batch: int, run_id: str, rows, id_field: str,
                 window_start: datetime | None, metadata: str, id_range: tuple[str, str] | None = None) -> CommitResult:
    from delta.tables import DeltaTable

    target = expected_batch + 1
    version_before = table_version(spark, path)
    conflict = None
    lost_reply = False
    spark.conf.set(TXN_APP, pipeline)
    spark.conf.set(TXN_VERSION, str(target))
    spark.conf.set(USER_METADATA, metadata)
    try:
        for attempt in range(CONFLICT_RETRIES + 1):
            try:
                failpoints.hit_later("during_merge")
                (DeltaTable.forPath(spark, path).alias("t")
                 .merge(rows.alias("s"), merge_condition(id_field, window_start, id_range))
                 .whenNotMatchedInsertAll().execute())
                failpoints.fail("after_merge")  # tests: the commit landed but its reply was lost
                break
            except Exception as exc:
                if is_conflict(exc):
                    conflict = type(exc).__name__ + ": " + str(exc).splitlines()[0][:300]
                    # A writer that did not move this pipeline's batch (a backfill, a quarantine,
                    # OPTIMIZE) only made us re-read: try again. A neighbour's batch is final.
                    observed, _ = snapshot_txn(spark, path, pipeline)
                    if (observed or 0) <= expected_batch and attempt < CONFLICT_RETRIES:
                        conflict = None
                        time.sleep(0.5 * (attempt + 1))
                        continue
                elif _landed(spark, path, pipeline, target, run_id):
                    lost_reply = True  # the error came after the commit landed; the table decides below
                else:
                    raise
                break
    finally:
        for key in (TXN_APP, TXN_VERSION, USER_METADATA):
            spark.conf.unset(key)
    # Fast path: our own commit among the newest ones settles it (reading the snapshot's txn set
    # rebuilds Delta state, seconds per run). Otherwise the snapshot's txn version decides.
    commit = find_commit(spark, path, pipeline, target)
    ours = commit is not None and (commit["meta"] or {}).get("run_id") == run_id
    if ours:
        observed, version = target, commit["version"]
    else:
        observed, version = snapshot_txn(spark, path, pipeline)
    # "Already committed": the batch is ours, but this call did not see it land (its reply was lost).
    wrote_now = ours and not lost_reply and (version_before is None or commit["version"] > version_before)
    outcome = decide(expected_batch, observed, ours, wrote_now)
    inserted = int(commit["metrics"].get("numTargetRowsInserted", 0)) if ours else 0
    return CommitResult(outcome, observed, version, inserted, conflict)
