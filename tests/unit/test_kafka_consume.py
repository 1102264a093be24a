"""The in-process Kafka range read's pure parts: a record's row as Spark's Kafka source has it, and when
a partition is read up to its end offset."""

from __future__ import annotations

from dataclasses import dataclass

from deltadrain.sources.kafka.consume import batch_full, place_done, source_schema, to_batch

COLUMNS = ["partition", "offset", "timestamp", "value", "headers", "replay_id"]


@dataclass
class Record:
    """What the row takes from a confluent-kafka message (its accessors)."""

    _partition: int
    _offset: int
    _value: bytes | None
    _headers: list | None
    _ts_ms: int = 1_700_000_000_123

    def partition(self):
        return self._partition

    def offset(self):
        return self._offset

    def value(self):
        return self._value

    def key(self):
        return None

    def headers(self):
        return self._headers

    def timestamp(self):
        return (1, self._ts_ms)


def test_rows_carry_spark_sources_types_null_headers_and_the_first_replay_header():
    msgs = [Record(0, 5, b"{}", None), Record(1, 7, None, []),
            Record(1, 8, b"x", [("a", b"1"), ("rid", b"r-1"), ("rid", b"r-2")]), Record(1, 9, b"y", [("rid", None)], -1)]
    batch = to_batch(msgs, source_schema(COLUMNS), "rid")
    got = batch.to_pydict()
    assert got["headers"][:2] == [None, None]  # none and empty alike, as Spark gives them
    assert got["headers"][2] == [{"key": "a", "value": b"1"}, {"key": "rid", "value": b"r-1"},
                                 {"key": "rid", "value": b"r-2"}]
    assert got["replay_id"] == [None, None, b"r-1", None]
    assert got["value"] == [b"{}", None, b"x", b"y"]
    assert batch.column("timestamp").cast("int64").to_pylist() == [1_700_000_000_123_000] * 3 + [-1000]
    assert str(batch.schema.field("timestamp").type) == "timestamp[us, tz=UTC]"
    assert batch.schema.field("partition").type == "int32"


def test_a_partition_is_done_at_its_last_offset_or_past_it_never_before():
    assert not place_done(8, 10)
    assert place_done(9, 10) and place_done(12, 10)


def test_a_batch_goes_to_the_decoder_at_its_count_or_its_bytes_whichever_comes_first():
    assert not batch_full(9, 99, batch_rows=10, batch_bytes=100)
    assert batch_full(10, 0, batch_rows=10, batch_bytes=100)
    assert batch_full(1, 100, batch_rows=10, batch_bytes=100)  # one large message is a batch of its own
    assert not batch_full(0, 0, batch_rows=10, batch_bytes=0)  # nothing kept is never a batch
