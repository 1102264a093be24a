"""Kafka history for backfills and reprocess replays: offsets of a time interval, or of picked
records, read with the drain's own reader (deltadrain.sources.kafka.drain.read_ranges) and never
committed to the consumer group."""

from __future__ import annotations

from datetime import datetime

from deltadrain.config import DeltadrainConfig, PipelineConfig
from deltadrain.sources.kafka.client import kafka_consumer_conf, kafka_source
from deltadrain.sources.kafka.drain import TASK_OFFSETS
from deltadrain.sources.kafka.offsets import TIMEOUT, watermarks

# Picked records of a partition this many offsets apart or more are read as separate ranges: reading
# the offsets between them would cost more than another read.
PICK_SPAN = TASK_OFFSETS


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
    from deltadrain.sources.kafka.drain import read_ranges

    conf = kafka_consumer_conf(cfg, pipeline)
    topic = kafka_source(pipeline).topic
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
    """Rows of the picked (partition, offset) records that retention still holds: one Spark read per
    round of `pick_rounds`, so picks far apart do not read every offset between them."""
    from functools import reduce

    from pyspark.sql import functions as F

    from deltadrain.sources.kafka.drain import read_ranges

    marks = watermarks(kafka_consumer_conf(cfg, pipeline), kafka_source(pipeline).topic)
    rounds = pick_rounds(picks, marks, span=PICK_SPAN)
    if not rounds:
        return spark.createDataFrame([], _schema(pipeline))
    rows = reduce(lambda a, b: a.unionByName(b),
                  (read_ranges(spark, cfg, pipeline, ranges, {}, f"{staged}/{i}").rows(spark)
                   for i, ranges in enumerate(rounds)))
    wanted = spark.createDataFrame([(str(p), str(o)) for p, o in picks], "_dd_partition string, _dd_position string")
    return rows.join(F.broadcast(wanted), ["_dd_partition", "_dd_position"], "left_semi")


def pick_rounds(picks: list[tuple[str, int]], marks: dict[int, tuple[int, int]],
                span: int) -> list[dict[int, tuple[int, int]]]:
    """The ranges [start, end) that hold the picked (partition, offset) records retention still holds,
    as rounds of at most one range per partition (a Kafka read takes one range per partition).
    Picks of a partition less than `span` offsets apart share a range; one farther on starts the
    partition's next range, read in the next round."""
    runs: dict[int, list[tuple[int, int]]] = {}
    for part, offset in sorted({(int(p), int(o)) for p, o in picks}):
        if part not in marks or not marks[part][0] <= offset < marks[part][1]:
            continue
        have = runs.setdefault(part, [])
        if have and offset - have[-1][1] < span:
            have[-1] = (have[-1][0], offset + 1)
        else:
            have.append((offset, offset + 1))
    depth = max((len(r) for r in runs.values()), default=0)
    return [{p: r[i] for p, r in sorted(runs.items()) if i < len(r)} for i in range(depth)]


def _schema(pipeline: PipelineConfig):
    from deltadrain.run.rows import claim_schema

    return claim_schema(pipeline)
