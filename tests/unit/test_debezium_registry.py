"""Debezium change events in Avro through the schema registry (`schema.envelope: debezium`, `schema.format: avro`):
key and value read with the writer's schema their ids name, Kafka Connect's logical types made plain, the same
dead letters as the JSON path, and a registry outage a failure of the run, never a dead letter. The registry is
a dict here; tests/integration/test_cdc_avro.py runs the real connector and registry."""

from __future__ import annotations

import json
from decimal import Decimal

import pyarrow as pa
import pytest

from deltadrain.formats import avro
from deltadrain.formats.avro import encode
from deltadrain.formats.changes import DELETE, TRUNCATE, UPSERT, UpsertDecoder, UpsertSpec
from deltadrain.formats.confluent import header
from deltadrain.formats.registry import Registry, RegistryUnavailable, Writer

FIELDS = {"id": "long", "name": "string", "price": "decimal(18,2)", "at": "timestamp", "born": "date"}
TYPES = {"id": pa.int64(), "name": pa.string(), "price": pa.decimal128(18, 2), "at": pa.timestamp("us", tz="UTC"),
         "born": pa.date32(), "_dd_order": pa.int64()}


def optional(name: str, t) -> dict:
    """A nullable field, as the converter writes a column that may be null."""
    return {"name": name, "type": ["null", t], "default": None}


def connect_decimal(precision: int, scale: int) -> dict:
    return {"type": "bytes", "scale": scale, "precision": precision, "connect.version": 1,
            "connect.parameters": {"scale": str(scale), "connect.decimal.precision": str(precision)},
            "connect.name": "org.apache.kafka.connect.data.Decimal", "logicalType": "decimal"}


MICRO_TIMESTAMP = {"type": "long", "connect.version": 1, "connect.name": "io.debezium.time.MicroTimestamp"}
DATE = {"type": "int", "connect.version": 1, "connect.name": "io.debezium.time.Date"}


# As Apicurio Registry's converter writes a Postgres table's rows with Debezium's defaults: numeric(12,2) in
# Avro's decimal type, timestamp as microseconds and date as days with their Kafka Connect names.
ROW = {"type": "record", "name": "Value", "namespace": "cdcavro.public.t", "fields": [
    {"name": "id", "type": "int"}, optional("name", "string"), optional("price", connect_decimal(12, 2)),
    optional("at", MICRO_TIMESTAMP), optional("born", DATE)]}
SOURCE = {"type": "record", "name": "Source", "namespace": "io.debezium.connector.postgresql", "fields": [
    {"name": "table", "type": "string"}, {"name": "lsn", "type": ["null", "long"], "default": None}]}
ENVELOPE = {"type": "record", "name": "Envelope", "namespace": "cdcavro.public.t", "fields": [
    {"name": "before", "type": ["null", ROW], "default": None},
    {"name": "after", "type": ["null", "Value"], "default": None},
    {"name": "source", "type": "io.debezium.connector.postgresql.Source"},  # a reference, as the converter registers it
    {"name": "op", "type": "string"}, {"name": "ts_ms", "type": ["null", "long"], "default": None}]}
KEY = {"type": "record", "name": "Key", "namespace": "cdcavro.public.t", "fields": [{"name": "id", "type": "int"}]}
WRITERS = {1: Writer(json.dumps(KEY)),
           2: Writer(json.dumps(ENVELOPE), imports=(("io.debezium.connector.postgresql.Source", json.dumps(SOURCE)),)),
           3: Writer(None, "AVRO", (), "unknown_schema_id", "unknown schema id 3 (the registry does not know it)")}
FULL = avro.with_imports(ENVELOPE, {"io.debezium.connector.postgresql.Source": SOURCE})
# The table after `ALTER TABLE ... ADD COLUMN rank smallint, paid numeric(10,3), seen timestamp, day date, zone
# timestamptz, tags text[]`, as the converter registers its next version.
NEW = [optional("rank", {"type": "int", "connect.type": "int16"}), optional("paid", connect_decimal(10, 3)),
       optional("seen", MICRO_TIMESTAMP), optional("day", DATE),
       optional("zone", {"type": "string", "connect.version": 1, "connect.name": "io.debezium.time.ZonedTimestamp"}),
       optional("tags", {"type": "array", "items": ["null", "string"]})]
ENVELOPE_2 = {**ENVELOPE, "fields": [{"name": "before", "type": ["null", {**ROW, "fields": ROW["fields"] + NEW}],
                                      "default": None}, *ENVELOPE["fields"][1:]]}
WRITERS[4] = Writer(json.dumps(ENVELOPE_2), imports=WRITERS[2].imports)
FULL_2 = avro.with_imports(ENVELOPE_2, {"io.debezium.connector.postgresql.Source": SOURCE})


@pytest.fixture(autouse=True)
def registry(monkeypatch):
    asked = []

    def writer(_registry, schema_id, kind):
        asked.append(schema_id)
        if schema_id == 9:
            raise RegistryUnavailable("deltadrain schema registry: cannot get schema id 9 (down)")
        return WRITERS[schema_id]

    monkeypatch.setattr(avro, "writer", writer)
    return asked


def decoder(order_by="source.lsn", fields=FIELDS, **kwargs) -> UpsertDecoder:
    spec = UpsertSpec("debezium", (), order_by, registry=Registry("http://reg"))
    return UpsertDecoder(spec, fields=fields, id_field="", required=[], max_bytes=10_000,
                         types={**TYPES, "rank": pa.int32()}, **kwargs)


def key(i: int) -> bytes:
    return encode({"id": i}, KEY, wire="confluent", schema_id=1)


def change(op: str, before=None, after=None, lsn=100, schema=FULL, schema_id=2) -> bytes:
    return encode({"before": before, "after": after, "source": {"table": "t", "lsn": lsn}, "op": op, "ts_ms": 1},
                  schema, wire="confluent", schema_id=schema_id)


ROW_7 = {"id": 7, "name": "Ada", "price": Decimal("12.50"), "at": 1767225600123456, "born": 7305}


def test_changes_read_through_the_registry_give_typed_rows_keys_and_orders(registry):
    d = decoder()
    up = d.event(change("c", after=ROW_7, lsn=123), key(7))
    assert (up.key, up.change, up.order) == ('{"id":7}', UPSERT, 123)
    _, id_, name, price, at, born = up.decoded.values
    assert (id_, name, price, born.isoformat()) == (7, "Ada", Decimal("12.50"), "1990-01-01")
    assert at.isoformat() == "2026-01-01T00:00:00.123456+00:00"
    gone = d.event(change("d", before={"id": 7, "name": None, "price": None, "at": None, "born": None}, lsn=124), key(7))
    assert (gone.key, gone.change, gone.order) == ('{"id":7}', DELETE, 124)
    tomb = d.event(None, key(7))
    assert (tomb.key, tomb.change) == ('{"id":7}', DELETE)
    assert d.event(change("t", lsn=125), None).change == TRUNCATE
    # A DLQ replay's copy carries its key's text: read as JSON.
    assert d.event(change("u", after=ROW_7), b'{"id":7}').key == '{"id":7}'
    assert sorted(set(registry)) == [1, 2]  # each id asked once per decoder
    assert len(registry) == 2


@pytest.mark.parametrize(("value", "record_key", "kind", "says", "message_id"), [
    (header(3) + b"\x02", key(7), "unknown_schema_id", "payload: unknown schema id 3", '{"id":7}'),
    (b"\x01" + change("c", after=ROW_7)[1:], key(7), "wrong_magic_byte", "payload: payload starts with byte 0x01",
     '{"id":7}'),
    (change("c", after=ROW_7)[:-3], key(7), "truncated", "payload (schema id 2) of", '{"id":7}'),
    (change("c", after=ROW_7), None, "missing_key", "op 'c' has no record key", None),
    (change("c", after=ROW_7), header(3) + b"\x0e", "unknown_schema_id", "record key: unknown schema id 3", None),
    (change("x", after=ROW_7), key(7), "unknown_op", "op \"x\" is none of Debezium's row changes", '{"id":7}'),
    (change("c"), key(7), "missing_after", "op 'c' upserts but 'after' is null", '{"id":7}'),
    (b"", key(7), "empty", "empty payload", '{"id":7}'),
])
def test_bad_records_are_dead_letters_with_their_reason(value, record_key, kind, says, message_id):
    got = decoder().event(value, record_key).decoded
    assert (got.values, got.error_type, got.message_id) == (None, kind, message_id), got
    assert says in got.error, got.error


def test_a_registry_outage_fails_the_batch_instead_of_dead_lettering_it():
    d = decoder()
    with pytest.raises(RegistryUnavailable, match="cannot get schema id 9"):
        d.columns([change("c", after=ROW_7), header(9) + b"\x02"], keys=[key(7), key(8)])
    cols = d.columns([change("c", after=ROW_7), header(3) + b"\x02"], keys=[key(7), key(8)])
    assert cols["_dd_error_type"].to_pylist() == [None, "unknown_schema_id"]
    assert cols["_dd_key"].to_pylist() == ['{"id":7}', None] and cols["_dd_message_id"].to_pylist()[1] == '{"id":8}'


def test_a_writers_new_columns_are_typed_by_its_after_record_with_kafka_connects_and_avros_logical_types():
    import fastavro

    from deltadrain.formats.changes import image_kinds
    from deltadrain.schema.evolution import LEFT_OUT

    kinds = image_kinds(fastavro.parse_schema(FULL_2))
    assert {n: kinds[n] for n in ("id", "at", "born", "price", "rank", "paid", "seen", "day", "zone", "tags")} == {
        "id": {"int"}, "at": {"null", "timestamp"}, "born": {"null", "date"}, "price": {"null", "decimal(12,2)"},
        "rank": {"null", "int"}, "paid": {"null", "decimal(10,3)"}, "seen": {"null", "timestamp"},
        "day": {"null", "date"}, "zone": {"null", "string"}, "tags": {"null", "array"}}
    d = decoder(collect_new=True)
    row = {**ROW_7, "rank": 3, "paid": Decimal("-1.005"), "seen": 1767225600123456, "day": 7306,
           "zone": "2026-01-01T00:00:00Z", "tags": ["a"]}
    up = d.event(change("u", after=row, schema=FULL_2, schema_id=4), key(7))
    *columns, extra, signature = up.decoded.values
    assert columns[1:4] == [7, "Ada", Decimal("12.50")] and up.change == UPSERT
    # Typed as the writer says (values alone would make rank a long, paid a double, seen and day strings); each
    # column comes even when the message's value is null, a writer's field no column holds is left out.
    assert json.loads(extra) == {"rank": 3, "paid": "-1.005000000", "seen": 1767225600123456, "day": "1990-01-02",
                                 "zone": "2026-01-01T00:00:00Z"}
    told = json.loads(signature)
    assert told.pop("tags").startswith(LEFT_OUT) and told == {
        "rank": "int", "paid": "decimal(38,9)", "seen": "timestamp", "day": "date", "zone": "string"}
    nulls = d.event(change("c", after={**ROW_7, **dict.fromkeys(("rank", "paid", "seen", "day", "zone", "tags"))},
                           schema=FULL_2, schema_id=4), key(8))
    assert nulls.decoded.values[-2:] == ("{}", signature)
    # The older writer adds nothing; deletes carry no new fields.
    assert d.event(change("u", after=ROW_7), key(7)).decoded.values[-2:] == (None, None)
    gone = d.event(change("d", before=row, schema=FULL_2, schema_id=4), key(7))
    assert gone.change == DELETE and gone.decoded.values[-2:] == (None, None)
    # Once rank is a column of the table (evolved) it is typed by it.
    evolved = decoder(fields={**FIELDS, "rank": "int"}, evolved=frozenset({"rank"}), collect_new=True)
    again = evolved.event(change("u", after=row, schema=FULL_2, schema_id=4), key(7)).decoded
    assert again.values[6] == 3 and "rank" not in json.loads(again.values[-2])
