"""Lifecycle counts of a pipeline (docs/contract.md, "Lifecycle"): PENDING, CLAIMED, PUBLISHED, DEAD, plus the checkpoint."""

from __future__ import annotations

from deltadrain.checkpoint import carries_batch, read_checkpoint
from deltadrain.config import DeltadrainConfig, PipelineConfig
from deltadrain.deadletter import DEAD, REPLAYED
from deltadrain.lake import inserted_rows, is_table, recent_commits
from deltadrain.metrics import last_runs
from deltadrain.sources import LakeSide, source_of


def mark_stale(counts: dict, after_ms: int) -> dict:
    """Flag each claimant idle longer than `after_ms` and count what they hold as STALE_CLAIMED."""
    claims = (counts.get("claimed_by") or {}).values()
    for claim in claims:
        claim["stale"] = claim["idle_ms"] > after_ms
    counts["STALE_CLAIMED"] = sum(c["claimed"] for c in claims if c["stale"])
    counts["stale_after_ms"] = after_ms
    return counts


def _per_partition(spark, path: str, column: str, where=None) -> dict[str, int]:
    df = spark.read.format("delta").load(path)
    if where is not None:
        df = df.where(where)
    return {r[column]: r["count"] for r in df.groupBy(column).count().collect()}


def pipeline_status(cfg: DeltadrainConfig, pipeline: PipelineConfig, spark) -> dict:
    from pyspark.sql import functions as F

    target, dlq = str(cfg.target_path(pipeline)), str(cfg.dlq_path(pipeline))
    source = source_of(pipeline)
    out: dict = {"pipeline": pipeline.name, "source": pipeline.source.kind}
    checkpoint = read_checkpoint(spark, target, pipeline.name, dlq, str(cfg.quarantine_path(pipeline)))
    lake = LakeSide(lambda: checkpoint,
                    published=lambda: _per_partition(spark, target, "_dd_partition") if is_table(spark, target) else {},
                    dead=lambda: (_per_partition(spark, dlq, "partition", (F.col("pipeline") == F.lit(pipeline.name))
                                                 & (F.col("state") == F.lit(DEAD))) if is_table(spark, dlq) else {}))
    out.update(source.counts(cfg, pipeline, lake))
    out["PUBLISHED"] = spark.read.format("delta").load(target).count() if is_table(spark, target) else 0
    dead = replayed = 0
    if is_table(spark, dlq):
        counts = {r.state: r["count"] for r in spark.read.format("delta").load(dlq).groupBy("state").count().collect()}
        dead, replayed = counts.get(DEAD, 0), counts.get(REPLAYED, 0)
    out["DEAD"], out["REPLAYED"] = dead, replayed
    out["checkpoint"] = checkpoint.as_dict()
    mark_stale(out, source.stale_after_ms(pipeline))
    out["last_batch"] = None
    if is_table(spark, target):
        for commit in recent_commits(target, 20):
            meta = commit["meta"]
            if carries_batch(meta, pipeline.name):
                out["last_batch"] = {"batch": meta.get("batch"), "run_id": meta.get("run_id"),
                                     "table_version": commit["version"], "at": commit["timestamp"],
                                     "written": inserted_rows(commit["metrics"]),
                                     "claimed": meta.get("claimed"), "dead_lettered": meta.get("dead_lettered"),
                                     "filtered": meta.get("filtered")}
                break
    out["last_runs"] = last_runs(spark, cfg, pipeline, 5)
    return out
