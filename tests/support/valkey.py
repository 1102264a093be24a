"""The Valkey side of a test: a pipeline of its own, the operator's admin client, the group's pending
and unread counts, draining to the end with the reaper, and the exactly-once check."""

from __future__ import annotations

import uuid
from pathlib import Path

from deltadrain.catchup import drain
from deltadrain.config import load_config
from tests.support.lake import assert_dead_letters, dlq_rows, target_ids
from tests.support.pipelines import example_config, write_config


def make_pipeline(tmp_path: Path, **overrides):
    """A config file with one Valkey pipeline of its own (own streams, tables, group); returns (path, cfg, p).
    `executor`: the config's spark.executor (the DAGs' way to run their jobs), else its default."""
    data = example_config()
    if executor := overrides.pop("executor", None):
        data["spark"] = {**data.get("spark", {}), "executor": executor}
    name = f"t_{uuid.uuid4().hex[:8]}"
    pipe = next(p for p in data["pipelines"] if p["source"]["kind"] == "valkey")
    pipe["name"] = name
    pipe["source"]["streams"] = [f"{name}:{{{i}}}" for i in range(overrides.pop("partitions", 4))]
    pipe["source"].update(overrides.pop("source", {}))
    pipe["target"]["path"] = name
    pipe.pop("quality", None)
    pipe.update(overrides)
    return write_config(tmp_path, data, pipe)


def valkey_admin():
    """The embedded Valkey's admin client: what an operator does (trim, delete, change the ACL) and
    the drains' ACL user may not."""
    from deltadrain.dev.services import valkey_admin as admin

    return admin(load_config())


def pending(client, pipeline) -> int:
    """Entries delivered to the group and not acknowledged (its pending-entries lists)."""
    total = 0
    for stream in pipeline.source.streams:
        try:
            total += client.xpending(stream, pipeline.source.group)["pending"]
        except Exception as exc:
            if "NOGROUP" not in str(exc):
                raise
    return total


def lag(client, pipeline) -> int:
    """Entries not delivered to the group yet (every entry of a stream it has no group on)."""
    total = 0
    for stream in pipeline.source.streams:
        groups = [g for g in client.xinfo_groups(stream) if g["name"] in (pipeline.source.group,
                                                                           pipeline.source.group.encode())]
        total += int(groups[0]["lag"]) if groups else client.xlen(stream)
    return total


def drain_until_done(cfg, pipeline, spark, client, max_runs: int = 12) -> list:
    """Drain and reap until nothing is pending or unread; returns the run summaries."""
    from deltadrain.sources.valkey.reap import reap

    summaries = []
    for _ in range(max_runs):
        summaries.append(drain(cfg, pipeline, spark=spark))
        reap(cfg, pipeline, client)
        if pending(client, pipeline) == 0 and lag(client, pipeline) == 0:
            return summaries
    raise AssertionError(f"not drained after {max_runs} runs: {[s.line() for s in summaries]}")


def assert_exactly_once(spark, cfg, pipeline, client, valid_ids, bad) -> None:
    """Every valid id once in the target, the bad messages (a count, or their places) once in the
    DLQ, nothing pending."""
    ids = target_ids(spark, cfg, pipeline)
    assert len(ids) == len(set(ids)), "a message id appears twice in the target"
    assert set(ids) == set(valid_ids), (f"missing {sorted(set(valid_ids) - set(ids))[:5]}, "
                                        f"unexpected {sorted(set(ids) - set(valid_ids))[:5]}")
    assert_dead_letters(dlq_rows(spark, cfg, pipeline), ids, bad)
    assert pending(client, pipeline) == 0
