"""Commit: MERGE the batch into the target on the message id, with the checkpoint in the same commit.

The MERGE is insert-only and carries the SetTransaction (appId = pipeline, version = batch) and
the positions as commit metadata. Its condition adds a window on the source time so that the
rows a MERGE must read do not grow with the table: a redelivered message keeps its position and
so its source time, and a business id repeated later is caught within `dedup_window`.

A batch that finds no table creates it (`NewTable`): its rows are appended as the table's first
commit, version 0, with the same txn and metadata. That is the MERGE's effect on an empty table,
without a commit that only creates the table first. Only one writer can commit
version 0, so a creator that loses the race (another drain, a backfill) gets a conflict and
MERGEs into the winner's table instead: nothing can be appended on top of rows it did not see.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from deltadrain import failpoints
from deltadrain.lake.checkpoint import find_commit
from deltadrain.lake.delta import (
    changed_rows,
    conflict_line,
    exists,
    inserted_rows,
    is_conflict,
    merge_into,
    snapshot_txn,
    sql_literal,
    sql_name,
    table_version,
)
from deltadrain.run.outcome import Outcome, decide

TXN_APP = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"
USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"
CONFLICT_RETRIES = 4
# Besides the message id, the target column whose values never repeat in a batch's files.
UNIQUE_COLUMNS = ("_dd_position",)


def no_dictionary(column: str) -> str:
    """Session conf that makes Parquet write `column` without first trying a dictionary. For values
    that never repeat the writer always drops that dictionary and writes them plain, so the attempt is
    only CPU: about 0.1 s of a 200 000-row MERGE, with the same encodings and file sizes
    (bench/parquet_dictionary/README.md). Spark copies session conf into each write's Hadoop
    conf, where parquet-java reads per-column switches."""
    return f"parquet.enable.dictionary#{column}"


@dataclass
class CommitResult:
    outcome: Outcome
    observed_batch: int | None
    table_version: int | None
    inserted: int  # rows the commit inserted (an upsert target's: inserted, updated or deleted)
    conflict: str | None = None


@dataclass(frozen=True)
class NewTable:
    """The layout a batch that finds no target table creates it with."""
    partition_by: tuple[str, ...] = ()


# Delta's answer to an append in "error if exists" mode that found a table: someone created it first.
PATH_EXISTS = "DELTA_PATH_EXISTS"


# The window's start moves back to a multiple of this fraction of the window (`dedup_window_start`).
WINDOW_STEPS = 8


def dedup_window_start(oldest: datetime, dedup_window: timedelta) -> datetime:
    """Where the MERGE's window on the target's source time starts for a batch whose oldest message is
    `oldest`: `dedup_window` before it, moved back to a multiple of an eighth of the window since the
    epoch. Spark compiles a timestamp literal into the code it generates for the target's filter and for
    Delta's file skipping, so a start that moved with every batch made the server compile and JIT-warm
    those classes again for each one; this one changes a few times per window. Starting earlier only
    reads and matches more: an id is still caught within `dedup_window`, and within up to an eighth more."""
    start = oldest - dedup_window
    step = dedup_window // timedelta(microseconds=1) // WINDOW_STEPS
    if step <= 0:
        return start
    epoch = datetime(1970, 1, 1, tzinfo=start.tzinfo)
    micros = (start - epoch) // timedelta(microseconds=1)
    return epoch + timedelta(microseconds=micros - micros % step)


def merge_condition(id_field: str, window_start: datetime | None, id_range: tuple[str, str] | None = None,
                    target: str = "t") -> str:
    """The MERGE's match, as SQL between `target` and the source `s`: same id, within the dedup window.
    `id_range` (the batch's lowest and highest id) changes nothing about which rows match, but as
    literals Delta can skip every file whose id statistics lie outside it: with ids that grow over time
    (sequence numbers, ULIDs, UUIDv7) the MERGE then reads little more than the files of the last batches."""
    column = sql_name(id_field)
    target_id = f"{target}.{column}"
    cond = f"{target_id} = s.{column}"
    if window_start is not None:
        cond += f" AND {target}._dd_source_ts >= {sql_literal(window_start)}"
    if id_range is not None:
        cond += f" AND {target_id} >= {sql_literal(id_range[0])} AND {target_id} <= {sql_literal(id_range[1])}"
    return cond


def _landed(path: str, pipeline: str, batch: int, run_id: str) -> bool:
    commit = find_commit(path, pipeline, batch)
    return commit is not None and (commit["meta"] or {}).get("run_id") == run_id


def commit_batch(spark, path: str, *, pipeline: str, expected_batch: int, run_id: str, rows, id_field: str,
                 window_start: datetime | None, metadata: str, id_range: tuple[str, str] | None = None,
                 create: NewTable | None = None, evolve: bool = False,
                 upsert: tuple[str, str] | None = None, first_rows=None) -> CommitResult:
    """Commit batch `expected_batch + 1`: MERGE `rows`, or create the table with them (with `first_rows`,
    when given: what the MERGE would leave in an empty table) when `create` is given and there is none.
    Conflicts with writers that did not move the batch are retried. `evolve`: the MERGE adds the columns
    of `rows` the table lacks and widens the ones it may (schema.evolution add_columns), in this same
    commit. `upsert`: the MERGE's (condition, clauses) of an upsert target (deltadrain.run.apply_upsert)
    instead of the insert-only MERGE on the message id."""
    target = expected_batch + 1
    version_before = table_version(path)
    conflict = None
    lost_reply = False
    # Session conf, as MERGE takes them: a write by another thread of this session while the commit
    # runs would carry them too (tests that race a writer give it a session of its own). Nothing else
    # in a drain process writes while it commits.
    txn_conf = {TXN_APP: pipeline, TXN_VERSION: str(target), USER_METADATA: metadata}
    plain = {no_dictionary(c): "false" for c in (id_field, *UNIQUE_COLUMNS)}
    previous = {key: spark.conf.get(key, None) for key in plain}  # a switch the user's session set stays
    for key, value in {**txn_conf, **plain}.items():
        spark.conf.set(key, value)
    creating = False
    try:
        for attempt in range(CONFLICT_RETRIES + 1):
            try:
                failpoints.hit_later("during_merge")
                creating = create is not None and not exists(path)
                if creating and create is not None:
                    # "error" (if it exists): a table created since the check fails this write (DELTA_PATH_EXISTS),
                    # one created during it fails its commit (a conflict); both end in the MERGE below.
                    first = rows if first_rows is None else first_rows
                    (first.write.format("delta").mode("error").partitionBy(*create.partition_by)
                     .option("txnAppId", pipeline).option("txnVersion", target).option("userMetadata", metadata)
                     .save(path))
                elif upsert is not None:
                    merge_into(spark, path, rows, upsert[0], upsert[1])
                else:
                    merge_into(spark, path, rows, merge_condition(id_field, window_start, id_range),
                               "WHEN NOT MATCHED THEN INSERT *", evolve=evolve)
                failpoints.fail("after_merge")  # tests: the commit landed but its reply was lost
                break
            except Exception as exc:
                # Delta raises a conflict before it writes; any other error may come after our commit
                # landed (a lost reply), and only then may a table found after a creation be ours.
                landed = not is_conflict(exc) and _landed(path, pipeline, target, run_id)
                lost_creation = creating and not landed and (PATH_EXISTS in str(exc) or exists(path))
                if is_conflict(exc) or lost_creation:
                    conflict = conflict_line(exc)
                    # A writer that did not move this pipeline's batch (a backfill, a quarantine,
                    # OPTIMIZE) only made us re-read: try again. A neighbour's batch is final.
                    observed, _ = snapshot_txn(path, pipeline)
                    if (observed or 0) <= expected_batch and attempt < CONFLICT_RETRIES:
                        conflict = None
                        time.sleep(0.5 * (attempt + 1))
                        continue
                elif landed:
                    lost_reply = True  # the error came after the commit landed; the table decides below
                else:
                    raise
                break
    finally:
        for key in txn_conf:  # never left for a later write to carry
            spark.conf.unset(key)
        for key, value in previous.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)
    # Fast path: our own commit among the newest ones settles it (reading the snapshot's txn set
    # rebuilds Delta state, seconds per run). Otherwise the snapshot's txn version decides.
    commit = find_commit(path, pipeline, target)
    mine = commit if commit is not None and (commit["meta"] or {}).get("run_id") == run_id else None
    ours = mine is not None
    if mine is not None:
        observed, version = target, mine["version"]
    else:
        observed, version = snapshot_txn(path, pipeline)
    # "Already committed": the batch is ours, but this call did not see it land (its reply was lost).
    wrote_now = mine is not None and not lost_reply and (version_before is None or mine["version"] > version_before)
    outcome = decide(expected_batch, observed, ours, wrote_now, conflicted=conflict is not None and not ours)
    count = changed_rows if upsert is not None else inserted_rows
    inserted = count(mine["metrics"]) if mine is not None else 0
    return CommitResult(outcome, observed, version, inserted, conflict)
