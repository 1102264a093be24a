"""What the Kafka micro-benchmarks share: the sample `clicks` topic on a broker of their own, and
how they report times. Imported by bench scripts, which put bench/common/ on sys.path."""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from contextlib import contextmanager

from deltadrain.config import DeltadrainConfig, PipelineConfig, load_config
from deltadrain.dev import services
from deltadrain.dev.produce import ensure_topic, produce
from deltadrain.sources.kafka.client import kafka_client_conf


@contextmanager
def clicks_topic(count: int, seed: int = 1) -> Iterator[tuple[DeltadrainConfig, PipelineConfig]]:
    """(cfg, the `clicks` pipeline) with its topic (4 partitions) holding `count` messages, on a broker
    started for the block (DELTADRAIN_HOME and the Kafka ports say where) and stopped after it."""
    cfg = load_config()
    p = cfg.pipeline("clicks")
    with services.running(cfg, ["kafka"]):
        ensure_topic(kafka_client_conf(cfg, p), p.source.topic, 4)
        produce(cfg, p, count, seed=seed, progress=False)
        yield cfg, p


def ms_stats(times: list[float]) -> dict:
    """Median, p95 and max of `times` (seconds), in milliseconds."""
    ms = sorted(t * 1000 for t in times)
    return {"median_ms": round(statistics.median(ms), 2), "p95_ms": round(ms[int(len(ms) * 0.95)], 2),
            "max_ms": round(ms[-1], 2)}
