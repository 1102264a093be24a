"""Exact Kafka offset ranges read in this process with a confluent-kafka consumer, as Arrow record
batches of the columns Spark's Kafka source gives `kafka.drain.read_ranges` (a small range's read,
without a Spark job, docs/spark-connect.md).

The consumer is assigned the ranges' start offsets: it joins no group and commits nothing (the group
offsets move only after the lake's commit, `KafkaDrain.acknowledge`). A partition is read up to its
end offset, not for a count of messages: aborted transactions, their markers and compaction leave
offsets without a record, so a partition is done at the first record at or past its end, at the
partition's end (EOF), or when the consumer's position has passed the end.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

BATCH_ROWS = 10_000  # records per Arrow batch handed to the decoder
# ... or fewer, once their values and keys hold this many bytes: what the read holds at once is then set
# by these two bounds (and librdkafka's prefetch queue), not by the range's size or a message's.
BATCH_BYTES = 32 * 1024 * 1024
STALL_S = 60  # no record and no partition done for this long: the read fails instead of waiting on


class RangeReadError(Exception):
    """The ranges could not be read as asked (a broker error, offsets deleted, no progress)."""


def source_schema(columns: list[str]):
    """Arrow types of Spark's Kafka source columns as mapInArrow passes them (session time zone UTC)."""
    import pyarrow as pa

    types = {"partition": pa.int32(), "offset": pa.int64(), "timestamp": pa.timestamp("us", tz="UTC"),
             "value": pa.binary(), "key": pa.binary(),
             "headers": pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])),
             "replay_id": pa.binary()}
    return pa.schema([(name, types[name]) for name in columns])


def first_header(headers, name: str):
    return next((v for k, v in headers if k == name), None) if headers else None


def column_values(msgs: list, name: str, replay_header: str | None) -> list:
    """One source column of `msgs` (confluent-kafka messages), as Spark's Kafka source has it: the
    timestamp in microseconds, null headers for a record without any."""
    if name == "partition":
        return [m.partition() for m in msgs]
    if name == "offset":
        return [m.offset() for m in msgs]
    if name == "timestamp":
        return [m.timestamp()[1] * 1000 for m in msgs]
    if name == "value":
        return [m.value() for m in msgs]
    if name == "key":
        return [m.key() for m in msgs]
    if name == "headers":
        return [[{"key": k, "value": v} for k, v in h] if (h := m.headers()) else None for m in msgs]
    if name == "replay_id":
        return [first_header(m.headers(), replay_header) if replay_header else None for m in msgs]
    raise ValueError(f"no Kafka source column '{name}'")


def to_batch(msgs: list, schema, replay_header: str | None = None):
    """`msgs` as one record batch of `schema` (`source_schema`), column by column."""
    import pyarrow as pa

    return pa.RecordBatch.from_arrays([pa.array(column_values(msgs, f.name, replay_header), f.type)
                                       for f in schema], schema=schema)


def place_done(offset: int, end: int) -> bool:
    """Whether a partition is read up to `end` (exclusive) once a record or position at `offset` is seen."""
    return offset >= end - 1


def batch_full(rows: int, nbytes: int, batch_rows: int, batch_bytes: int) -> bool:
    """Whether the records kept so far go to the decoder as one batch: by count, or by their bytes."""
    return rows >= batch_rows or (rows > 0 and nbytes >= batch_bytes)


def consume_ranges(conf: dict, group: str, topic: str, ranges: dict[int, tuple[int, int]], columns: list[str],
                   replay_header: str | None = None, batch_rows: int = BATCH_ROWS,
                   stall_s: float = STALL_S, batch_bytes: int | None = None) -> Iterator:
    """The records of `ranges` (partition -> (start, end exclusive)) as record batches of
    `source_schema(columns)`. `conf`: the pipeline's consumer settings (`kafka_consumer_conf`: its login
    and isolation level); `group` only names the consumer, which never joins or commits it."""
    from confluent_kafka import OFFSET_INVALID, Consumer, KafkaError, TopicPartition

    batch_bytes = BATCH_BYTES if batch_bytes is None else batch_bytes
    ends = {q: end for q, (start, end) in ranges.items() if end > start}
    if not ends:
        return
    schema = source_schema(columns)
    consumer = Consumer({**conf, "group.id": group, "enable.auto.commit": False,
                         "enable.auto.offset.store": False, "enable.partition.eof": True,
                         # A start that retention deleted is an error, as Spark's failOnDataLoss makes it,
                         # never a silent jump to the end.
                         "auto.offset.reset": "error", "log_level": 0})
    nxt = {q: ranges[q][0] for q in ends}  # per partition, the offset after the last record seen
    kept: list = []
    kept_bytes = 0
    last_progress = time.monotonic()

    def finish(q: int) -> None:
        nonlocal last_progress
        del ends[q]
        last_progress = time.monotonic()
        consumer.pause([TopicPartition(topic, q)])

    try:
        consumer.assign([TopicPartition(topic, q, ranges[q][0]) for q in sorted(ends)])
        while ends:
            # Ask for no more than the offsets left: consume() waits out its timeout for a count it
            # does not reach, which only holes (aborted records, markers, compaction) leave it short of.
            msgs = consumer.consume(max(1, min(batch_rows, sum(end - nxt[q] for q, end in ends.items()))), 0.2)
            for msg in msgs:
                err = msg.error()
                q, offset = msg.partition(), msg.offset()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        if q is not None and offset is not None and q in ends and offset >= ends[q]:
                            finish(q)
                        continue
                    if err.retriable() or err.code() in (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN):
                        continue  # librdkafka reconnects; STALL_S bounds the wait
                    raise RangeReadError(f"topic '{topic}' partition {q}: {err.name()}: {err.str()}")
                end = ends.get(q) if q is not None else None
                if q is None or offset is None or end is None:
                    continue  # past its end, fetched before the pause (a record always has both)
                nxt[q] = offset + 1  # a partition's records come in offset order
                if offset < end:
                    kept.append(msg)
                    kept_bytes += len(msg.value() or b"") + len(msg.key() or b"")
                    last_progress = time.monotonic()
                    if batch_full(len(kept), kept_bytes, batch_rows, batch_bytes):
                        # Within a consume() call's records: what they are beyond the bound is what
                        # librdkafka had queued, itself bounded by its queued.max.messages.kbytes.
                        yield to_batch(kept, schema, replay_header)
                        kept, kept_bytes = [], 0
                if place_done(offset, end):
                    finish(q)
            if ends:
                for tp in consumer.position([TopicPartition(topic, q) for q in sorted(ends)]):
                    if tp.offset != OFFSET_INVALID and tp.offset >= ends[tp.partition]:
                        finish(tp.partition)
            if ends and time.monotonic() - last_progress > stall_s:
                left = ", ".join(f"{q} up to {end}" for q, end in sorted(ends.items()))
                raise RangeReadError(f"topic '{topic}': no record for {stall_s:.0f} s before the end of "
                                     f"partitions {left} (is the broker up?)")
        if kept:
            yield to_batch(kept, schema, replay_header)
    finally:
        consumer.close()
