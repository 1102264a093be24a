"""Is there work at a Kafka source? End offsets past the group's committed offsets, a start not yet
made, and gaps (no Spark here)."""

from __future__ import annotations

from deltadrain.config import DeltadrainConfig, PipelineConfig
from deltadrain.sources import Probe


def probe_kafka(cfg: DeltadrainConfig, pipeline: PipelineConfig) -> Probe:
    """End offsets beyond the group's committed offsets, which trail the lake checkpoint (no Spark here)."""
    from deltadrain.sources.kafka.client import kafka_consumer_conf, kafka_source
    from deltadrain.sources.kafka.offsets import OffsetError, group_offsets, start_offsets, watermarks

    source = kafka_source(pipeline)
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
