"""Protobuf payloads: the descriptor set and its config checks, the per-message decode and its dead
letters, the Confluent frame with its message indexes, and that a Protobuf batch decodes into exactly
the columns the JSON path gives for the same records."""

from __future__ import annotations

import json
import math
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest
import yaml
from google.protobuf import descriptor_pb2, timestamp_pb2

from deltadrain.config import load_config
from deltadrain.dev.produce import PROTOBUF_MALFORMED, generate, protobuf_error_type
from deltadrain.errors import ConfigError
from deltadrain.formats.decode import BatchDecoder
from deltadrain.formats.payloads import payload_of
from deltadrain.formats.protobuf import (
    ProtobufPayload,
    decode_protobuf,
    encode,
    field_problems,
    load_descriptor,
    read_indexes,
    write_indexes,
)

ROOT = Path(__file__).resolve().parents[2]
F = descriptor_pb2.FieldDescriptorProto
SCALARS = {"id": F.TYPE_STRING, "i32": F.TYPE_INT32, "i64": F.TYPE_INT64, "u32": F.TYPE_UINT32,
           "u64": F.TYPE_UINT64, "s32": F.TYPE_SINT32, "s64": F.TYPE_SINT64, "f32": F.TYPE_FIXED32,
           "f64": F.TYPE_FIXED64, "sf64": F.TYPE_SFIXED64, "d": F.TYPE_DOUBLE, "fl": F.TYPE_FLOAT,
           "b": F.TYPE_BOOL, "s": F.TYPE_STRING, "raw": F.TYPE_BYTES}
FIELDS = {"id": "string", "i32": "int", "i64": "long", "u32": "long", "u64": "long", "s32": "int", "s64": "long",
          "f32": "long", "f64": "long", "sf64": "long", "d": "double", "fl": "float", "b": "boolean",
          "s": "string", "raw": "binary", "e": "string", "ts": "timestamp", "ms": "timestamp", "opt": "long"}


def descriptor_set(with_timestamp_file: bool = True) -> bytes:
    """A file of two messages (the second, Row, is the one read) built with the protobuf API."""
    f = descriptor_pb2.FileDescriptorProto(name="t/row.proto", package="t", syntax="proto3",
                                           dependency=["google/protobuf/timestamp.proto"])
    f.message_type.add(name="Other").field.add(name="x", number=1, type=F.TYPE_INT32, label=F.LABEL_OPTIONAL)
    row = f.message_type.add(name="Row")
    for n, (name, t) in enumerate(SCALARS.items(), 1):
        row.field.add(name=name, number=n, type=t, label=F.LABEL_OPTIONAL)
    row.field.add(name="e", number=20, type=F.TYPE_ENUM, type_name=".t.Kind", label=F.LABEL_OPTIONAL)
    row.field.add(name="ts", number=21, type=F.TYPE_MESSAGE, type_name=".google.protobuf.Timestamp",
                  label=F.LABEL_OPTIONAL)
    row.field.add(name="ms", number=22, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    row.field.add(name="opt", number=23, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL, proto3_optional=True,
                  oneof_index=0)
    row.field.add(name="many", number=24, type=F.TYPE_INT64, label=F.LABEL_REPEATED)
    row.oneof_decl.add(name="_opt")
    row.nested_type.add(name="Inner").field.add(name="y", number=1, type=F.TYPE_INT32, label=F.LABEL_OPTIONAL)
    kind = f.enum_type.add(name="Kind")
    kind.value.add(name="KIND_UNSPECIFIED", number=0)
    kind.value.add(name="A", number=1)
    kind.value.add(name="B", number=2)
    files = []
    if with_timestamp_file:
        files.append(descriptor_pb2.FileDescriptorProto())
        timestamp_pb2.DESCRIPTOR.CopyToProto(files[0])
    return descriptor_pb2.FileDescriptorSet(file=[*files, f]).SerializeToString()


def payload(wire="plain", schema_id=None, message="t.Row"):
    return ProtobufPayload(descriptor_set(), message, wire, schema_id)


def record(**changes):
    base = {"id": "m-1", "i32": -5, "i64": 2**40, "u32": 2**32 - 1, "u64": 2**63 - 1, "s32": -7, "s64": -(2**50),
            "f32": 9, "f64": 10, "sf64": -11, "d": 1.25, "fl": 0.5, "b": True, "s": "hé", "raw": b"\x00\xff",
            "e": "B", "ts": datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC), "ms": 1_700_000_000_000, "opt": 0}
    return {**base, **changes}


def decode(data, p=None, required=("id", "d"), fields=FIELDS):
    return decode_protobuf(data, p or payload(), fields=fields, id_field="id", required=list(required),
                           max_bytes=4096)


def test_every_protobuf_scalar_enum_and_timestamp_maps_to_its_declared_column_type():
    d = decode(encode(record(), payload()))
    assert d.error is None, d
    got = dict(zip(FIELDS, d.values, strict=True))
    assert got == {**record(), "ms": datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)}
    # Presence: an unset proto3 optional or Timestamp is null; an unset plain scalar is its default.
    d = decode(encode(record(opt=None, ts=None, s=None, i32=None), payload()))
    got = dict(zip(FIELDS, d.values, strict=True))
    assert (got["opt"], got["ts"], got["s"], got["i32"]) == (None, None, "", 0)
    assert decode(encode(record(ts=None), payload()), required=("id", "ts")) == (
        None, "m-1", "schema", "required field 'ts' is not set")
    # An integer id is merged on its text, as in JSON; an empty string id is no id.
    ids = {"id": "string", "i64": "long"}
    assert decode(encode(record(), payload()), fields={"i64": "string", "id": "string"}) is not None
    assert decode(encode(record(id=""), payload()), fields=ids)[2:] == ("missing_id", "message id field 'id' is empty")


@pytest.mark.parametrize("changes, reason", [
    ({"i64": 2**40}, "field 'i64' should be int, got 1099511627776"),
    ({"u64": 2**64 - 1}, "field 'u64' should be long, got 18446744073709551615"),
    ({"d": math.nan}, "field 'd' should be double, got NaN"),
    ({"fl": math.inf}, "field 'fl' should be float, got Infinity"),
])
def test_a_value_the_declared_type_cannot_hold_is_a_schema_dead_letter(changes, reason):
    fields = {**FIELDS, "i64": "int"} if "i64" in changes else FIELDS
    d = decode(encode(record(**changes), payload()), fields=fields)
    assert (d.error_type, d.message_id, d.error) == ("schema", "m-1", reason)


def test_bad_bodies_are_dead_letters_with_their_reason():
    good = encode(record(), payload())
    assert decode(b"")[2:] == ("empty", "empty payload")
    assert decode(good[:-1])[2] == "truncated" and "ends inside a field of t.Row" in decode(good[:-1])[3]
    assert decode(b"\x0a\x05ab")[2] == "truncated"  # a string of 5 bytes with 2 left
    not_proto = decode(json.dumps({"id": "m-1"}).encode())
    assert not_proto[2] == "invalid_protobuf" and "is not a t.Row" in not_proto[3]
    assert decode(b"\x0a\x02\xff\xfe")[2] == "invalid_protobuf"  # a string field that is not UTF-8
    unnamed = encode(record(), payload()) + b"\xa0\x01\x07"  # e = 7: an open enum's value without a name
    assert decode(unnamed)[2:] == ("schema", "field 'e': enum value 7 has no name in t.Kind")
    assert decode(b"x" * 5000)[2] == "oversized"


def test_the_confluent_frame_needs_the_magic_byte_the_schema_id_and_the_message_indexes():
    p = payload("confluent", 7)
    framed = encode(record(), p)
    assert framed[:7] == b"\x00\x00\x00\x00\x07" + write_indexes([1]) and write_indexes([1]) == b"\x02\x02"
    assert decode(framed, p).values == decode(encode(record(), payload()))[0]
    assert decode(b"\x01" + framed[1:], p)[2:] == (
        "wrong_magic_byte", "payload starts with byte 0x01, not the Confluent wire format's magic byte 0x00")
    assert decode(encode(record(), p, schema_id=8), p)[2:] == (
        "unknown_schema_id", "unknown schema id 8 (this pipeline reads schema id 7)")
    assert decode(framed[:4], p)[2] == "truncated"
    assert decode(framed[:6], p)[2:] == ("truncated", "payload of 6 bytes ends inside the Confluent message indexes")
    other = framed[:5] + write_indexes([0]) + framed[7:]
    assert decode(other, p)[2:] == ("unknown_message_index",
                                    "message indexes [0] name another message than t.Row (indexes [1])")
    # The first message of a file takes the single-0 shortcut; a nested one its full path.
    assert encode({"x": 3}, payload("confluent", 7, "t.Other"))[5:6] == b"\x00"
    assert payload("confluent", 7, "t.Row.Inner").indexes() == [1, 0]
    assert read_indexes(write_indexes([1, 0]), 0) == ([1, 0], 3) and read_indexes(b"\x00", 0) == ([0], 1)


def test_a_protobuf_batch_gives_the_json_paths_columns_for_the_same_records():
    fields = {"id": "string", "i64": "long", "d": "double", "b": "boolean", "s": "string", "ts": "timestamp"}
    types = {"id": pa.string(), "i64": pa.int64(), "d": pa.float64(), "b": pa.bool_(), "s": pa.string(),
             "ts": pa.timestamp("us", tz="UTC")}
    rows = [{"id": f"m-{i}", "i64": i * 1000, "d": i / 3, "b": i % 2 == 0, "s": f"s{i}",
             "ts": datetime(2026, 1, 1, tzinfo=UTC).replace(microsecond=i)} for i in range(300)]
    rows[7]["d"] = math.nan
    as_json = [json.dumps({**r, "ts": r["ts"].isoformat().replace("+00:00", "Z"),
                           "d": r["d"] if math.isfinite(r["d"]) else "NaN"}).encode() for r in rows]
    p = payload()
    as_proto = [encode(r, p) for r in rows]
    common = {"fields": fields, "id_field": "id", "required": ["id", "i64"], "max_bytes": 4096, "types": types}
    json_cols = BatchDecoder(**common).columns(as_json)
    proto_cols = p.decoder(**common).columns(as_proto)
    for name in ["_dd_message_id", "_dd_error_type", *fields]:
        assert proto_cols[name].equals(json_cols[name]), name
    assert proto_cols["_dd_error_type"].to_pylist().count("schema") == 1
    assert proto_cols["_dd_original"][7].as_py() == as_proto[7]


def test_field_problems_and_a_descriptor_set_without_its_imports(tmp_path):
    (tmp_path / "s.desc").write_bytes(descriptor_set(with_timestamp_file=False))
    _, desc = load_descriptor(tmp_path / "s.desc", "t.Row")  # the well-known Timestamp from the package
    assert field_problems(desc, FIELDS, "id") == []
    problems = field_problems(desc, {**FIELDS, "b": "long", "many": "long", "ts": "date", "gone": "string"}, "id")
    assert problems == [
        "field 'b' is long but message t.Row gives it bool (a long column takes int32, int64, uint32, uint64)",
        "field 'ts' is date but message t.Row gives it timestamp (a date column takes string)",
        "field 'many' is long but message t.Row gives it repeated (a long column takes int32, int64, uint32, uint64)",
        "field 'gone' is not in message t.Row (its fields: " + ", ".join([*SCALARS, "e", "ts", "ms", "opt", "many"])
        + ")"]


def test_the_checked_in_descriptor_set_is_the_one_protoc_makes_of_the_proto(tmp_path):
    from grpc_tools import protoc

    schemas = ROOT / "config" / "schemas"
    assert protoc.main(["protoc", f"-I{schemas}", f"-I{Path(protoc.__file__).parent / '_proto'}",
                        "--include_imports", f"--descriptor_set_out={tmp_path / 'c.desc'}", "clicks.proto"]) == 0
    assert (tmp_path / "c.desc").read_bytes() == (schemas / "clicks.desc").read_bytes(), "run make proto"


def write(tmp_path, protobuf: dict | None = None, **schema_block) -> Path:
    data = yaml.safe_load((ROOT / "config" / "pipelines.protobuf.yaml").read_text())
    pipe = data["pipelines"][0]
    pipe["schema"]["protobuf"].update({"descriptor_file": "s.desc", **(protobuf or {})})
    pipe["schema"].update(schema_block)
    data["pipelines"] = [pipe]
    (tmp_path / "conf").mkdir(exist_ok=True)
    (tmp_path / "conf" / "s.desc").write_bytes((ROOT / "config" / "schemas" / "clicks.desc").read_bytes())
    (tmp_path / "conf" / "bad.desc").write_bytes(b"\xff\xff\xff")
    path = tmp_path / "conf" / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_the_descriptor_file_is_read_relative_to_the_config_and_checked_at_load(tmp_path):
    example = load_config(ROOT / "config" / "pipelines.protobuf.yaml")
    for p in example.pipelines:
        assert p.payload_schema.protobuf.descriptor_file == str(ROOT / "config" / "schemas" / "clicks.desc")
        assert payload_of(p.payload_schema).descriptor().full_name == "dev.deltadrain.sample.Click"
    assert load_config(write(tmp_path)).pipelines[0] \
        .payload_schema.protobuf.descriptor_file == str(tmp_path / "conf" / "s.desc")
    where = r"p.yaml: pipeline 'clicks_proto', field 'schema.protobuf.descriptor_file': "
    cases = [
        ({"descriptor_file": "gone.desc"}, {}, where + r".*conf/gone.desc not found"),
        ({"descriptor_file": "bad.desc"}, {}, where + r".*bad.desc is not a serialized FileDescriptorSet"),
        ({"message": "Click"}, {}, where + r"message 'Click' is not in .*its messages: "
                                           r"google.protobuf.Timestamp, dev.deltadrain.sample.Click"),
        ({}, {"fields": {"event_id": "string", "status": "long"}, "required": []},
         where + r"message dev.deltadrain.sample.Click cannot fill schema.fields: field 'status' is long but "
                 r"message dev.deltadrain.sample.Click gives it enum"),
    ]
    for protobuf, block, message in cases:
        with pytest.raises(ConfigError, match=message):
            load_config(write(tmp_path, protobuf, **block))
    field = r"p.yaml: pipeline 'clicks_proto', field 'schema': "
    with pytest.raises(ConfigError, match=field + r"format protobuf needs protobuf\.descriptor_file"):
        load_config(write(tmp_path, {"message": None}))
    with pytest.raises(ConfigError, match=field + r"protobuf\.wire confluent needs protobuf\.schema_id"):
        load_config(write(tmp_path, {"schema_id": None}))
    with pytest.raises(ConfigError, match=field + r"avro applies to format: avro only \(this schema is protobuf\)"):
        load_config(write(tmp_path, avro={"schema_file": "x.avsc"}))
    with pytest.raises(ConfigError, match=field + r"protobuf applies to format: protobuf only \(this schema is json\)"):
        load_config(write(tmp_path, format="json"))


def test_produce_writes_protobuf_for_a_protobuf_pipeline_and_each_bad_kind_gets_its_dead_letter():
    cfg = load_config(ROOT / "config" / "pipelines.protobuf.yaml")
    types = {"event_id": pa.string(), "customer": pa.string(), "amount": pa.float64(), "quantity": pa.int64(),
             "status": pa.string(), "event_time": pa.timestamp("us", tz="UTC")}
    for p in cfg.pipelines:
        msgs = list(generate(p, 1500, seed=3, malformed_ratio=0.2))
        assert msgs == list(generate(p, 1500, seed=3, malformed_ratio=0.2))
        confluent = p.payload_schema.protobuf.wire == "confluent"
        assert {m.kind for m in msgs} == {"valid", *(k for k in PROTOBUF_MALFORMED if confluent or k not in (
            "wrong_magic_byte", "unknown_schema_id"))}
        decoder = payload_of(p.payload_schema).decoder(
            fields=dict(p.payload_schema.fields), id_field="event_id", required=list(p.payload_schema.required),
            max_bytes=p.max_message_bytes, types=types)
        cols = decoder.columns([m.value for m in msgs])
        got = Counter(zip([m.kind for m in msgs], cols["_dd_error_type"].to_pylist(), strict=True))
        assert got == Counter((m.kind, None if m.kind == "valid" else protobuf_error_type(p, m.kind)) for m in msgs)
        valid = [i for i, m in enumerate(msgs) if m.kind == "valid"]
        assert [cols["_dd_message_id"][i].as_py() for i in valid] == [msgs[i].key for i in valid]
        assert {cols["status"][i].as_py() for i in valid} == {"NEW", "PAID", "SHIPPED", "CANCELLED"}
