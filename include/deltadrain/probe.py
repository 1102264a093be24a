"""Probe: is there work at a source? Cheap reads only (no Spark, no claims), for sensors and triggers.

- new: messages appended and not yet taken (Valkey group lag; Kafka end offsets beyond the group's
  committed offsets, which never lead the lake checkpoint, so this errs towards running a drain);
- reclaimable: Valkey entries pending longer than min_idle_ms (a dead drain's claims);
- gaps: entries the source deleted before any commit held them (Kafka retention; Valkey trimming,
  XDEL). A run must meet them even when nothing readable follows: under on_gap: fail it stops there,
  a failure the Airflow UI shows; under continue it commits past them, once.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from deltadrain.config import DeltadrainConfig, PipelineConfig, ValkeySource
from deltadrain.connections import group_counts, valkey_client
from deltadrain.gaps import as_ranges, count, gaps_key, open_gaps


@dataclass
class Probe:
    pipeline: str
    new: int = 0
    reclaimable: int = 0
    idle_consumers: int = 0  # consumers with nothing pending, unseen for min_idle_ms: the reaper removes them
    partitions: dict = field(default_factory=dict)
    # A Kafka pipeline under `starting_offsets: latest` that no run has started yet: its first run
    # reads nothing but commits where the pipeline starts, so it must run before anything is "new".
    unstarted: bool = False
    gaps: int = 0

    @property
    def has_work(self) -> bool:
        return self.new > 0 or self.reclaimable > 0 or self.unstarted or self.gaps > 0

    def as_dict(self) -> dict:
        return {**asdict(self), "has_work": self.has_work}


def stuck_entries(client, stream: str, group: str, min_idle_ms: int, limit: int = 1_000) -> int:
    """Entries of `group` pending longer than min_idle_ms (up to `limit`; enough to decide)."""
    try:
        return len(client.xpending_range(stream, group, min="-", max="+", count=limit, idle=min_idle_ms))
    except Exception as exc:
        if "NOGROUP" in str(exc):
            return 0
        raise


def idle_consumers(client, stream: str, group: str, min_idle_ms: int) -> int:
    from deltadrain.connections import as_text

    try:
        consumers = client.xinfo_consumers(stream, group)
    except Exception as exc:
        if "NOGROUP" in str(exc) or "no such key" in str(exc).lower():
            return 0
        raise
    return sum(1 for c in consumers if int(c["pending"]) == 0 and int(c.get("idle", 0)) >= min_idle_ms
               and as_text(c["name"]) != "deltadrain-reaper")


def probe_valkey(cfg: DeltadrainConfig, pipeline: PipelineConfig, client=None) -> Probe:
    source: ValkeySource = pipeline.source
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


def probe_kafka(cfg: DeltadrainConfig, pipeline: PipelineConfig) -> Probe:
    """End offsets beyond the group's committed offsets, which trail the lake checkpoint (no Spark here)."""
    from deltadrain.connections import kafka_consumer_conf
    from deltadrain.kafka_offsets import OffsetError, group_offsets, start_offsets, watermarks

    source = pipeline.source
    conf = kafka_consumer_conf(cfg, pipeline)
    out = Probe(pipeline.name)
    try:
        marks = watermarks(conf, source.topic)
    except OffsetError:  # no topic yet: nothing to drain
        return out
    committed = group_offsets(conf, source.group, source.topic, sorted(marks))
    known = {str(p): str(o) for p, o in committed.items() if o is not None}
    # No group offsets: never started, or they expired (the broker drops an idle group's after
    # `offsets.retention.minutes`); a drain then only commits them again.
    out.unstarted = not known and source.starting_offsets == "latest"
    starts, gaps = start_offsets(known, marks, source.starting_offsets)
    out.gaps = sum(g.size for g in gaps)
    for part, (_, high) in sorted(marks.items()):
        new = max(0, high - starts[part])
        out.new += new
        out.partitions[f"{source.topic}-{part}"] = {"new": new, "end": high}
    return out


def probe(cfg: DeltadrainConfig, pipeline: PipelineConfig) -> Probe:
    if isinstance(pipeline.source, ValkeySource):
        return probe_valkey(cfg, pipeline)
    return probe_kafka(cfg, pipeline)


def probe_named(config: str | None, pipeline: str) -> dict:
    """probe() of a pipeline named in a config file (what sensors and triggers carry around)."""
    from deltadrain.config import load_config

    cfg = load_config(config)
    return probe(cfg, cfg.pipeline(pipeline)).as_dict()
