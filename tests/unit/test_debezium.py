"""Debezium change events: envelopes as JsonConverter (with and without schemas) and AvroConverter write
them, tombstones, each op, truncates, and every way an event is a dead letter with its reason."""

import json
import random
from decimal import Decimal

import fastavro
import pytest

from deltadrain.formats.avro import encode, read_datum
from deltadrain.formats.debezium import (
    Change,
    Kind,
    Parsed,
    key_text,
    parse_json,
    parse_record,
    truncate_error,
)

SOURCE = {"version": "3.6.1.Final", "connector": "postgresql", "name": "shop", "ts_ms": 1767225600000,
          "snapshot": "false", "db": "shop", "sequence": '["24023128","24023128"]', "schema": "public",
          "table": "customers", "txId": 771, "lsn": 24023128, "xmin": None}

# Kafka Connect's schemas for the wrapper (JsonConverter, schemas.enable=true), abridged as Debezium writes them.
ROW_SCHEMA = {"type": "struct", "optional": True, "name": "shop.public.customers.Value", "field": "after",
              "fields": [{"type": "int32", "optional": False, "field": "id"},
                         {"type": "string", "optional": True, "field": "name"},
                         {"type": "int64", "optional": True, "field": "version"}]}
VALUE_SCHEMA = {"type": "struct", "optional": False, "name": "shop.public.customers.Envelope", "version": 2,
                "fields": [{**ROW_SCHEMA, "field": "before"}, ROW_SCHEMA,
                           {"type": "struct", "optional": False, "name": "io.debezium.connector.postgresql.Source",
                            "field": "source", "fields": []},
                           {"type": "string", "optional": False, "field": "op"},
                           {"type": "int64", "optional": True, "field": "ts_ms"}]}
KEY_SCHEMA = {"type": "struct", "optional": False, "name": "shop.public.customers.Key",
              "fields": [{"type": "int32", "optional": False, "field": "id"}]}


def envelope(op, before=None, after=None, **extra):
    return {"before": before, "after": after, "source": SOURCE, "transaction": None, "op": op,
            "ts_ms": 1767225600123, **extra}


def as_json(obj, schema=None, wrapped=False) -> bytes:
    return json.dumps({"schema": schema, "payload": obj} if wrapped else obj).encode()


def parse(value, key, wrapped=False, **kw) -> Parsed:
    v = value if value is None or isinstance(value, bytes) else as_json(value, VALUE_SCHEMA, wrapped)
    k = key if key is None or isinstance(key, bytes) else as_json(key, KEY_SCHEMA, wrapped)
    return parse_json(v, k, **kw)


ROW = {"id": 7, "name": "Ada", "version": 3}
OLD = {"id": 7, "name": "Ad", "version": 2}


@pytest.mark.parametrize("wrapped", [False, True], ids=["plain", "wrapped"])
@pytest.mark.parametrize("op,before", [("r", None), ("c", None), ("u", OLD), ("u", None)])
def test_snapshot_create_and_update_upsert_the_row_after(wrapped, op, before):
    got = parse(envelope(op, before=before, after=ROW), {"id": 7}, wrapped)
    assert got.error is None, got
    change = got.change
    assert change.kind == Kind.UPSERT and change.op == op
    assert change.key == {"id": 7} and change.after == ROW and change.before == before
    assert change.image == ROW and change.ts_ms == 1767225600123


@pytest.mark.parametrize("wrapped", [False, True], ids=["plain", "wrapped"])
def test_a_delete_keeps_its_key_and_the_row_before(wrapped):
    got = parse(envelope("d", before=OLD), {"id": 7}, wrapped)
    assert got.change.kind == Kind.DELETE and got.change.op == "d"
    assert got.change.key == {"id": 7} and got.change.after is None and got.change.image == OLD


def test_source_info_and_transaction_are_read_when_present():
    tx = {"id": "771:24023128", "total_order": 1, "data_collection_order": 1}
    change = parse(envelope("c", after=ROW, transaction=tx), {"id": 7}).change
    s = change.source
    assert (s.connector, s.db, s.schema, s.table, s.lsn, s.tx_id) == ("postgresql", "shop", "public", "customers",
                                                                       24023128, 771)
    assert s.snapshot == "false" and s.ts_ms == 1767225600000 and s.where == "shop.public.customers"
    assert dict(s.fields)["sequence"] == SOURCE["sequence"]
    assert change.tx == "771:24023128"
    # Other connectors name their position otherwise; a field of a type no connector writes is left out.
    sql_server = {"connector": "sqlserver", "db": "shop", "schema": "dbo", "table": "t",
                  "change_lsn": "00000025:00000d98:0002", "commit_lsn": "00000025:00000d98:0005",
                  "snapshot": True, "ts_ms": "soon"}
    s = parse(envelope("c", after=ROW, source=sql_server), {"id": 7}).change.source
    assert s.lsn == "00000025:00000d98:0005" and s.snapshot == "true" and s.ts_ms is None and s.tx_id is None


def test_the_key_is_the_same_with_or_without_the_wrapper_and_in_any_column_order():
    plain = parse(envelope("c", after=ROW), {"tenant": "a", "id": 7}).change
    wrapped = parse(envelope("c", after=ROW), {"id": 7, "tenant": "a"}, wrapped=True).change
    assert plain.key == wrapped.key
    assert plain.key_text == wrapped.key_text == '{"id":7,"tenant":"a"}'
    assert key_text({"id": Decimal("1.50"), "b": b"\x00"}) == '{"b":"AA==","id":"1.50"}'


def test_columns_named_schema_and_payload_are_not_taken_for_the_wrapper():
    key = {"schema": "public", "payload": 3}
    got = parse(envelope("c", after={**ROW, **key}), key)
    assert got.change.key == key


@pytest.mark.parametrize("key", [{"id": 7}, {"schema": KEY_SCHEMA, "payload": {"id": 7}}], ids=["plain", "wrapped"])
def test_a_tombstone_deletes_its_key(key):
    got = parse_json(None, as_json(key))
    assert got.change == Change(Kind.DELETE, None, {"id": 7})
    assert got.change.image is None
    # A wrapper whose payload is null is a null value too.
    assert parse_json(as_json(None, VALUE_SCHEMA, wrapped=True), as_json(key)).change == got.change


def test_a_truncate_needs_no_key_and_says_what_to_do():
    got = parse(envelope("t"), None)
    assert got.change.kind == Kind.TRUNCATE and got.change.key is None
    line = truncate_error(got.change, "orders_cdc")
    assert "\n" not in line
    assert "shop.public.customers was truncated" in line and "lsn 24023128" in line
    assert "target.on_truncate: truncate" in line and "orders_cdc" in line


def test_a_delete_without_a_record_key_takes_its_key_from_before_with_target_key():
    got = parse(envelope("d", before=OLD), None, key_columns=("id",))
    assert got.change.kind == Kind.DELETE and got.change.key == {"id": 7}
    without = parse(envelope("d", before=OLD), None)
    assert without.error_type == "missing_key" and "target.key" in without.error


def test_target_key_takes_its_columns_from_the_record_key_else_from_the_row():
    from_key = parse(envelope("c", after=ROW), {"id": 7, "region": "eu"}, key_columns=("id",)).change
    assert from_key.key == {"id": 7}
    from_row = parse(envelope("u", after=ROW), {"uid": 1}, key_columns=("id", "name")).change
    assert from_row.key == {"id": 7, "name": "Ada"}
    tomb = parse_json(None, as_json({"id": 7, "region": "eu"}), key_columns=("id",)).change
    assert tomb.key == {"id": 7} and tomb.kind == Kind.DELETE


# The schemas Debezium's AvroConverter registers for a Postgres table, abridged.
AVRO_ROW = {"type": "record", "name": "Value", "fields": [
    {"name": "id", "type": "int"}, {"name": "name", "type": ["null", "string"], "default": None},
    {"name": "version", "type": ["null", "long"], "default": None}]}
AVRO_ENVELOPE = {"type": "record", "name": "Envelope", "namespace": "shop.public.customers", "fields": [
    {"name": "before", "type": ["null", AVRO_ROW], "default": None},
    {"name": "after", "type": ["null", "Value"], "default": None},
    {"name": "source", "type": {"type": "record", "name": "Source", "namespace": "io.debezium.connector.postgresql",
                                "fields": [{"name": "version", "type": "string"}, {"name": "connector", "type": "string"},
                                           {"name": "name", "type": "string"}, {"name": "ts_ms", "type": "long"},
                                           {"name": "snapshot", "type": ["string", "null"], "default": "false"},
                                           {"name": "db", "type": "string"}, {"name": "schema", "type": "string"},
                                           {"name": "table", "type": "string"},
                                           {"name": "txId", "type": ["null", "long"], "default": None},
                                           {"name": "lsn", "type": ["null", "long"], "default": None}]}},
    {"name": "op", "type": "string"}, {"name": "ts_ms", "type": ["null", "long"], "default": None},
    {"name": "transaction", "type": ["null", {"type": "record", "name": "block", "namespace": "event", "fields": [
        {"name": "id", "type": "string"}, {"name": "total_order", "type": "long"},
        {"name": "data_collection_order", "type": "long"}]}], "default": None}]}
AVRO_KEY = {"type": "record", "name": "Key", "namespace": "shop.public.customers",
            "fields": [{"name": "id", "type": "int"}]}
AVRO_SOURCE = {k: v for k, v in SOURCE.items() if k not in ("sequence", "xmin")}


def through_avro(record, schema):
    """A record as the converter writes it (Confluent framing) and the drain reads it back: a dict."""
    value, wrong = read_datum(encode(record, schema, wire="confluent", schema_id=5)[5:],
                              fastavro.parse_schema(schema))
    assert wrong is None
    return value


@pytest.mark.parametrize("op,before,after,kind", [("r", None, ROW, Kind.UPSERT), ("c", None, ROW, Kind.UPSERT),
                                                  ("u", OLD, ROW, Kind.UPSERT), ("d", OLD, None, Kind.DELETE)])
def test_avro_datums_as_debeziums_converter_writes_them(op, before, after, kind):
    value = through_avro({"before": before, "after": after, "source": AVRO_SOURCE, "op": op,
                          "ts_ms": 1767225600123, "transaction": None}, AVRO_ENVELOPE)
    got = parse_record(value, through_avro({"id": 7}, AVRO_KEY))
    assert got.error is None, got
    assert got.change.kind == kind and got.change.key == {"id": 7}
    assert got.change.after == after and got.change.before == before
    assert got.change.source.lsn == 24023128 and got.change.source.tx_id == 771


def test_avro_tombstones_and_truncates():
    assert parse_record(None, through_avro({"id": 7}, AVRO_KEY)).change == Change(Kind.DELETE, None, {"id": 7})
    value = through_avro({"before": None, "after": None, "source": AVRO_SOURCE, "op": "t", "ts_ms": 1,
                          "transaction": None}, AVRO_ENVELOPE)
    assert parse_record(value, None).change.kind == Kind.TRUNCATE


@pytest.mark.parametrize("value,key,kind,words", [
    (envelope("c", after=ROW), None, "missing_key", "op 'c' has no record key"),
    (envelope("c", after=ROW), {}, "missing_key", "no record key columns"),
    (envelope("u", after=ROW), {"id": None}, "missing_key", "key column id null"),
    (None, None, "missing_key", "tombstone"),
    (envelope("x", after=ROW), {"id": 7}, "unknown_op", "op \"x\" is none of Debezium's row changes"),
    (envelope(None, after=ROW), {"id": 7}, "unknown_op", "op null"),
    (envelope(["c"], after=ROW), {"id": 7}, "unknown_op", "none of Debezium's"),
    (envelope("m"), {"id": 7}, "unknown_op", "logical decoding message"),
    ({"id": 7, "name": "Ada"}, {"id": 7}, "invalid_envelope", "no 'op' (its fields: id, name)"),
    (envelope("c", after=[1, 2]), {"id": 7}, "invalid_envelope", "'after' is a JSON list"),
    (envelope("d", before="x"), {"id": 7}, "invalid_envelope", "'before' is a JSON str"),
    (envelope("c", after=ROW, source=5), {"id": 7}, "invalid_envelope", "'source' is a JSON int"),
    (envelope("c", after=ROW, ts_ms="2026-01-01"), {"id": 7}, "invalid_envelope", "'ts_ms' is \"2026-01-01\""),
    (envelope("c", after=ROW, ts_ms=True), {"id": 7}, "invalid_envelope", "'ts_ms' is true"),
    (envelope("c"), {"id": 7}, "missing_after", "op 'c' upserts but 'after' is null"),
    ({"op": "u", "before": OLD}, {"id": 7}, "missing_after", "'after' is missing"),
    (envelope("r"), {"id": 7}, "missing_after", "op 'r'"),
    (b'{"op": "c", "after": {"name": "\xff"}}', {"id": 7}, "invalid_utf8", "payload is not valid UTF-8 (byte 31"),
    (envelope("c", after=ROW), b'{"id": "\xfe"}', "invalid_utf8", "record key is not valid UTF-8"),
    (b'{"op": "c", ', {"id": 7}, "invalid_json", "payload is not valid JSON"),
    (envelope("c", after=ROW), b"{id: 7}", "invalid_json", "record key is not valid JSON"),
    (b'{"op": "c", "after": {"name": "\\ud800"}}', {"id": 7}, "invalid_json", "lone UTF-16 surrogate (\\ud800)"),
    (b"[" * 5000 + b"]" * 5000, {"id": 7}, "invalid_json", "nested deeper"),
    (b"[1, 2]", {"id": 7}, "not_an_object", "payload is a JSON list"),
    (b'"c"', {"id": 7}, "not_an_object", "payload is a JSON str"),
    (envelope("c", after=ROW), b"7", "not_an_object", "record key is a JSON int"),
    (b"", {"id": 7}, "empty", "empty payload"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_bad_change_events_are_dead_letters_with_their_reason(value, key, kind, words):
    got = parse(value, key)
    assert got.change is None
    assert got.error_type == kind
    assert words in got.error, got.error


def test_key_columns_missing_everywhere_and_bad_avro_keys():
    got = parse(envelope("c", after=ROW), {"uid": 1}, key_columns=("tenant",))
    assert got.error_type == "missing_key"
    assert "key columns tenant are not all in the record key or 'after'" in got.error
    got = parse_json(None, None, key_columns=("id",))
    assert got.error_type == "missing_key" and "it has no key and no row" in got.error
    assert parse_record(envelope("c", after=ROW), 7).error_type == "not_an_object"
    assert parse_record(envelope("c", after=ROW), b"\x0e").error == ("record key is a byte string, expected an "
                                                                     "object of key columns")


def test_oversized_payloads_are_dead_letters_when_a_limit_is_given():
    value = as_json(envelope("c", after={**ROW, "name": "x" * 500}))
    assert parse_json(value, as_json({"id": 7}), max_bytes=100).error_type == "oversized"
    assert parse_json(value, as_json({"id": 7})).error is None


def test_fractions_are_read_exactly_as_written():
    got = parse(b'{"op": "c", "after": {"id": 1, "price": 0.1000000000000000055511151231257827}}', {"id": 1})
    assert got.change.after["price"] == Decimal("0.1000000000000000055511151231257827")


def test_no_input_makes_the_parser_raise():
    """Random bytes and random JSON shaped like envelopes: always a change or a dead letter."""
    rng = random.Random(62)
    atoms = [None, True, 0, -1, 2**70, 1.5, "", "c", "d", "t", "u", "r", "x", [], {}, [1], {"id": 1}]

    def shape(depth=0):
        pick = rng.random()
        if depth > 2 or pick < 0.5:
            return rng.choice(atoms)
        if pick < 0.6:
            return [shape(depth + 1) for _ in range(rng.randrange(3))]
        names = ["before", "after", "source", "op", "ts_ms", "transaction", "id", "schema", "payload", "lsn"]
        return {rng.choice(names): shape(depth + 1) for _ in range(rng.randrange(5))}

    for _ in range(3000):
        if rng.random() < 0.3:
            value = bytes(rng.randrange(256) for _ in range(rng.randrange(20)))
            key = rng.choice([None, b"", bytes(rng.randrange(256) for _ in range(4))])
        elif rng.random() < 0.5:  # a real event with one part replaced
            event = envelope(rng.choice("rcudt"), before=rng.choice([None, OLD]), after=rng.choice([None, ROW]))
            event[rng.choice(list(event))] = shape()
            value, key = as_json(event, VALUE_SCHEMA, wrapped=rng.random() < 0.5), rng.choice([None, as_json({"id": 7})])
        else:
            value = as_json(shape()) if rng.random() < 0.9 else None
            key = rng.choice([None, as_json(shape()), as_json({"id": 1}), as_json({"schema": {"type": "x"},
                                                                                     "payload": shape()})])
        got = parse_json(value, key, key_columns=rng.choice([(), ("id",)]))
        assert (got.change is None) == (got.error_type is not None) == (got.error is not None)
        if got.change is not None and got.change.kind != Kind.TRUNCATE:
            assert got.change.key and got.change.key_text
