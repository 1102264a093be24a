"""Reap: take over entries stuck with consumers that are gone, and remove consumers with nothing left.

Taken-over entries are moved to the reaper's consumer with their idle time kept at min_idle_ms
(XCLAIM ... IDLE ... JUSTID, which does not count a delivery), so the next drain's XAUTOCLAIM takes
them at once. Only what the consumer still holds and the stream still has moves (`claim_held`). A
drain that wakes up after its entries were taken over still cannot duplicate or lose anything: its
commit is compare-and-set on the batch sequence, and the MERGE is on the id.
"""

from __future__ import annotations

from typing import Any

from deltadrain.config import DeltadrainConfig, PipelineConfig
from deltadrain.sources.valkey.acknowledge import claim_held
from deltadrain.sources.valkey.client import as_text, valkey_client, valkey_source
from deltadrain.sources.valkey.crashes import RELEASED, REST

REAPER = "deltadrain-reaper"
PAGE = 1_000


def reap(cfg: DeltadrainConfig, pipeline: PipelineConfig, client=None) -> dict:
    source = valkey_source(pipeline)
    client = client or valkey_client(cfg, pipeline)
    idle = pipeline.min_idle_ms
    report: dict[str, Any] = {"pipeline": pipeline.name, "taken_over": 0, "consumers_removed": [], "streams": {}}
    for stream in source.streams:
        try:
            consumers = client.xinfo_consumers(stream, source.group)
        except Exception as exc:
            if "NOGROUP" in str(exc) or "no such key" in str(exc).lower():
                continue
            raise
        moved = 0
        for consumer in consumers:
            name = as_text(consumer["name"])
            # REST holds the untried halves of split segments, RELEASED what runs that stopped cleanly
            # handed back (valkey.crashes): handing them to the reaper would make them a dead run's,
            # and they are reclaimable already.
            if name in (REAPER, REST, RELEASED) or int(consumer["pending"]) == 0:
                continue
            start = "-"
            while True:
                rows = client.xpending_range(stream, source.group, min=start, max="+", count=PAGE,
                                             consumername=name, idle=idle)
                if not rows:
                    break
                ids = [as_text(r["message_id"]) for r in rows]
                # Entries deleted from the stream stay with `name` for the next drain's XAUTOCLAIM to
                # report as gaps (a plain XCLAIM would drop them from the pending list in silence),
                # so page on past them instead of starting over.
                moved += len(claim_held(client, stream, source.group, name, REAPER, idle, max(idle, 1), ids))
                if len(rows) < PAGE:
                    break
                start = f"({ids[-1]}"
        removed = []
        for consumer in client.xinfo_consumers(stream, source.group):
            name = as_text(consumer["name"])
            # Gone: nothing pending and not seen for min_idle_ms (a live drain reads more often).
            if int(consumer["pending"]) == 0 and int(consumer.get("idle", 0)) >= idle:
                client.xgroup_delconsumer(stream, source.group, name)
                removed.append(name)
        report["taken_over"] += moved
        report["consumers_removed"] += [f"{stream}/{n}" for n in removed]
        report["streams"][stream] = {"taken_over": moved, "consumers_removed": len(removed)}
    return report
