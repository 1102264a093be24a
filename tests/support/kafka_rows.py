"""Kafka records through the drain's column-wise decoding, one at a time, as the claim rows it makes: the
decode context, the claim schema and `kafka_row`. Pure: no broker."""

from datetime import UTC, datetime

import pyarrow as pa

from deltadrain.formats.decode import BatchDecoder
from deltadrain.sources.kafka.drain import DecodeContext, kafka_batch


def ctx(**kw):
    base = dict(topic="clicks", fields={"event_id": "string", "amount": "double"}, id_field="event_id",
                required=["event_id"], max_bytes=1000, id_from="field", id_header=None, attempts={(0, 5): 2})
    return DecodeContext(**{**base, **kw})


TS = datetime(2026, 1, 1, tzinfo=UTC)
CLAIM = pa.schema([("_dd_partition", pa.string()), ("_dd_position", pa.string()), ("_dd_pos_hi", pa.int64()),
                   ("_dd_pos_lo", pa.int64()), ("_dd_source_ts", pa.timestamp("us", tz="UTC")),
                   ("_dd_attempts", pa.int32()), ("_dd_reclaimed", pa.bool_()), ("_dd_message_id", pa.string()),
                   ("_dd_error_type", pa.string()), ("_dd_error", pa.string()), ("_dd_original", pa.binary()),
                   ("_dd_first_failure_at", pa.timestamp("us", tz="UTC")), ("event_id", pa.string()),
                   ("amount", pa.float64())])
HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


def kafka_row(c: DecodeContext, part, offset, ts, key, value, headers, replay_id: bytes | None = None) -> tuple:
    """One Kafka record through the drain's column-wise decoding, back as one claim row."""
    source = pa.RecordBatch.from_pydict(
        {"partition": pa.array([part], pa.int32()), "offset": pa.array([offset], pa.int64()),
         "timestamp": pa.array([ts], pa.timestamp("us", tz="UTC")), "key": pa.array([key], pa.binary()),
         "value": pa.array([value], pa.binary()), "headers": pa.array([headers], HEADERS),
         "replay_id": pa.array([replay_id], pa.binary())})
    decoder = BatchDecoder(fields=c.fields, id_field=c.id_field, required=c.required, max_bytes=c.max_bytes,
                           types={"event_id": pa.string(), "amount": pa.float64()})
    return tuple(kafka_batch(c, decoder, CLAIM, source).to_pylist()[0].values())
