"""Kafka history for backfills and reprocess replays: offsets of a time interval, or of picked
records, read with the drain's own reader (deltadrain.kafka_drain.read_ranges) and never
committed to the consumer group."""

from __future__ import annotations

from datetime import datetime

from deltadrain.config import DeltadrainConfig, PipelineConfig
from deltadrain.connections import kafka_consumer_conf
from deltadrain.kafka_offsets import TIMEOUT, watermarks


def interval_offsets(conf: dict, topic: str, start: datetime, end: datetime) -> dict[int, tuple[int, int]]:
    """partition -> [first offset with timestamp >= start, first offset with timestamp >= end)."""
    from confluent_kafka import Consumer, TopicPartition

    marks = watermarks(conf, topic)
    consumer = Consumer({**conf, "group.id": "deltadrain-history", "enable.auto.commit": False})
    try:
        def lookup(when: datetime) -> dict[int, int]:
            ms = int(when.timestamp() * 1000)
            found = consumer.offsets_for_times([TopicPartition(topic, p, ms) for p in marks], timeout=TIMEOUT)
            # -1: no record at or after that time yet: the range ends at the end offset.
            return {tp.partition: (tp.offset if tp.offset >= 0 else marks[tp.partition][1]) for tp in found}

        lo, hi = lookup(start), lookup(end)
    finally:
        consumer.close()
    return {p: (lo[p], max(lo[p], hi[p])) for p in marks}


def interval_gaps(marks: dict[int, tuple[int, int]], ranges: dict[int, tuple[int, int]]) -> list[dict]:
    """Retention already deleted offsets before a partition's earliest one: when the interval starts
    right there, part of it may be gone (Kafka keeps no timestamps of deleted records)."""
    gaps = []
    for part, (start, _end) in sorted(ranges.items()):
        low = marks[part][0]
        if low > 0 and start <= low:
            gaps.append({"partition": str(part), "from": None, "to": str(low - 1),
                         "reason": f"offsets before {low} were deleted by retention; the interval may have "
                                   "started among them"})
    return gaps


def kafka_interval_rows(spark, cfg: DeltadrainConfig, pipeline: PipelineConfig, start: datetime, end: datetime,
                        scratch: str):
    """(rows of the records appended in [start, end), gaps) — the backfill's read."""
    from deltadrain.kafka_drain import read_ranges

    conf = kafka_consumer_conf(cfg, pipeline)
    topic = pipeline.source.topic
    found = interval_offsets(conf, topic, start, end)
    # Gaps from every partition's range, empty ones too: when retention took the whole interval both
    # bounds land on the earliest offset left, and that empty range is the only sign of it.
    gaps = interval_gaps(watermarks(conf, topic), found)
    ranges = {p: r for p, r in found.items() if r[1] > r[0]}
    if not ranges:
        return spark.createDataFrame([], _schema(pipeline)), gaps
    staged = read_ranges(spark, cfg, pipeline, ranges, {}, f"{scratch}/history")
    return staged.rows(spark), gaps


def kafka_offset_rows(spark, cfg: DeltadrainConfig, pipeline: PipelineConfig, picks: list[tuple[str, int]],
                      staged: str):
    """Rows of the picked (partition, offset) records that retention still holds."""
    from pyspark.sql import functions as F

    from deltadrain.kafka_drain import read_ranges

    marks = watermarks(kafka_consumer_conf(cfg, pipeline), pipeline.source.topic)
    ranges: dict[int, tuple[int, int]] = {}
    for part, offset in picks:
        p = int(part)
        if p in marks and marks[p][0] <= offset < marks[p][1]:
            lo, hi = ranges.get(p, (offset, offset + 1))
            ranges[p] = (min(lo, offset), max(hi, offset + 1))
    if not ranges:
        return spark.createDataFrame([], _schema(pipeline))
    rows = read_ranges(spark, cfg, pipeline, ranges, {}, staged).rows(spark)
    wanted = spark.createDataFrame([(str(p), str(o)) for p, o in picks], "_dd_partition string, _dd_position string")
    return rows.join(F.broadcast(wanted), ["_dd_partition", "_dd_position"], "left_semi")


def _schema(pipeline: PipelineConfig):
    from deltadrain.drain import claim_schema

    return claim_schema(pipeline)
