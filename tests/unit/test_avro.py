"""Avro payloads: the config checks, the per-message decode and its dead letters, and that an Avro
batch decodes into exactly the columns the JSON path gives for the same records."""

from __future__ import annotations

import json
import math
import uuid
from collections import Counter
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest
import yaml

from deltadrain.config import load_config
from deltadrain.dev.produce import avro_bad_kinds, avro_error_type, generate
from deltadrain.errors import ConfigError
from deltadrain.formats.avro import (
    AvroBatchDecoder,
    AvroPayload,
    decode_avro,
    encode,
    field_problems,
    payload_of,
)
from deltadrain.formats.decode import BatchDecoder

ROOT = Path(__file__).resolve().parents[2]

SCHEMA = {"type": "record", "name": "Row", "namespace": "t", "fields": [
    {"name": "id", "type": ["string", "long"]},
    {"name": "l", "type": "long"},
    {"name": "i", "type": ["null", "long"], "default": None},
    {"name": "d", "type": "double"},
    {"name": "f", "type": "float"},
    {"name": "b", "type": "boolean"},
    {"name": "s", "type": ["null", "string"], "default": None},
    {"name": "e", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}},
    {"name": "u", "type": {"type": "string", "logicalType": "uuid"}},
    {"name": "raw", "type": "bytes"},
    {"name": "fx", "type": {"type": "fixed", "name": "Four", "size": 4}},
    {"name": "dec", "type": {"type": "bytes", "logicalType": "decimal", "precision": 20, "scale": 2}},
    {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "tus", "type": ["null", {"type": "long", "logicalType": "timestamp-micros"}], "default": None},
    {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    {"name": "again", "type": "t.Kind"},
]}
FIELDS = {"id": "string", "l": "long", "i": "int", "d": "double", "f": "float", "b": "boolean", "s": "string",
          "e": "string", "u": "string", "raw": "binary", "fx": "binary", "dec": "decimal(18,2)", "ts": "timestamp",
          "tus": "timestamp", "day": "date", "again": "string"}
REQUIRED = ["id", "l", "d"]
UID = uuid.UUID("12345678-1234-5678-1234-567812345678")


def record(**changes):
    base = {"id": "m-1", "l": 2**40, "i": 7, "d": 1.25, "f": 0.5, "b": True, "s": "hé", "e": "B", "u": str(UID),
            "raw": b"\x00\xff", "fx": b"abcd", "dec": Decimal("12.34"),
            "ts": datetime(2026, 3, 1, 12, 0, 0, 123000, tzinfo=UTC),
            "tus": datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC), "day": date(2026, 3, 2), "again": "A"}
    return {**base, **changes}


def payload(wire="plain", schema_id=None):
    return AvroPayload(json.dumps(SCHEMA), wire, schema_id)


def dec(data, p=None, **kw):
    return decode_avro(data, p or payload(), fields=FIELDS, id_field="id", required=REQUIRED, max_bytes=4096, **kw)


def test_every_avro_type_maps_to_its_declared_column_type():
    got = dec(encode(record(), SCHEMA))
    assert got.error is None, got.error
    values = dict(zip(FIELDS, got.values, strict=True))
    assert values == {"id": "m-1", "l": 2**40, "i": 7, "d": 1.25, "f": 0.5, "b": True, "s": "hé", "e": "B",
                      "u": str(UID), "raw": b"\x00\xff", "fx": b"abcd", "dec": Decimal("12.34"),
                      "ts": datetime(2026, 3, 1, 12, 0, 0, 123000, tzinfo=UTC),
                      "tus": datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC), "day": date(2026, 3, 2),
                      "again": "A"}
    # Optional fields null, an integer id (merged on its text), a message id from outside winning.
    got = dec(encode(record(id=42, i=None, s=None, tus=None), SCHEMA))
    assert got.message_id == "42" and got.values[2] is None and got.values[6] is None and got.values[13] is None
    assert dec(encode(record(), SCHEMA), message_id="from-key").message_id == "from-key"


@pytest.mark.parametrize(("changes", "reason"), [
    ({"i": 2**31}, "field 'i' should be int, got 2147483648"),
    ({"d": math.nan}, "field 'd' should be double, got NaN"),
    ({"f": math.inf}, "field 'f' should be float, got Infinity"),
    ({"dec": Decimal("123456789012345678.9")}, "field 'dec' should be decimal(18,2), got 123456789012345678.90"),
])
def test_a_value_the_declared_type_cannot_hold_is_a_schema_dead_letter(changes, reason):
    got = dec(encode(record(**changes), SCHEMA))
    assert (got.values, got.message_id, got.error_type, got.error) == (None, "m-1", "schema", reason)


def test_bad_bodies_are_dead_letters_with_their_reason():
    good = encode(record(), SCHEMA)
    cases = {
        b"": ("empty", "empty payload"),
        good[:-2]: ("truncated", "ends before its datum does"),
        good + b"\x00": ("invalid_avro", "1 bytes after its datum"),
        b'{"id": "m-1"}': ("invalid_avro", "union or enum index out of range"),  # JSON text: '{' is branch -62
        good[:8]: ("truncated", "ends before its datum does (in a number)"),  # in the varint of `l`
        b"\x04" + good[1:]: ("invalid_avro", "union or enum index out of range"),  # branch 2 of 2 branches
        b"\x00\x06m-1\x00" + b"\xfe\x01" * 40: ("invalid_avro", "does not match the schema"),
        b"x" * 5000: ("oversized", "exceeds max_message_bytes=4096"),
    }
    for data, (kind, words) in cases.items():
        got = dec(data)
        assert got.values is None and got.error_type == kind and words in got.error, (data[:20], got)
    # Required fields: an optional Avro field may be null, a required column may not.
    strict = decode_avro(encode(record(s=None), SCHEMA), payload(), fields=FIELDS, id_field="id",
                         required=["id", "s"], max_bytes=4096)
    assert (strict.error_type, strict.error, strict.message_id) == ("schema", "required field 's' is null", "m-1")


def test_the_confluent_wire_format_needs_the_magic_byte_and_the_configured_schema_id():
    p = payload("confluent", 7)
    good = encode(record(), SCHEMA, wire="confluent", schema_id=7)
    assert good[:5] == b"\x00\x00\x00\x00\x07" and dec(good, p).values is not None
    other = encode(record(), SCHEMA, wire="confluent", schema_id=300)
    assert dec(other, p)[2:] == ("unknown_schema_id", "unknown schema id 300 (this pipeline reads schema id 7)")
    assert dec(b"\x01" + good[1:], p)[2:] == (
        "wrong_magic_byte", "payload starts with byte 0x01, not the Confluent wire format's magic byte 0x00")
    assert dec(good[:3], p)[2] == "truncated"
    assert dec(good[:5], p)[2] == "truncated"  # a header and nothing after it
    # A plain datum read as framed: its first byte (the id's union branch, 0) passes for the magic byte.
    assert dec(encode(record(), SCHEMA), p)[2] == "unknown_schema_id"
    assert dec(encode(record(id=5), SCHEMA), p)[2] == "wrong_magic_byte"


def test_an_avro_batch_gives_the_json_paths_columns_for_the_same_records():
    """The same records as JSON and as Avro, good and bad, decode into identical columns: staging, the
    MERGE and the DLQ need no change for Avro."""
    fields = {"id": "string", "l": "long", "d": "double", "b": "boolean", "s": "string", "ts": "timestamp"}
    types = {"id": pa.string(), "l": pa.int64(), "d": pa.float64(), "b": pa.bool_(), "s": pa.string(),
             "ts": pa.timestamp("us", tz="UTC")}
    schema = {"type": "record", "name": "R", "fields": [
        {"name": "id", "type": "string"}, {"name": "l", "type": "long"}, {"name": "d", "type": "double"},
        {"name": "b", "type": "boolean"}, {"name": "s", "type": ["null", "string"]},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-micros"}}]}
    rows = [{"id": f"m-{i}", "l": i * 1000, "d": i / 3, "b": i % 2 == 0, "s": None if i % 5 == 0 else f"s{i}",
             "ts": datetime(2026, 1, 1, tzinfo=UTC).replace(microsecond=i)} for i in range(300)]
    rows[7]["d"] = math.nan  # refused by both
    as_json = [json.dumps({**r, "ts": r["ts"].isoformat().replace("+00:00", "Z"),
                           "d": r["d"] if math.isfinite(r["d"]) else "NaN"}).encode() for r in rows]
    as_avro = [encode(r, schema) for r in rows]
    common = {"fields": fields, "id_field": "id", "required": ["id", "l"], "max_bytes": 4096, "types": types}
    json_cols = BatchDecoder(**common).columns(as_json)
    avro_cols = AvroBatchDecoder(AvroPayload(json.dumps(schema)), **common).columns(as_avro)
    for name in ["_dd_message_id", "_dd_error_type", *fields]:
        assert avro_cols[name].equals(json_cols[name]), name
    assert avro_cols["_dd_error_type"].to_pylist().count("schema") == 1
    assert avro_cols["_dd_original"][7].as_py() == as_avro[7]  # the DLQ keeps the bytes as they came


def write(tmp_path, schema: dict | str | None, avro: dict | None = None, **schema_block) -> Path:
    data = yaml.safe_load((ROOT / "config" / "pipelines.avro.yaml").read_text())
    pipe = data["pipelines"][0]
    pipe["schema"].update(schema_block)
    pipe["schema"]["avro"].update(avro or {})
    data["pipelines"] = [pipe]
    (tmp_path / "conf").mkdir(exist_ok=True)
    if schema is not None:
        (tmp_path / "conf" / "s.avsc").write_text(schema if isinstance(schema, str) else json.dumps(schema))
        pipe["schema"]["avro"]["schema_file"] = "s.avsc"
    path = tmp_path / "conf" / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_the_schema_file_is_read_relative_to_the_config_and_checked_at_load(tmp_path):
    example = load_config(ROOT / "config" / "pipelines.avro.yaml")
    for p in example.pipelines:
        assert p.payload_schema.avro.schema_file == str(ROOT / "config" / "schemas" / "clicks.avsc")
        assert json.loads(payload_of(p.payload_schema).schema_json)["name"] == "Click"
    clicks = json.loads((ROOT / "config" / "schemas" / "clicks.avsc").read_text())
    assert load_config(write(tmp_path, clicks)).pipelines[0].payload_schema.avro.schema_file == str(
        tmp_path / "conf" / "s.avsc")
    where = r"p.yaml: pipeline 'clicks_avro', field 'schema.avro.schema_file': "
    cases = [
        ((None, {"schema_file": "gone.avsc"}), where + r".*conf/gone.avsc not found"),
        (("{not json", {}), where + "Avro schema file .*s.avsc is not JSON"),
        (({"type": "record", "name": "X", "fields": [{"name": "a", "type": "nope"}]}, {}),
         where + "Avro schema file .*s.avsc is not a valid Avro schema"),
        (({"type": "enum", "name": "X", "symbols": ["A"]}, {}), where + ".*must hold a record schema"),
        (({**clicks, "fields": [f for f in clicks["fields"] if f["name"] != "status"]}, {}),
         where + r".*cannot fill schema.fields: field 'status' is not in the Avro schema"),
        (({**clicks, "fields": [{**f, "type": "boolean"} if f["name"] == "amount" else f
                                for f in clicks["fields"]]}, {}),
         where + r".*field 'amount' is double but the Avro schema gives it boolean"),
    ]
    for (schema, block), message in cases:
        with pytest.raises(ConfigError, match=message):
            load_config(write(tmp_path, schema, block))
    field = r"p.yaml: pipeline 'clicks_avro', field 'schema': "
    with pytest.raises(ConfigError, match=field + r"avro\.wire confluent needs avro\.schema_id"):
        load_config(write(tmp_path, clicks, {"schema_id": None}))
    with pytest.raises(ConfigError, match=field + r"format avro needs avro\.schema_file"):
        load_config(write(tmp_path, None, {"schema_file": None}))
    with pytest.raises(ConfigError, match=field + r"avro applies to format: avro only \(this schema is json\)"):
        load_config(write(tmp_path, clicks, format="json"))
    with pytest.raises(ConfigError, match=r"field 'schema\.avro': schema_id is only read with wire: confluent"):
        load_config(write(tmp_path, clicks, {"wire": "plain"}))


def test_field_problems_follow_unions_named_types_and_logical_types():
    assert field_problems(SCHEMA, FIELDS, "id") == []
    wrong = {**FIELDS, "day": "timestamp", "raw": "string", "b": "long", "ts": "long"}
    problems = field_problems(SCHEMA, wrong, "id")
    assert len(problems) == 4
    assert any("field 'day' is timestamp but the Avro schema gives it date" in p for p in problems), problems
    assert "'id' is string but the Avro schema gives it bytes" in field_problems(
        {**SCHEMA, "fields": [{"name": "id", "type": "bytes"}]}, {"id": "string"}, "id")[0]


def test_produce_writes_avro_for_an_avro_pipeline_and_each_bad_kind_gets_its_dead_letter(tmp_path):
    cfg = load_config(ROOT / "config" / "pipelines.avro.yaml")
    for p in cfg.pipelines:
        msgs = list(generate(p, 1500, seed=3, malformed_ratio=0.2))
        assert msgs == list(generate(p, 1500, seed=3, malformed_ratio=0.2))
        assert {m.kind for m in msgs} == {"valid", *avro_bad_kinds(p)}
        types = {"event_id": pa.string(), "customer": pa.string(), "amount": pa.float64(), "quantity": pa.int64(),
                 "status": pa.string(), "event_time": pa.timestamp("us", tz="UTC")}
        decoder = AvroBatchDecoder(payload_of(p.payload_schema), fields=dict(p.payload_schema.fields),
                                   id_field="event_id", required=list(p.payload_schema.required),
                                   max_bytes=p.max_message_bytes, types=types)
        cols = decoder.columns([m.value for m in msgs])
        got = Counter(zip([m.kind for m in msgs], cols["_dd_error_type"].to_pylist(), strict=True))
        assert got == Counter((m.kind, None if m.kind == "valid" else avro_error_type(p, m.kind)) for m in msgs)
        valid = [i for i, m in enumerate(msgs) if m.kind == "valid"]
        assert [cols["_dd_message_id"][i].as_py() for i in valid] == [msgs[i].key for i in valid]


def test_the_column_wise_path_gives_the_per_message_verdicts_row_for_row():
    schema = {"type": "record", "name": "R", "fields": [
        {"name": "id", "type": ["null", "string"]}, {"name": "n", "type": "long"}, {"name": "i", "type": "int"},
        {"name": "d", "type": ["null", "double"]}, {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["X"]}},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}}, {"name": "raw", "type": "bytes"}]}
    fields = {"id": "string", "n": "long", "i": "int", "d": "double", "e": "string", "ts": "timestamp", "day": "date",
              "raw": "binary"}
    types = {"id": pa.string(), "n": pa.int64(), "i": pa.int32(), "d": pa.float64(), "e": pa.string(),
             "ts": pa.timestamp("us", tz="UTC"), "day": pa.date32(), "raw": pa.binary()}

    def row(k, **changes):
        return {"id": f"m-{k}", "n": k * 10**12, "i": k, "d": k / 7, "e": "X",
                "ts": datetime(2026, 5, 1, tzinfo=UTC).replace(microsecond=k * 1000 % 1_000_000),
                "day": date(2026, 5, 1 + k % 28), "raw": bytes([k % 256]), **changes}

    p = AvroPayload(json.dumps(schema), "confluent", 3)
    good = [encode(row(k), schema, wire="confluent", schema_id=3) for k in range(60)]
    odd = [encode(row(60, id=None), schema, wire="confluent", schema_id=3),  # falls back, or dead without a fallback
           encode(row(61, id="  "), schema, wire="confluent", schema_id=3),  # a blank id
           encode(row(62, d=None), schema, wire="confluent", schema_id=3),  # required null
           encode(row(63, d=math.inf), schema, wire="confluent", schema_id=3),
           encode(row(64), schema, wire="confluent", schema_id=4), b"", None,
           encode(row(65), schema, wire="confluent", schema_id=3)[:-1],
           encode(row(66), schema, wire="confluent", schema_id=3) + b"\x00"]
    common = {"fields": fields, "id_field": "id", "required": ["id", "n", "d"], "max_bytes": 4096, "types": types}
    fast = AvroBatchDecoder(p, **common)
    slow = AvroBatchDecoder(p, **common)
    slow.fast = False
    assert fast.fast
    for values in (good + odd, odd + good, good):
        for extra in ({}, {"fallback_ids": [f"t-0-{k}" for k in range(len(values))]},
                      {"message_ids": ["key-1" if k == 3 else None for k in range(len(values))]}):
            a, b = fast.columns(values, **extra), slow.columns(values, **extra)
            assert a.keys() == b.keys()
            for name in a:
                assert a[name].equals(b[name]), (name, a[name], b[name])
    # An int column Arrow refuses sends the chunk message by message: the same verdicts.
    wide = [encode(row(k, i=2**31 if k == 5 else k), schema, wire="confluent", schema_id=3) for k in range(10)]
    a, b = fast.columns(wide), slow.columns(wide)
    assert all(a[name].equals(b[name]) for name in a)
    assert a["_dd_error"][5].as_py() == "field 'i' should be int, got 2147483648"
    # Schemas whose fields Arrow would convert otherwise decode message by message.
    assert not AvroBatchDecoder(payload(), fields=FIELDS, id_field="id", required=REQUIRED, max_bytes=4096,
                                types={}).fast
