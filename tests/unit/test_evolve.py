"""Schema evolution's decisions (deltadrain.schema.evolution): what a new field's values make of a column, what fits a
column the table has, which names cannot be columns, which declared type changes widen; and the JSON
decoders that apply them, column-wise and message by message alike."""

import json
import random
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest
import yaml

from deltadrain.config import parse_config
from deltadrain.errors import ConfigError
from deltadrain.formats.decode import CONVERTERS, EXTRA_COLUMNS, BatchDecoder, decode
from deltadrain.observe.status import schema_changes
from deltadrain.schema.evolution import (
    EvolutionError,
    Seen,
    avro_writer,
    choose_types,
    fit,
    json_kind,
    json_text,
    misfits,
    name_problem,
    plan_layout,
    refusal,
    table_type,
)
from tests.support.decode_cases import FIELDS, MAX, REQUIRED, TRICKY, TYPES, enc, good


def convert(kind, value):
    return CONVERTERS[kind](value)


def test_a_json_values_kind_types_its_new_column():
    assert [json_kind(v) for v in (True, 3, -(2**63), 2**63, Decimal("1.5"), "x", {"a": 1}, [1], None)] == [
        "boolean", "long", "long", "double", "double", "string", "object", "object", None]
    with pytest.raises(ValueError, match="not a finite number"):
        json_kind(float("nan"))
    with pytest.raises(ValueError):
        json_kind(10**400)
    # Objects and arrays are kept as their JSON text, numbers exactly as the message wrote them.
    assert json_text({"b": [Decimal("1.10"), True, None, "é"]}) == '{"b":[1.10,true,null,"é"]}'


def test_what_fits_a_column_the_table_has_and_the_reason_when_it_does_not():
    assert fit("double", 7, convert) == 7.0 and isinstance(fit("double", 7, convert), float)  # widened
    assert fit("string", {"a": [1, Decimal("2.50")]}, convert) == '{"a":[1,2.50]}'
    assert fit("long", 5, convert) == 5 and fit("boolean", False, convert) is False
    for column, value in (("long", "abc"), ("long", Decimal("1.5")), ("boolean", 1), ("string", 5), ("long", 2**63)):
        with pytest.raises(TypeError):
            fit(column, value, convert)
    assert refusal("coupon", "string", 5) == "field 'coupon' is a string column of the table, got a long (5)"
    assert refusal("n", "long", {"a": 1}) == "field 'n' is a long column of the table, got an object or array ({\"a\":1})"


def test_names_that_cannot_be_columns():
    taken = {"event_id", "customer"}
    assert name_problem("coupon", taken) is None and name_problem("a:b.c", taken) is None
    for name in ("", " ", "a b", "a,b", "x=y", "t\tab", "back`tick", "paren(s)"):
        assert "cannot be a column" in name_problem(name, taken), name
    assert "deltadrain's own" in name_problem("_dd_batch", taken) and "deltadrain's own" in name_problem("_DD_x", taken)
    assert "case" in name_problem("Customer", taken)


def test_a_new_fields_type_is_its_majority_then_its_first_seen_kind():
    chosen, refused = choose_types({
        "score": {"long": Seen(5, ("0", 3, 0)), "double": Seen(1, ("0", 9, 0))},  # longs fit a double column
        "flag": {"boolean": Seen(3, ("0", 5, 0)), "string": Seen(1, ("0", 1, 0))},
        "tie": {"string": Seen(2, ("1", 0, 0)), "long": Seen(2, ("0", 7, 0))},  # first seen: partition 0
        "tags": {"object": Seen(4, ("0", 1, 0))},
    })
    assert chosen == {"score": "double", "flag": "boolean", "tie": "long", "tags": "string"} and refused == {}
    assert misfits({"score": "long", "flag": "boolean", "tags": "object"}, chosen) is None
    assert misfits({"flag": "string", "tie": "long"}, chosen) == (
        "new field 'flag' is boolean in this batch (most of its values are), this message has a string")
    assert "an object or array" in misfits({"tie": "object"}, chosen)


def test_two_new_names_differing_only_in_case_make_one_column():
    chosen, refused = choose_types({"Promo": {"string": Seen(1, ("0", 1, 0))},
                                    "promo": {"string": Seen(3, ("0", 2, 0))}})
    assert chosen == {"promo": "string"} and set(refused) == {"Promo"}
    assert "differ only in case" in misfits({"Promo": "string"}, chosen, refused)


def test_the_layout_widens_what_delta_can_and_names_what_it_cannot():
    declared = {"id": "string", "n": "long", "x": "double", "s": "string"}
    table = {"id": "string", "n": "int", "x": "float", "s": "string", "coupon": "string"}
    layout = plan_layout(declared, table)
    assert layout.widened == {"n": ("int", "long"), "x": ("float", "double")}
    assert layout.evolved == {"coupon": "string"} and layout.added == {}
    with pytest.raises(EvolutionError) as info:
        plan_layout({"id": "string", "n": "string", "x": "int"}, {"id": "string", "n": "long", "x": "long"})
    assert str(info.value).startswith("field 'n' is declared string but the table's column is long; field 'x' is "
                                      "declared int but the table's column is long")
    assert plan_layout(declared, None) == plan_layout(declared, {})  # no table yet: nothing to compare
    assert plan_layout({"id": "string", "n": "integer"}, {"id": "string", "n": "int"}).widened == {}
    with pytest.raises(EvolutionError, match="cannot fill: 'nested' \\(struct"):
        plan_layout({"id": "string"}, {"id": "string", "nested": "struct<a:int>"})
    assert table_type("integer") == "int"


def test_the_avro_layout_adds_the_writer_schemas_new_fields_and_widens_evolved_ones():
    layout = plan_layout({"id": "string"}, {"id": "string", "score": "int"},
                         avro_writer({"id": {"string"}, "score": {"long"}, "coupon": {"null", "string"},
                                      "n": {"int", "long"}, "when": {"timestamp"}, "deep": {"record"}, "_dd_x": {"int"},
                                      "ID": {"string"}}))
    assert layout.added == {"coupon": "string", "n": "long", "when": "timestamp"}
    assert layout.evolved == {"score": "long"} and layout.widened == {"score": ("int", "long")}
    assert set(layout.skipped) == {"deep", "_dd_x"}  # ID is the declared id in another case: not new
    assert layout.skipped["deep"] == "Avro field 'deep' is record, which no column type deltadrain writes holds"
    assert layout.columns == {"score": "long", "coupon": "string", "n": "long", "when": "timestamp"}


def evolving(evolved=frozenset(), fields=None) -> BatchDecoder:
    fields = fields or FIELDS
    return BatchDecoder(fields=fields, id_field="event_id", required=REQUIRED, max_bytes=MAX,
                        types={n: TYPES.get(n) or {"double": pa.float64()}.get(t, pa.string()) for n, t in fields.items()},
                        evolved=evolved, collect_new=True)


def test_decode_keeps_new_fields_and_refuses_names_that_cannot_be_columns():
    def dec(body: dict, fields=FIELDS, evolved=frozenset()):
        return decode(enc(body), fields=fields, id_field="event_id", required=REQUIRED, max_bytes=MAX,
                      evolved=evolved, collect_new=True)

    got = dec(good(1, coupon="A", tags=[1, {"b": 2}], gone=None))
    assert got.values[-2:] == ('{"note":"x","coupon":"A","tags":[1,{"b":2}]}',
                               '{"coupon": "string", "note": "string", "tags": "object"}')
    assert dec(good(2, note=None)).values[-2:] == (None, None)  # a null adds nothing
    assert dec(good(3, _dd_batch=1)).error == (
        "field '_dd_batch' cannot be a column: names starting with _dd_ are deltadrain's own columns")
    assert dec(good(4, Customer="x")).error_type == "schema"
    assert dec(good(5, bad=float("inf"))).error == "new field 'bad' holds inf is not a finite number, which no column holds"
    # An evolved column types its field: an integer widens into a double one, a string refuses a long one.
    fields = {**FIELDS, "coupon": "string", "score": "double", "n": "long"}
    evolved = frozenset({"coupon", "score", "n"})
    assert dec(good(6, coupon={"a": 1}, score=7, n=3), fields, evolved).values[-5:-2] == ('{"a":1}', 7.0, 3)
    assert dec(good(7, n="3"), fields, evolved).error == "field 'n' is a long column of the table, got a string (\"3\")"
    # Without add_columns a field no column holds is ignored, as before.
    plain = decode(enc(good(8, coupon="A")), fields=FIELDS, id_field="event_id", required=REQUIRED, max_bytes=MAX)
    assert len(plain.values) == len(FIELDS)


def test_the_column_wise_decoder_collects_new_fields_as_decode_does():
    fields = {**FIELDS, "coupon": "string", "score": "double"}
    evolved = frozenset({"coupon", "score"})
    extra = [enc(good(i, coupon=f"c{i}", score=i)) for i in range(50)] + [
        enc(good(60, fresh=1)), enc(good(61, fresh={"a": 1})), enc(good(62, coupon=5)), enc(good(63, _dd_x=1)),
        enc(good(64, fresh=None)), enc(good(65, coupon={"o": 1})), enc(good(66, score="1"))]
    values = [enc(good(i)) for i in range(100, 400)] + TRICKY + extra
    random.Random(7).shuffle(values)
    d = evolving(evolved, fields)
    assert d.fast
    out = d.columns(values)
    names = ["_dd_message_id", "_dd_error_type", "_dd_error", "_dd_original", *fields, *EXTRA_COLUMNS]
    for i, value in enumerate(values):
        got = decode(value, fields=fields, id_field="event_id", required=REQUIRED, max_bytes=MAX, evolved=evolved,
                     collect_new=True)
        row = tuple(out[n][i].as_py() for n in names)
        if got.values is None:
            assert row[1:4] == (got.error_type, got.error, value), (i, value)
        else:
            new = got.values[-1] is not None
            assert row == (got.message_id, None, None, value if new else None, *got.values), (i, value)
    # The note every `good` payload carries is a new field too: those rows went message by message.
    assert sum(v is not None for v in out["_dd_extra"].to_pylist()) > 300


def test_status_names_the_commits_that_changed_the_schema():
    at = datetime(2026, 5, 1, tzinfo=UTC)
    commits = [
        {"version": 7, "timestamp": at, "meta": {"deltadrain": 1, "pipeline": "p", "batch": 5}},
        {"version": 6, "timestamp": at, "meta": {"deltadrain": 1, "pipeline": "p", "batch": 4,
                                                 "widened_columns": {"n": "int -> long"}}},
        {"version": 3, "timestamp": at, "meta": {"deltadrain": 1, "pipeline": "p", "batch": 2,
                                                 "added_columns": {"coupon": "string"}}},
        {"version": 2, "timestamp": at, "meta": {"deltadrain": 1, "pipeline": "q", "batch": 1,
                                                 "added_columns": {"x": "long"}}},
        {"version": 1, "timestamp": at, "meta": None}]
    assert schema_changes(commits, "p") == [
        {"batch": 2, "table_version": 3, "at": at, "added_columns": {"coupon": "string"}, "widened_columns": {}},
        {"batch": 4, "table_version": 6, "at": at, "added_columns": {}, "widened_columns": {"n": "int -> long"}}]


def test_add_columns_is_refused_with_a_transform_and_taken_with_protobuf_and_with_a_registry_alone():
    root = Path(__file__).resolve().parents[2]
    data = yaml.safe_load((root / "config" / "pipelines.yaml").read_text())
    pipe = data["pipelines"][0]
    pipe["schema"]["evolution"] = "add_columns"
    with pytest.raises(ConfigError, match="field 'schema.evolution'|cannot go with a transform"):
        parse_config(data, Path("pipes.yaml"))
    pipe.pop("transform")
    assert parse_config(data, Path("pipes.yaml")).pipelines[0].payload_schema.collects_new_fields
    # Protobuf with its descriptor file: the file's new fields are planned before the read (no collecting).
    pipe["schema"].update(format="protobuf", protobuf={
        "descriptor_file": str(root / "config" / "schemas" / "clicks.desc"), "message": "dev.deltadrain.sample.Click"},
                          fields={"event_id": "string", "customer": "string"}, required=["event_id"])
    schema = parse_config(data, Path("pipes.yaml")).pipelines[0].payload_schema
    assert schema.evolution == "add_columns" and not schema.collects_new_fields
    # A registry and add_columns, nothing else: the batch's writers' schemas give the new columns.
    for fmt in ("avro", "protobuf"):
        pipe["schema"] = {"id_field": "event_id", "fields": {"event_id": "string"}, "format": fmt,
                          fmt: {"wire": "confluent"}, "registry": {"url": "http://127.0.0.1:8081"},
                          "evolution": "add_columns"}
        assert parse_config(data, Path("pipes.yaml")).pipelines[0].payload_schema.collects_new_fields, fmt
    assert json.loads(json.dumps(pipe))  # the YAML stays plain data


def test_a_backfill_collects_no_writers_new_fields_and_a_json_one_still_does(tmp_path):
    from deltadrain.run.layout import run_layout

    root = Path(__file__).resolve().parents[2]
    data = yaml.safe_load((root / "config" / "pipelines.yaml").read_text())
    pipe = data["pipelines"][0]
    pipe.pop("transform")
    pipe["schema"]["evolution"] = "add_columns"
    json_pipeline = parse_config(data, Path("pipes.yaml")).pipelines[0]
    pipe["schema"] = {"id_field": "event_id", "fields": {"event_id": "string"}, "format": "avro",
                      "avro": {"wire": "confluent"}, "registry": {"url": "http://127.0.0.1:8081"},
                      "evolution": "add_columns"}
    registry_pipeline = parse_config(data, Path("pipes.yaml")).pipelines[0]
    no_table = str(tmp_path / "none")
    for pipeline, backfill_collects in ((json_pipeline, True), (registry_pipeline, False)):
        assert run_layout(pipeline, no_table)[0].payload_schema.collects_new_fields
        assert run_layout(pipeline, no_table, adding=False)[0].payload_schema.collects_new_fields is backfill_collects


def test_a_writer_schemas_fields_become_columns_widen_evolved_ones_or_are_left_out():
    from deltadrain.schema.evolution import LEFT_OUT, protobuf_writer, writer_columns

    fields = {"id": "string", "customer": "string", "score": "int", "ratio": "float", "note": "string"}
    evolved = frozenset({"score", "ratio", "note"})
    avro = writer_columns(avro_writer({
        "id": {"string"}, "customer": {"long"},  # declared: its column decides, as without evolution
        "score": {"null", "long"}, "ratio": {"float"}, "note": {"string"},  # evolved: only a wider type widens
        "coupon": {"null", "string"}, "n": {"int", "long"}, "when": {"timestamp"}, "raw": {"fixed"},
        "tags": {"array"}, "mixed": {"null", "string", "long"}, "_dd_x": {"int"}, "Note": {"string"},
        "CUSTOMER": {"string"}}), fields, evolved)
    assert avro.adds == {"score": "long", "coupon": "string", "n": "long", "when": "timestamp", "raw": "binary"}
    assert set(avro.left_out) == {"tags", "mixed", "_dd_x", "Note"}  # CUSTOMER is the declared field, not new
    assert avro.left_out["mixed"] == ("Avro field 'mixed' is long or string, which no column type deltadrain "
                                      "writes holds")
    assert "case" in avro.left_out["Note"]
    kinds = json.loads(avro.signature)
    assert kinds["coupon"] == "string" and kinds["tags"].startswith(LEFT_OUT)
    proto = writer_columns(protobuf_writer({
        "id": "string", "a": "int32", "b": "uint32", "c": "int64", "d": "uint64", "e": "float", "f": "double",
        "g": "bool", "h": "enum", "i": "bytes", "j": "timestamp", "k": "repeated", "l": "message x.Y",
        "ratio": "double"}), fields, evolved)
    assert proto.adds == {"a": "int", "b": "long", "c": "long", "d": "long", "e": "float", "f": "double",
                          "g": "boolean", "h": "string", "i": "binary", "j": "timestamp", "ratio": "double"}
    assert proto.left_out == {
        "k": "Protobuf field 'k' is repeated, which no column type deltadrain writes holds",
        "l": "Protobuf field 'l' is message x.Y, which no column type deltadrain writes holds"}
    # A writer that adds nothing carries no signature: its messages are decoded as without evolution.
    same = writer_columns(avro_writer({"id": {"string"}, "score": {"int"}, "tags": {"array"}}), fields, evolved)
    assert same.adds == {} and same.signature is None


def test_a_writers_values_travel_as_json_typed_by_its_schema():
    from deltadrain.formats.avro import convert as avro_convert
    from deltadrain.schema.evolution import WriterColumns, writer_extras

    columns = WriterColumns({"score": "long", "when": "timestamp", "day": "date", "raw": "binary", "ratio": "double",
                             "gone": "string"}, {"tags": "Avro field 'tags' is array, ..."})
    record = {"id": "a", "score": 5, "when": datetime(2026, 5, 1, 0, 0, 0, 123456, tzinfo=UTC),
              "day": datetime(2026, 5, 2).date(), "raw": b"\x00\xff", "ratio": 0.5, "gone": None, "tags": [1]}
    values, kinds, problem = writer_extras(record, columns, avro_convert)
    assert problem is None and kinds == columns.signature
    assert json.loads(values) == {"score": 5, "when": 1777593600123456, "day": "2026-05-02", "raw": "AP8=", "ratio": 0.5}
    assert record == {"id": "a", "tags": [1]}  # taken out: a widened evolved field is not typed twice
    assert writer_extras({"ratio": float("nan")}, columns, avro_convert)[2] == (
        "new field 'ratio' is double in its writer's schema, and nan is no double value a column holds")
    assert writer_extras({"id": "a"}, WriterColumns(), avro_convert) == (None, None, None)


def test_an_avro_decimal_with_its_digits_makes_the_narrowest_decimal_column_that_holds_it_exactly():
    from deltadrain.formats.avro import convert as avro_convert
    from deltadrain.schema.evolution import WriterColumns, decimal_column, writer_extras

    assert [decimal_column(k) for k in ("decimal(12,2)", "decimal(18,2)", "decimal(1,0)", "decimal(10,3)",
                                        "decimal(38,9)", "decimal(19,2)", "decimal(30,0)", "decimal(20,10)",
                                        "decimal", "long")] == [
        "decimal(18,2)", "decimal(18,2)", "decimal(18,2)", "decimal(38,9)", "decimal(38,9)", "decimal(38,9)",
        None, None, None, None]
    writer = avro_writer({"paid": {"null", "decimal(10,3)"}, "huge": {"decimal(40,0)"}, "plain": {"decimal"}})
    assert writer == {"paid": ("decimal(38,9)", "Avro field 'paid' is decimal(10,3)"),
                      "huge": (None, "Avro field 'huge' is decimal(40,0)"), "plain": (None, "Avro field 'plain' is decimal")}
    # Carried as its exact text, which the column's cast reads back without rounding.
    values, _, problem = writer_extras({"paid": Decimal("-12.345"), "zero": Decimal("0")},
                                       WriterColumns({"paid": "decimal(38,9)", "zero": "decimal(18,2)"}), avro_convert)
    assert problem is None and json.loads(values) == {"paid": "-12.345000000", "zero": "0.00"}
    assert writer_extras({"paid": Decimal("1.0005")}, WriterColumns({"paid": "decimal(18,2)"}), avro_convert)[2] == (
        "new field 'paid' is decimal(18,2) in its writer's schema, and 1.0005 is no decimal(18,2) value a column holds")


def test_a_new_fields_type_follows_its_writers_widening_pairs_then_their_majority():
    from deltadrain.schema.evolution import choose_writer_types, fits_writer, writer_misfits

    chosen, refused = choose_writer_types({
        "n": {"int": Seen(5, ("0", 1, 0)), "long": Seen(1, ("0", 9, 0))},  # one family: the wider
        "x": {"float": Seen(2, ("0", 2, 0)), "double": Seen(2, ("0", 3, 0))},
        "s": {"string": Seen(3, ("0", 4, 0)), "int": Seen(2, ("0", 1, 0)), "long": Seen(2, ("0", 5, 0))},  # 4 ints
        "t": {"string": Seen(2, ("0", 1, 0)), "boolean": Seen(2, ("0", 0, 0))},  # a tie: the first seen
        "Promo": {"string": Seen(1, ("0", 8, 0))}, "promo": {"string": Seen(2, ("0", 7, 0))},
    })
    assert chosen == {"n": "long", "x": "double", "s": "long", "t": "boolean", "promo": "string"}
    assert set(refused) == {"Promo"}
    assert fits_writer("int", "long") and fits_writer("float", "double") and not fits_writer("long", "int")
    assert not fits_writer("int", "double") and not fits_writer("string", "binary")
    assert writer_misfits({"n": "int", "x": "float", "s": "int", "tags": "-left out"}, chosen) is None
    assert writer_misfits({"s": "string", "t": "string"}, chosen) == (
        "new field 's' is long in this batch (the writer schemas of most of its messages say so), this message's "
        "writer schema gives it string; new field 't' is boolean in this batch (the writer schemas of most of its "
        "messages say so), this message's writer schema gives it string")
    assert "differ only in case" in writer_misfits({"Promo": "string"}, chosen, refused)


def test_the_protobuf_layout_adds_the_descriptors_new_scalars_and_widens_evolved_ones():
    from deltadrain.schema.evolution import protobuf_writer

    layout = plan_layout({"id": "string"}, {"id": "string", "qty": "int"},
                         protobuf_writer({"id": "string", "qty": "int64", "seen": "timestamp", "code": "enum",
                                          "tags": "repeated", "n": "int32"}))
    assert layout.added == {"seen": "timestamp", "code": "string", "n": "int"}
    assert layout.widened == {"qty": ("int", "long")} and set(layout.skipped) == {"tags"}
