"""The config of upsert mode (`target.mode`, `target.key`, `order_by`, `delete_when`, `on_truncate`,
`schema.envelope`): what it accepts, and errors that name the file, the pipeline and the field."""

from pathlib import Path

import pytest

from deltadrain.config import parse_config
from deltadrain.errors import ConfigError

REGISTRY = {"url": "http://127.0.0.1:18081/apis/ccompat/v7", "connection_id": "deltadrain_registry"}


def config(target: dict | None = None, schema: dict | None = None, source: dict | None = None, **pipe) -> dict:
    return {"pipelines": [{
        "name": "people", "source": source or {"kind": "kafka", "topic": "people", "group": "g"},
        "target": {"path": "people", "mode": "upsert", "key": ["id"], **(target or {})},
        "schema": {"fields": {"id": "long", "name": "string", "version": "long", "gone": "boolean"},
                   **(schema or {})}, **pipe}]}


def error_of(data: dict) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(data, Path("conf/pipes.yaml"))
    return str(info.value)


def test_an_upsert_pipeline_needs_no_message_id_and_an_insert_one_keeps_its_defaults():
    p = parse_config(config({"order_by": "version", "delete_when": {"field": "gone", "equals": True}}),
                     Path("x.yaml")).pipelines[0]
    assert p.upsert and p.target.key == ["id"] and p.target.order_by == "version"
    assert p.target.delete_when is not None and p.target.delete_when.equals is True
    debezium = parse_config(config({"key": [], "order_by": "source.lsn", "on_truncate": "truncate"},
                                   {"envelope": "debezium"}), Path("x.yaml")).pipelines[0]
    assert debezium.target.key == [] and debezium.target.on_truncate == "truncate"
    insert = config({"mode": "insert", "key": []}, {"id_field": "name"})
    plain = parse_config(insert, Path("x.yaml")).pipelines[0]
    assert not plain.upsert and plain.target.order_by == "position" and plain.payload_schema.envelope == "none"


@pytest.mark.parametrize(("target", "schema", "pipe", "says"), [
    ({"key": []}, {}, {}, "target.key: upsert mode needs the payload columns"),
    ({"key": ["nope"]}, {}, {}, "target.key: ['nope'] are not fields"),
    ({"order_by": "nope"}, {}, {}, "target.order_by: 'nope' is neither position nor a field"),
    ({"order_by": "gone"}, {}, {}, "target.order_by: 'gone' is a boolean column"),
    ({"order_by": "source.lsn"}, {}, {}, "it needs schema.envelope: debezium"),
    ({"delete_when": {"field": "nope", "equals": 1}}, {}, {}, "target.delete_when.field: 'nope'"),
    ({"on_truncate": "truncate"}, {}, {}, "target.on_truncate: only Debezium change events"),
    ({}, {"id_field": "name"}, {}, "schema.id_field: an upsert target keeps one row per target.key"),
    ({}, {}, {"transform": "deltadrain.transforms.sample_orders"}, "transform: an upsert target"),
    ({"mode": "insert", "key": []}, {}, {}, "schema.id_field: required"),
    ({"mode": "insert", "key": ["id"]}, {"id_field": "name"}, {}, "target.key: applies to target.mode upsert only"),
    ({"mode": "insert", "key": []}, {"id_field": "name", "envelope": "debezium"}, {}, "are applied in target.mode upsert"),
    ({}, {"format": "avro", "avro": {"wire": "confluent"}, "registry": REGISTRY}, {},
     "schema.format: avro: an upsert target reads entity states as JSON"),
    ({}, {"envelope": "debezium", "format": "avro", "avro": {"schema_file": "x.avsc"}}, {},
     "field 'schema': envelope debezium with format avro reads each change with its writer's schema from the schema "
     "registry"),
    ({}, {"envelope": "debezium", "format": "protobuf", "protobuf": {"wire": "confluent"}, "registry": REGISTRY}, {},
     "field 'schema': envelope debezium reads JSON change events, or Avro ones through registry.url; Protobuf change "
     "events are not read"),
    ({}, {"envelope": "debezium", "format": "avro", "avro": {"wire": "confluent", "schema_id": 4},
          "registry": REGISTRY}, {}, "leave avro.schema_file and avro.schema_id out"),
    ({}, {"envelope": "debezium", "format": "avro", "avro": {"wire": "plain"}, "registry": REGISTRY}, {},
     "registry needs avro.wire: confluent"),
])
def test_errors_name_the_file_the_pipeline_and_the_field(target, schema, pipe, says):
    msg = error_of(config(target, schema, **pipe))
    assert msg.startswith("conf/pipes.yaml: pipeline 'people'") and says in msg


def test_debezium_change_events_in_avro_through_the_registry_are_accepted_and_read_with_its_login():
    from deltadrain.formats.changes import spec_of
    from deltadrain.formats.registry import Registry

    schema = {"envelope": "debezium", "format": "avro", "avro": {"wire": "confluent"}, "registry": REGISTRY}
    p = parse_config(config({"key": [], "order_by": "source.lsn"}, schema), Path("x.yaml")).pipelines[0]
    assert p.payload_schema.envelope == "debezium" and p.payload_schema.format == "avro"
    registry = Registry(REGISTRY["url"])
    spec = spec_of(p, type("Payload", (), {"registry": registry})())
    assert spec is not None and spec.registry is registry and spec.order_by == "source.lsn"
    assert spec_of(p) is not None and spec_of(p).registry is None  # JSON: no payload, no registry


def test_position_order_across_several_valkey_streams_is_refused_and_one_stream_or_a_column_is_fine():
    streams = {"kind": "valkey", "streams": ["people:a", "people:b"], "group": "g"}
    msg = error_of(config(source=streams))
    assert "target.order_by: position orders a key's events within one stream only" in msg
    assert parse_config(config({"order_by": "version"}, source=streams), Path("x.yaml")).pipelines[0].upsert
    one = {**streams, "streams": ["people:a"]}
    assert parse_config(config(source=one), Path("x.yaml")).pipelines[0].upsert
    debezium = error_of(config({"key": []}, {"envelope": "debezium"}, source=one))
    assert "schema.envelope: debezium reads Kafka records" in debezium


def test_the_default_quality_suite_of_an_upsert_target_checks_its_keys():
    from deltadrain.quality.checks import Check, build_checks

    p = parse_config(config(schema={"required": ["name"]}), Path("x.yaml")).pipelines[0]
    checks = build_checks(p)
    assert checks[:2] == [Check("not_null", "_dd_key"), Check("unique", "_dd_key")]
    names = [c.name for c in checks]
    assert {"id exists", "id is long", "id not null", "name exists", "name is string", "name not null"} <= set(names)
