"""Lifecycle counts of a pipeline (docs/contract.md, "Lifecycle"): PENDING, CLAIMED, PUBLISHED, DEAD, plus the checkpoint.

The lake is read with delta-rs (`lakeview`), as the view reads it: no Spark JVM, but for the one case
where the checkpoint's positions must be rebuilt from the rows (`checkpoint_for_status`).
"""

from __future__ import annotations

import time

from deltadrain.config import DeltadrainConfig, PipelineConfig
from deltadrain.lake.checkpoint import Checkpoint, carries_batch, log_checkpoint
from deltadrain.lake.deadletter import DEAD, REPLAYED
from deltadrain.lake.delta import inserted_rows, recent_commits
from deltadrain.sources import LakeSide, source_of

SOURCE_WAIT_S = 10  # how long status waits for the source's answers (their own waits run to 30 s)


def mark_stale(counts: dict, after_ms: int) -> dict:
    """Flag each claimant idle longer than `after_ms` and count what they hold as STALE_CLAIMED."""
    claims = (counts.get("claimed_by") or {}).values()
    for claim in claims:
        claim["stale"] = claim["idle_ms"] > after_ms
    counts["STALE_CLAIMED"] = sum(c["claimed"] for c in claims if c["stale"])
    counts["stale_after_ms"] = after_ms
    return counts


SCHEMA_COMMITS = 200  # how far back status looks for the commits that changed the table's schema


def schema_changes(commits: list[dict], pipeline: str) -> list[dict]:
    """The commits (`lake.recent_commits`, newest first) whose batch added or widened columns
    (schema.evolution add_columns), oldest first: which batch changed the table's schema, and how."""
    out = []
    for commit in commits:
        meta = commit["meta"]
        if carries_batch(meta, pipeline) and (meta.get("added_columns") or meta.get("widened_columns")):
            out.append({"batch": meta.get("batch"), "table_version": commit["version"], "at": commit["timestamp"],
                        "added_columns": meta.get("added_columns") or {},
                        "widened_columns": meta.get("widened_columns") or {}})
    return out[::-1]


def checkpoint_for_status(cfg: DeltadrainConfig, pipeline: PipelineConfig) -> Checkpoint:
    """The checkpoint from the target's log (delta-rs). Only when log cleanup removed the commit that
    holds the last batch's positions are they read from the rows, with Spark, as a drain would."""
    target = str(cfg.target_path(pipeline))
    checkpoint, from_rows = log_checkpoint(target, pipeline.name)
    if not from_rows:
        return checkpoint
    from deltadrain.lake.checkpoint import read_checkpoint
    from deltadrain.runtime.session import get_spark

    return read_checkpoint(get_spark(f"deltadrain-status-{pipeline.name}", cfg=cfg), target, pipeline.name,
                           str(cfg.dlq_path(pipeline)), str(cfg.quarantine_path(pipeline)))


def pipeline_status(cfg: DeltadrainConfig, pipeline: PipelineConfig) -> dict:
    from deltadrain.observe import notes as states
    from deltadrain.observe import tables as lakeview

    target = str(cfg.target_path(pipeline))
    source = source_of(pipeline)
    out: dict = {"pipeline": pipeline.name, "source": pipeline.source.kind}
    with lakeview.one_read():
        has_target = lakeview.open_table(target) is not None
        checkpoint = checkpoint_for_status(cfg, pipeline) if has_target else Checkpoint(0)
        lake = LakeSide(lambda: checkpoint, published=lambda: lakeview.rows_per_partition(cfg, pipeline),
                        dead=lambda: lakeview.dead_per_partition(cfg, pipeline))
        counts = states.source_counts(cfg, pipeline, lake, until=time.monotonic() + SOURCE_WAIT_S, quick=True)
        notes = counts.pop("notes", None) or []
        out.update(counts)
        out["PUBLISHED"] = lakeview.published_count(cfg, pipeline)
        dlq = lakeview.dlq_counts(cfg, pipeline)
        out["DEAD"], out["REPLAYED"] = dlq.get(DEAD, 0), dlq.get(REPLAYED, 0)
        out["checkpoint"] = checkpoint.as_dict()
        mark_stale(out, source.stale_after_ms(pipeline))
        out["last_batch"] = None
        if has_target:
            for commit in recent_commits(target, 20):
                meta = commit["meta"]
                if carries_batch(meta, pipeline.name):
                    out["last_batch"] = {"batch": meta.get("batch"), "run_id": meta.get("run_id"),
                                         "table_version": commit["version"], "at": commit["timestamp"],
                                         "written": inserted_rows(commit["metrics"]),
                                         "claimed": meta.get("claimed"), "dead_lettered": meta.get("dead_lettered"),
                                         "filtered": meta.get("filtered")}
                    break
        out["last_runs"] = lakeview.last_batches(cfg, pipeline, 5)
        out["schema_changes"] = schema_changes(recent_commits(target, SCHEMA_COMMITS), pipeline.name) \
            if has_target and pipeline.payload_schema.evolution == "add_columns" else []
    never = states.never_run(pipeline, has_target, cfg.source_file)
    out["notes"] = ([never] if never else []) + notes
    return out
