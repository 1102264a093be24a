"""Avro and Protobuf drained through the real embedded schema registry (Apicurio Registry's
Confluent-compatible API) from the real broker into Delta, read back: schemas registered through the
API, a second writer version mid-stream, an id nobody registered, a refused login and the registry
stopped between two runs."""

from __future__ import annotations

import copy
import io
import json
import urllib.error
import urllib.request
import uuid
from datetime import UTC, datetime, timedelta

import pytest
import yaml

from deltadrain.catchup import drain
from deltadrain.config import load_config
from deltadrain.config.embedded import registry_login, registry_url
from deltadrain.dev import services
from deltadrain.dev.produce import avro_bad_kinds, avro_error_type, ensure_topic, produce
from deltadrain.formats.avro import encode as avro_encode
from deltadrain.formats.confluent import header
from deltadrain.formats.protobuf import ProtobufPayload
from deltadrain.formats.protobuf import encode as proto_encode
from deltadrain.formats.registry import Registry, failure_line
from deltadrain.formats.registry import register as register_schema
from deltadrain.sources.kafka.client import kafka_client_conf
from tests.support.kafka import end_offsets, group_of, lake_checkpoint
from tests.support.lake import dlq_rows, target_ids
from tests.support.pipelines import ROOT, write_config

SCHEMAS = ROOT / "config" / "schemas"
FIELDS = {"event_id": "string", "customer": "string", "amount": "double", "quantity": "long", "status": "string",
          "event_time": "timestamp", "note": "string"}


def register(cfg, subject: str, schema: str, schema_type: str | None = None) -> int:
    """A schema registered through the ccompat API, as a producer's serializer does: its id."""
    login = registry_login()
    registry = Registry(registry_url(cfg), login["username"], login["password"])
    return register_schema(registry, subject, schema, schema_type or "AVRO")


def registry_pipeline(tmp_path, cfg, fmt: str, source: dict | None = None, **schema):
    data = yaml.safe_load((ROOT / "config" / "pipelines.registry.yaml").read_text())
    data.pop("services")  # this session's ports
    pipe = copy.deepcopy(data["pipelines"][0])
    name = f"r_{fmt}_{uuid.uuid4().hex[:6]}"
    pipe["name"] = pipe["target"]["path"] = name
    pipe["source"].update(topic=name, group=f"{name}-group", partitions=2, **(source or {}))
    pipe["schema"].pop("avro")  # these tests register their own writers
    pipe["schema"][fmt] = {"wire": "confluent", **schema.pop(fmt, {})}
    pipe["schema"]["registry"]["url"] = registry_url(cfg)
    if schema.get("evolution") == "add_columns":
        pipe.pop("transform")  # a transform's columns and new fields would share the table's names
    pipe["schema"].update(format=fmt, **{"fields": FIELDS, **schema})
    path, c, p = write_config(tmp_path, data, pipe)
    ensure_topic(kafka_client_conf(c, p), name, 2)
    return path, c, p


def send(c, p, values: list[bytes], keys: list[bytes] | None = None) -> None:
    from confluent_kafka import Producer

    producer = Producer(kafka_client_conf(c, p))
    for i, value in enumerate(values):
        producer.produce(p.source.topic, value, key=keys[i] if keys else None, partition=i % 2)
    producer.flush(30)


def record(prefix: str, i: int, note: str | None = None) -> dict:
    return {"event_id": f"{prefix}-{i}", "customer": f"c{i % 7}", "amount": i * 1.5, "quantity": i,
            "status": "PAID", "event_time": datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=i), "note": note}


def failed_run(c, p, spark) -> str:
    with pytest.raises(Exception) as exc:  # whichever error carries it, its line is the registry's
        drain(c, p, spark=spark)
    line = failure_line(exc.value)
    assert line is not None and "\n" not in line, exc.value
    return line


def unchanged(spark, c, p, before) -> None:
    """Nothing committed to the lake or the DLQ, nothing acknowledged to the group: its offsets are what
    they were or, before a first commit, the start the run's claim notice put there."""
    lake, dead, group = before
    assert (lake_checkpoint(spark, c, p), len(dlq_rows(spark, c, p))) == (lake, dead)
    for part, offset in group_of(c, p).items():
        assert offset == group[part] or (group[part] is None and offset == int(lake.positions.get(part, 0))), (
            part, offset, group)


def state(spark, c, p):
    return lake_checkpoint(spark, c, p), len(dlq_rows(spark, c, p)), group_of(c, p)


@pytest.mark.slow
def test_avro_and_protobuf_drain_through_the_real_registry_across_versions_bad_ids_logins_and_an_outage(
        tmp_path, cfg, spark, kafka_broker, registry_server, monkeypatch):
    (tmp_path / "a").mkdir()
    (tmp_path / "p").mkdir()
    path, c, p = registry_pipeline(tmp_path / "a", cfg, "avro")
    _, pc, pp = registry_pipeline(tmp_path / "p", cfg, "protobuf")
    assert p.payload_schema.registry.connection_id == "deltadrain_registry"  # the login services up handed over
    # The registry listens on the loopback only, and no path answers without the login.
    from tests.support.processes import beyond_loopback, listening_addresses

    listening = listening_addresses(registry_server.pid())
    assert listening and not beyond_loopback(listening), listening
    base = registry_url(cfg).split("/apis/")[0]
    for where in ("/apis/ccompat/v7/schemas/ids/1", "/apis/registry/v2/search/artifacts", "/health/ready", "/ui/"):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(base + where, timeout=30)  # the embedded registry
        assert refused.value.code == 401, where

    # Avro: v1 without `note`, then v2 with it mid-stream, and messages framed with an id nobody registered.
    v2 = json.loads((SCHEMAS / "clicks.avsc").read_text())
    v1 = {**v2, "fields": [f for f in v2["fields"] if f["name"] != "note"]}
    id1 = register(c, f"{p.source.topic}-value", json.dumps(v1))
    id2 = register(c, f"{p.source.topic}-value", json.dumps(v2))
    unknown = max(id1, id2) + 10_000
    values = [avro_encode(record("v1", i), v1, wire="confluent", schema_id=id1) for i in range(30)]
    values += [avro_encode(record("v2", i, note=f"n{i}"), v2, wire="confluent", schema_id=id2) for i in range(30)]
    values += [header(unknown) + v[5:] for v in values[:4]]
    send(c, p, values)

    # Protobuf: clicks.proto (importing the well-known Timestamp) registered as text, as producers do.
    pid = register(pc, f"{pp.source.topic}-value", (SCHEMAS / "clicks.proto").read_text(), "PROTOBUF")
    full = ProtobufPayload((SCHEMAS / "clicks.desc").read_bytes(), "dev.deltadrain.sample.Click", "confluent", pid)
    send(pc, pp, [proto_encode({**record("pb", i, note=f"p{i}"), "status": "SHIPPED"}, full) for i in range(40)])

    # A wrong password, given as environment variables: the run fails in one line naming them, and
    # nothing is committed, dead-lettered or acknowledged.
    bad = yaml.safe_load(path.read_text())
    bad["pipelines"][0]["schema"]["registry"].pop("connection_id")
    bad["pipelines"][0]["schema"]["registry"].update(username_env="DD_TEST_REG_USER", password_env="DD_TEST_REG_PW")
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad, sort_keys=False))
    monkeypatch.setenv("DD_TEST_REG_USER", registry_login()["username"])
    monkeypatch.setenv("DD_TEST_REG_PW", "not-the-password")
    before = state(spark, c, p)
    bc = load_config(tmp_path / "bad.yaml")
    line = failed_run(bc, bc.pipeline(p.name), spark)
    assert "refused the login (HTTP 401" in line and "DD_TEST_REG_USER and DD_TEST_REG_PW" in line, line
    assert "not-the-password" not in line
    unchanged(spark, c, p, before)

    # With the connection's login: every message once, v1 rows without a note, v2 rows with theirs,
    # the unknown id's messages dead letters with their reason, nothing else dead.
    # One run takes the whole topic (its batch_cap is above it), so no run is spent finding it empty.
    run = drain(c, p, spark=spark)
    assert (run.claimed, run.written, run.dead_lettered) == (64, 60, 4), run.line()
    rows = spark.read.format("delta").load(str(c.target_path(p))).collect()
    table = {r.event_id: r for r in rows}
    assert len(rows) == len(table) == 60
    assert {k for k in table if k.startswith("v1-")} == {f"v1-{i}" for i in range(30)}
    assert all(table[f"v1-{i}"].note is None for i in range(30))
    assert [table[f"v2-{i}"].note for i in range(30)] == [f"n{i}" for i in range(30)]
    want = record("v2", 7)
    got = table["v2-7"]
    assert (got.customer, got.amount, got.quantity, got.status, got.event_time.astimezone(UTC)) == (
        want["customer"], want["amount"], want["quantity"], "paid", want["event_time"])
    dead = dlq_rows(spark, c, p)
    assert len(dead) == 4 and {r.error_type for r in dead} == {"unknown_schema_id"}
    assert all(f"unknown schema id {unknown}" in r.error and "does not know it" in r.error for r in dead)
    assert group_of(c, p) == {k: int(v) for k, v in end_offsets(c, p).items()}

    run = drain(pc, pp, spark=spark)
    assert (run.claimed, run.written, run.dead_lettered) == (40, 40, 0), run.line()
    assert group_of(pc, pp) == {k: int(v) for k, v in end_offsets(pc, pp).items()}
    prow = {r.event_id: r for r in spark.read.format("delta").load(str(pc.target_path(pp))).collect()}
    assert set(prow) == {f"pb-{i}" for i in range(40)} and not dlq_rows(spark, pc, pp)
    assert (prow["pb-3"].note, prow["pb-3"].status, prow["pb-3"].event_time.astimezone(UTC)) == (
        "p3", "shipped", record("pb", 3)["event_time"])

    # A third writer version, and the registry stops before its id was ever asked for: the run fails in
    # one line, with nothing dead-lettered, committed or acknowledged; once it is back, all lands once.
    v3 = {**v2, "doc": "v3"}
    id3 = register(c, f"{p.source.topic}-value", json.dumps(v3))
    send(c, p, [avro_encode(record("v3", i, note="x"), v3, wire="confluent", schema_id=id3) for i in range(20)])
    services.down(cfg, ["registry"])
    before = state(spark, c, p)
    line = failed_run(c, p, spark)
    assert f"cannot get schema id {id3} from the schema registry at {registry_url(cfg)}" in line, line
    unchanged(spark, c, p, before)
    services.up(cfg, ["registry"])
    run = drain(c, p, spark=spark)
    assert (run.claimed, run.written, run.dead_lettered) == (20, 20, 0), run.line()
    assert group_of(c, p) == {k: int(v) for k, v in end_offsets(c, p).items()}
    ids = [r.event_id for r in spark.read.format("delta").load(str(c.target_path(p))).select("event_id").collect()]
    assert len(ids) == len(set(ids)) == 80 and {f"v3-{i}" for i in range(20)} <= set(ids)
    assert len(dlq_rows(spark, c, p)) == 4
    assert lake_checkpoint(spark, c, p).positions == end_offsets(c, p)


@pytest.mark.slow
def test_a_writer_registered_mid_stream_adds_its_field_as_a_column_and_avro_keys_are_the_ids(
        tmp_path, cfg, spark, kafka_broker, registry_server):
    """Schema evolution through the real registry: a pipeline with only `registry.url` and
    `add_columns` declares two fields; the producer registers a version that adds `coupon` and writes
    with its id mid-stream, and the table gains the column in that batch's commit, with nothing
    restarted or edited. Its keys are Avro strings registered under the topic's key subject
    (`key_format: avro`): the ids are the keys, not the payloads' field."""
    import fastavro

    fields = {"event_id": "string", "customer": "string"}
    _, c, p = registry_pipeline(tmp_path, cfg, "avro", {"id_from": "key", "key_format": "avro"},
                                fields=fields, required=["customer"], evolution="add_columns")
    v1 = {"type": "record", "name": "Click", "fields": [{"name": "event_id", "type": "string"},
                                                        {"name": "customer", "type": "string"}]}
    v2 = {**v1, "fields": [*v1["fields"], {"name": "coupon", "type": ["null", "string"], "default": None},
                           {"name": "score", "type": "int", "default": 0}]}
    topic = p.source.topic
    key_id = register(c, f"{topic}-key", '"string"')
    id1 = register(c, f"{topic}-value", json.dumps(v1))

    def key(text: str) -> bytes:
        out = io.BytesIO()
        fastavro.schemaless_writer(out, fastavro.parse_schema("string"), text)
        return header(key_id) + out.getvalue()

    send(c, p, [avro_encode({"event_id": f"body-{i}", "customer": f"c{i}"}, v1, wire="confluent", schema_id=id1)
                for i in range(6)], [key(f"k1-{i}") for i in range(6)])
    assert drain(c, p, spark=spark).written == 6
    id2 = register(c, f"{topic}-value", json.dumps(v2))
    send(c, p, [avro_encode({"event_id": f"body-{i}", "customer": f"c{i}", "coupon": f"X{i}", "score": i}, v2,
                            wire="confluent", schema_id=id2) for i in range(6)], [key(f"k2-{i}") for i in range(6)])
    run = drain(c, p, spark=spark)
    assert (run.written, run.dead_lettered) == (6, 0), run.line()

    from deltalake import DeltaTable

    target = str(c.target_path(p))
    table = DeltaTable(target)
    assert {f.name: f.type.type for f in table.schema().fields if not f.name.startswith("_dd_")} == {
        "event_id": "string", "customer": "string", "coupon": "string", "score": "integer"}
    rows = {r.event_id: r for r in spark.read.format("delta").load(target).collect()}
    assert set(rows) == {f"k{v}-{i}" for v in (1, 2) for i in range(6)}  # the keys, not the bodies' field
    assert all((rows[f"k1-{i}"].coupon, rows[f"k1-{i}"].score) == (None, None) for i in range(6))
    assert [(rows[f"k2-{i}"].coupon, rows[f"k2-{i}"].score) for i in range(6)] == [(f"X{i}", i) for i in range(6)]
    changed = [json.loads(h["userMetadata"]) for h in table.history() if "added_columns" in (h.get("userMetadata") or "")]
    assert [(m["batch"], m["added_columns"]) for m in changed] == [(2, {"coupon": "string", "score": "int"})]
    assert not dlq_rows(spark, c, p)

    # `deltadrain produce` registers the example's schema file under the topic's value subject and writes
    # with its id, good and bad messages: the example pipeline runs end to end against the registry.
    (tmp_path / "x").mkdir()
    _, xc, xp = registry_pipeline(tmp_path / "x", cfg, "avro", avro={"schema_file": str(SCHEMAS / "clicks.avsc")})
    result = produce(xc, xp, 60, seed=56, malformed_ratio=0.15)
    assert result.places and set(result.places.values()) <= set(avro_bad_kinds(xp))
    run = drain(xc, xp, spark=spark)
    assert (run.claimed, run.written, run.dead_lettered) == (60, len(result.valid_ids), len(result.places)), run.line()
    assert sorted(target_ids(spark, xc, xp)) == sorted(result.valid_ids)
    dead = {(r.partition, r.position): r.error_type for r in dlq_rows(spark, xc, xp)}
    assert dead == {place: avro_error_type(xp, kind) for place, kind in result.places.items()}
