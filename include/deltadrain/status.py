"""Lifecycle counts of a pipeline (seed 004): PENDING, CLAIMED, PUBLISHED, DEAD, plus the checkpoint."""

from __future__ import annotations

from deltadrain.checkpoint import read_checkpoint
from deltadrain.config import DeltadrainConfig, PipelineConfig, ValkeySource
from deltadrain.connections import as_text, group_counts, valkey_client
from deltadrain.deadletter import DEAD, REPLAYED
from deltadrain.lake import is_table, recent_commits
from deltadrain.metrics import last_runs


def valkey_counts(client, source: ValkeySource) -> dict:
    pending = claimed = 0
    consumers: dict[str, dict] = {}
    oldest_idle = 0
    partitions = {}
    for stream in source.streams:
        lag, in_pel = group_counts(client, stream, source.group)
        length = client.xlen(stream)
        pending += lag
        claimed += in_pel
        partitions[stream] = {"length": length, "pending": lag, "claimed": in_pel}
        if in_pel:
            for c in client.xinfo_consumers(stream, source.group):
                entry = consumers.setdefault(as_text(c["name"]), {"claimed": 0, "idle_ms": int(c["idle"])})
                entry["claimed"] += int(c["pending"])
                entry["idle_ms"] = min(entry["idle_ms"], int(c["idle"]))
            first = client.xpending_range(stream, source.group, min="-", max="+", count=1)
            if first:
                oldest_idle = max(oldest_idle, int(first[0]["time_since_delivered"]))
    return {"PENDING": pending, "CLAIMED": claimed, "claimed_by": {k: v for k, v in consumers.items() if v["claimed"]},
            "oldest_claim_idle_ms": oldest_idle, "partitions": partitions}


def pipeline_status(cfg: DeltadrainConfig, pipeline: PipelineConfig, spark) -> dict:
    target, dlq = str(cfg.target_path(pipeline)), str(cfg.dlq_path(pipeline))
    out: dict = {"pipeline": pipeline.name, "source": pipeline.source.kind}
    if isinstance(pipeline.source, ValkeySource):
        out.update(valkey_counts(valkey_client(cfg, pipeline), pipeline.source))
    out["PUBLISHED"] = spark.read.format("delta").load(target).count() if is_table(spark, target) else 0
    dead = replayed = 0
    if is_table(spark, dlq):
        counts = {r.state: r["count"] for r in spark.read.format("delta").load(dlq).groupBy("state").count().collect()}
        dead, replayed = counts.get(DEAD, 0), counts.get(REPLAYED, 0)
    out["DEAD"], out["REPLAYED"] = dead, replayed
    out["checkpoint"] = read_checkpoint(spark, target, pipeline.name, dlq).as_dict()
    out["last_batch"] = None
    if is_table(spark, target):
        for commit in recent_commits(spark, target, 20):
            meta = commit["meta"] or {}
            if meta.get("pipeline") == pipeline.name and isinstance(meta.get("batch"), int):
                out["last_batch"] = {"batch": meta.get("batch"), "run_id": meta.get("run_id"),
                                     "table_version": commit["version"], "at": commit["timestamp"],
                                     "written": int(commit["metrics"].get("numTargetRowsInserted", 0)),
                                     "claimed": meta.get("claimed"), "dead_lettered": meta.get("dead_lettered")}
                break
    out["last_runs"] = last_runs(spark, cfg, pipeline, 5)
    return out
