"""The checkpoint lives in the target table's own commits (invariant 3).

- batch sequence: the Delta SetTransaction (appId = pipeline, version = batch), kept in Delta
  checkpoints, so it survives log cleanup;
- positions: the whole per-partition map in the commit's userMetadata (fast path), and in the
  `_dd_partition` / `_dd_position` columns of the rows and of the DLQ (the path that survives log
  cleanup removing old commit files).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from deltadrain.lake.delta import is_table, of_table, recent_commits, snapshot_txn, table_id

# Columns every target row carries besides the payload.
META_COLUMNS = (
    ("_dd_partition", "string"),
    ("_dd_position", "string"),
    ("_dd_pos_hi", "long"),
    ("_dd_pos_lo", "long"),
    ("_dd_source_ts", "timestamp"),
    ("_dd_attempts", "int"),
    ("_dd_batch", "long"),
    ("_dd_run_id", "string"),
    ("_dd_ingested_at", "timestamp"),
)


@dataclass
class Checkpoint:
    batch: int  # the last committed batch sequence; 0 before the first commit
    positions: dict[str, str] = field(default_factory=dict)
    table_version: int | None = None
    run_id: str | None = None
    found_in: str = "none"  # "commit", "rows" or "none"
    meta: dict = field(default_factory=dict)  # the whole userMetadata of that commit (source-specific extras)

    def as_dict(self) -> dict:
        return {"batch": self.batch, "positions": self.positions, "table_version": self.table_version,
                "run_id": self.run_id, "found_in": self.found_in}


def commit_metadata(pipeline: str, batch: int, run_id: str, positions: dict[str, str], **counts) -> str:
    return json.dumps({"deltadrain": 1, "pipeline": pipeline, "batch": batch, "run_id": run_id,
                       "positions": positions, **counts}, sort_keys=True)


def find_commit(path: str, pipeline: str, batch: int) -> dict | None:
    """The commit that wrote `batch` of `pipeline`, if its commit file still exists.

    It is almost always among the last few commits; only maintenance commits (OPTIMIZE, VACUUM,
    property changes) push it further back, so the search widens only when needed.
    """
    for limit in (5, 200):
        for commit in recent_commits(path, limit):
            meta = commit["meta"] or {}
            if meta.get("pipeline") == pipeline and meta.get("batch") == batch:
                return commit
    return None


def positions_from_rows(spark, path: str, dlq_path: str | None, batch: int,
                        quarantine_path: str | None = None) -> dict[str, str]:
    """Per partition, the highest position (compared as integers) any row of a committed batch (up
    to `batch`) holds, in the target, the DLQ or the quarantine (rows a batch check moved out of
    the target: their messages were drained all the same).

    Rows written by backfills and replays carry batch 0: they may lie beyond the live checkpoint
    (a backfill of a recent interval), so they never count here. A dead letter counts only when the
    run that wrote it committed its batch (its batch and run id are on rows of the target): dead
    letters are written before their batch's commit, which a run killed in between never made, and
    the run that then committed that batch number may have read less. Leaving one out can only
    make the next run read again what the DLQ and the MERGE already absorb.
    """
    from pyspark.sql import functions as F

    frames, committers = [], []
    drained = (F.col("_dd_batch") > 0) & (F.col("_dd_batch") <= F.lit(batch))
    for table in (path, quarantine_path):
        if table and is_table(spark, table):
            rows = spark.read.format("delta").load(table).where(drained)
            if table == quarantine_path:
                # Not the rows of an earlier target of this name: its batch numbers come again here.
                # (No table at `path`: no id, and of_table keeps every row.)
                rows = of_table(rows, table_id(path))
            frames.append(rows.select(F.col("_dd_partition").alias("p"), F.col("_dd_position").alias("pos"),
                                      F.col("_dd_pos_hi").alias("hi"), F.col("_dd_pos_lo").alias("lo")))
            committers.append(rows.select(F.col("_dd_batch").alias("b"), F.col("_dd_run_id").alias("r")))
    if dlq_path and committers and is_table(spark, dlq_path):
        runs = committers[0] if len(committers) == 1 else committers[0].unionByName(committers[1])
        dead = spark.read.format("delta").load(dlq_path).where((F.col("batch") > 0) & (F.col("batch") <= F.lit(batch)))
        dead = dead.join(runs.distinct(), (dead.batch == runs.b) & (dead.run_id == runs.r), "left_semi")
        frames.append(dead.select(F.col("partition").alias("p"), F.col("position").alias("pos"),
                                  F.col("pos_hi").alias("hi"), F.col("pos_lo").alias("lo")))
    if not frames:
        return {}
    df = frames[0]
    for more in frames[1:]:
        df = df.unionByName(more)
    rows = df.where("p IS NOT NULL").groupBy("p").agg(F.max_by("pos", F.struct("hi", "lo")).alias("pos")).collect()
    return {r.p: r.pos for r in rows}


def carries_batch(meta, pipeline: str) -> bool:
    """A commit's metadata names a batch of `pipeline`: a drain's commit, not a backfill's, a replay's,
    a quarantine's or OPTIMIZE's."""
    return isinstance(meta, dict) and meta.get("pipeline") == pipeline and isinstance(meta.get("batch"), int)


def committed_batch(path: str, pipeline: str) -> int | None:
    """The pipeline's newest committed batch without its positions: read_checkpoint's fast path (the
    newest commits), else the txn."""
    meta = next((c["meta"] for c in recent_commits(path, 5) if carries_batch(c["meta"], pipeline)), None)
    return meta["batch"] if meta is not None else snapshot_txn(path, pipeline)[0]


def log_checkpoint(path: str, pipeline: str) -> tuple[Checkpoint, bool]:
    """The checkpoint as the table's log keeps it, read with delta-rs (no Spark), and whether its
    positions must still be read from the rows (`positions_from_rows`): the commit that holds them
    is gone (log cleanup). No table yet: batch 0."""
    # Fast path: the newest commits. Only deltadrain writes this pipeline's txn, always with its
    # metadata, so the newest commit that names the pipeline holds the current batch. Reading the
    # snapshot's txn set instead rebuilds Delta state (seconds per run).
    commits = recent_commits(path, 5)
    for commit in commits:
        meta = commit["meta"]
        if carries_batch(meta, pipeline):
            return Checkpoint(meta["batch"], dict(meta.get("positions") or {}), commits[0]["version"],
                              meta.get("run_id"), "commit", meta), False
    batch, version = snapshot_txn(path, pipeline)
    if batch is None:
        return Checkpoint(0, table_version=version), False
    found = find_commit(path, pipeline, batch)
    if found is not None:
        meta = found["meta"]
        return Checkpoint(batch, dict(meta.get("positions") or {}), version, meta.get("run_id"), "commit", meta), False
    return Checkpoint(batch, {}, version, None, "rows"), True


def read_checkpoint(spark, path: str, pipeline: str, dlq_path: str | None = None,
                    quarantine_path: str | None = None) -> Checkpoint:
    if not is_table(spark, path):
        return Checkpoint(0)
    checkpoint, from_rows = log_checkpoint(path, pipeline)
    if from_rows:
        checkpoint.positions = positions_from_rows(spark, path, dlq_path, checkpoint.batch, quarantine_path)
    return checkpoint
