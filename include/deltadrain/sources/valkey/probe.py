"""Is there work at a Valkey source? Group lag, entries pending past min_idle_ms, idle consumers and
open gaps, read cheaply (no Spark, no claims)."""

from __future__ import annotations

from deltadrain.config import DeltadrainConfig, PipelineConfig
from deltadrain.sources import Probe
from deltadrain.sources.valkey.client import as_text, group_counts, valkey_client, valkey_source
from deltadrain.sources.valkey.gaps import as_ranges, count, gaps_key, open_gaps


def stuck_entries(client, stream: str, group: str, min_idle_ms: int, limit: int = 1_000) -> int:
    """Entries of `group` pending longer than min_idle_ms (up to `limit`; enough to decide)."""
    try:
        return len(client.xpending_range(stream, group, min="-", max="+", count=limit, idle=min_idle_ms))
    except Exception as exc:
        if "NOGROUP" in str(exc):
            return 0
        raise


def idle_consumers(client, stream: str, group: str, min_idle_ms: int) -> int:

    try:
        consumers = client.xinfo_consumers(stream, group)
    except Exception as exc:
        if "NOGROUP" in str(exc) or "no such key" in str(exc).lower():
            return 0
        raise
    return sum(1 for c in consumers if int(c["pending"]) == 0 and int(c.get("idle", 0)) >= min_idle_ms
               and as_text(c["name"]) != "deltadrain-reaper")


def probe_valkey(cfg: DeltadrainConfig, pipeline: PipelineConfig, client=None) -> Probe:
    source = valkey_source(pipeline)
    client = client or valkey_client(cfg, pipeline)
    out = Probe(pipeline.name)
    try:
        out.gaps = count(as_ranges(open_gaps(client, source.streams, source.group, gaps_key(pipeline.name))))
        for stream in source.streams:
            lag, in_pel = group_counts(client, stream, source.group)
            stuck = stuck_entries(client, stream, source.group, pipeline.min_idle_ms) if in_pel else 0
            out.new += lag
            out.reclaimable += stuck
            out.idle_consumers += idle_consumers(client, stream, source.group, pipeline.min_idle_ms)
            out.partitions[stream] = {"new": lag, "claimed": in_pel, "reclaimable": stuck}
    finally:
        client.close()
    return out
