"""Avro and Protobuf payloads end to end, against the real broker, Valkey, Spark and Delta: drained
exactly once across a kill between the lake commit and the group commit, bad bodies in the DLQ with
their reasons, and a replayed dead letter that dies again with the same reason."""

from __future__ import annotations

import io
import json
import uuid
from datetime import UTC, datetime, timedelta

import fastavro
import pytest
import yaml

from deltadrain.avro import encode
from deltadrain.backfill import backfill
from deltadrain.catchup import drain
from deltadrain.dev.produce import avro_error_type, ensure_topic, generate, produce, protobuf_error_type
from deltadrain.failpoints import fired
from deltadrain.payloads import payload_of
from deltadrain.replay import ReplayRequest, replay
from deltadrain.sources.kafka.client import kafka_client_conf
from deltadrain.status import pipeline_status
from tests.integration.helpers import ROOT, cli_drain, dlq_rows, target_ids, write_config
from tests.integration.helpers import assert_exactly_once as assert_valkey_exactly_once
from tests.integration.helpers import drain_until_done as drain_valkey
from tests.integration.test_kafka_drain import drain_until_done, end_offsets, group_of, lake_checkpoint

EXAMPLE = ROOT / "config" / "pipelines.avro.yaml"
SCHEMA_FILE = ROOT / "config" / "schemas" / "clicks.avsc"
PROTO_EXAMPLE = ROOT / "config" / "pipelines.protobuf.yaml"


def avro_pipeline(tmp_path, example: str, source, example_file=EXAMPLE):
    """The example's pipeline `example` under a name, source and tables of its own: (path, cfg, p)."""
    data = yaml.safe_load(example_file.read_text())
    pipe = next(p for p in data["pipelines"] if p["name"] == example)
    name = f"a_{uuid.uuid4().hex[:8]}"
    pipe["name"] = name
    pipe["target"]["path"] = name
    if pipe["schema"]["format"] == "avro":  # the config is written elsewhere
        pipe["schema"]["avro_schema_file"] = str(SCHEMA_FILE)
    else:
        pipe["schema"]["protobuf_descriptor_file"] = str(ROOT / "config" / "schemas" / "clicks.desc")
    pipe["source"].update(source(name))
    return write_config(tmp_path, data, pipe)


def heal_deleted_rows(spark, c, p, lost: list[str], began: datetime, ended: datetime) -> None:
    """Delete `lost` from the target, backfill [began, ended] from the source's history: each comes back
    once, decoded as the drain decoded it, with the checkpoint where it was; a second backfill writes nothing."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    from deltadrain.checkpoint import read_checkpoint

    target = str(c.target_path(p))
    before, ids = read_checkpoint(spark, target, p.name), sorted(target_ids(spark, c, p))
    kept = {r.event_id: r.asDict() for r in spark.read.format("delta").load(target).where(F.col("event_id").isin(lost))
            .select(*p.payload_schema.fields).collect()}
    DeltaTable.forPath(spark, target).delete(F.col("event_id").isin(lost))
    s = backfill(c, p, spark, began, ended)
    assert s.written == len(lost) and s.acked == 0 and not s.gaps, s
    assert sorted(target_ids(spark, c, p)) == ids
    healed = {r.event_id: r.asDict() for r in spark.read.format("delta").load(target).where(F.col("event_id").isin(lost))
              .select(*p.payload_schema.fields).collect()}
    assert healed == kept
    after = read_checkpoint(spark, target, p.name)
    assert (after.batch, after.positions) == (before.batch, before.positions)
    assert backfill(c, p, spark, began, ended).written == 0


def dead_by_place(rows) -> dict:
    return {(r.partition, r.position): (r.error_type, r.error) for r in rows if r.state == "DEAD"}


@pytest.mark.slow
def test_avro_and_protobuf_pipelines_drain_exactly_once_and_dead_letter_bad_bodies_with_reasons(
        tmp_path, cfg, spark, kafka_broker, valkey_server):
    (tmp_path / "k").mkdir()
    path, c, p = avro_pipeline(tmp_path / "k", "clicks_avro",
                               lambda name: {"topic": name, "group": f"{name}-group", "partitions": 2})
    ensure_topic(kafka_client_conf(c, p), p.source.topic, 2)
    began = datetime.now(UTC) - timedelta(seconds=1)
    result = produce(c, p, 1200, seed=49, malformed_ratio=0.1)
    ended = datetime.now(UTC) + timedelta(seconds=1)
    bad_kinds = {kind for kind in result.places.values()}
    assert bad_kinds == {"empty", "truncated", "not_avro", "trailing_bytes", "not_finite", "wrong_magic_byte",
                         "unknown_schema_id"}

    # Killed after the lake commit, before the group commit: nothing is read twice afterwards.
    proc = cli_drain(path, p.name, {"DELTADRAIN_FAILPOINT": "after_commit"})
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == -9 and fired("after_commit") in err, err[-3000:]
    assert lake_checkpoint(spark, c, p).batch == 1 and set(group_of(c, p).values()) == {0}
    assert sum(s.claimed for s in drain_until_done(c, p, spark)) == 0
    # The group caught up with the lake, which drain_until_done checked it never leads: all is read.
    assert group_of(c, p) == {k: int(v) for k, v in end_offsets(c, p).items()}

    # Every valid message once, typed as declared; every bad one in the DLQ at its place with its reason.
    table = {r.event_id: r for r in spark.read.format("delta").load(str(c.target_path(p))).collect()}
    assert len(table) == len(result.valid_ids) and set(table) == set(result.valid_ids)
    schema = fastavro.parse_schema(json.loads(SCHEMA_FILE.read_text()))
    for m in generate(p, 1200, seed=49, malformed_ratio=0.1):
        if m.kind == "valid":
            want = fastavro.schemaless_reader(io.BytesIO(m.value[5:]), schema, None)
            row = table[m.key]
            assert (row.customer, row.amount, row.quantity, row.status, row.event_time.astimezone(UTC)) == (
                want["customer"], want["amount"], want["quantity"], want["status"].lower(), want["event_time"])
    first_rows = dlq_rows(spark, c, p)
    dead = dead_by_place(first_rows)
    assert set(dead) == set(result.places)
    for place, kind in result.places.items():
        assert dead[place][0] == avro_error_type(p, kind), (place, kind, dead[place])
    reasons = {dead[place][1] for place, kind in result.places.items() if kind == "unknown_schema_id"}
    assert reasons == {"unknown schema id 2 (this pipeline reads schema id 1)"}
    assert all(r.original is not None for r in first_rows if r.error_type != "empty")

    # Replayed without a fix, the unknown ids come back as dead letters with the same reason.
    replayed = replay(c, spark, ReplayRequest(pipeline=p.name, error_contains="unknown schema id", dry_run=False))
    assert replayed.replayed == sum(k == "unknown_schema_id" for k in result.places.values()) > 0
    copies = drain(c, p, spark=spark)
    assert (copies.claimed, copies.dead_lettered, copies.written) == (replayed.replayed, replayed.replayed, 0)
    rows = dlq_rows(spark, c, p)
    again = {place: v for place, v in dead_by_place(rows).items() if place not in dead}
    assert len(again) == replayed.replayed and {v for v in again.values()} == {
        ("unknown_schema_id", "unknown schema id 2 (this pipeline reads schema id 1)")}
    assert sum(r.state == "REPLAYED" for r in rows) == replayed.replayed

    # A backfill of the produce interval heals deleted rows from the topic's Avro records, once, and
    # leaves the checkpoint and the group where they were.
    heal_deleted_rows(spark, c, p, sorted(result.valid_ids)[:5], began, ended)

    # Valkey: stream values are the plain Avro datums.
    (tmp_path / "v").mkdir()
    _, vc, vp = avro_pipeline(tmp_path / "v", "orders_avro",
                              lambda name: {"streams": [f"{name}:{{0}}", f"{name}:{{1}}"]})
    from deltadrain.sources.valkey.client import valkey_client

    vresult = produce(vc, vp, 300, seed=50, malformed_ratio=0.2)
    assert set(vresult.places.values()) == {"empty", "truncated", "not_avro", "trailing_bytes", "not_finite"}
    client = valkey_client(vc, vp)
    drain_valkey(vc, vp, spark, client)
    assert_valkey_exactly_once(spark, vc, vp, client, vresult.valid_ids, set(vresult.places))
    vdead = dead_by_place(dlq_rows(spark, vc, vp))
    assert {vdead[place][0] for place in vresult.places} == {"empty", "truncated", "invalid_avro", "schema"}

    # Valkey with plain Protobuf messages: the same claim, decode and dead letters for a binary format.
    (tmp_path / "vp").mkdir()
    _, qc, qp = avro_pipeline(tmp_path / "vp", "orders_proto",
                              lambda name: {"streams": [f"{name}:{{0}}", f"{name}:{{1}}"]}, PROTO_EXAMPLE)
    began = datetime.now(UTC) - timedelta(seconds=1)
    qresult = produce(qc, qp, 300, seed=52, malformed_ratio=0.2)
    ended = datetime.now(UTC) + timedelta(seconds=1)
    assert set(qresult.places.values()) == {"empty", "truncated", "not_protobuf", "not_finite"}
    qclient = valkey_client(qc, qp)
    drain_valkey(qc, qp, spark, qclient)
    assert_valkey_exactly_once(spark, qc, qp, qclient, qresult.valid_ids, set(qresult.places))
    qdead = dead_by_place(dlq_rows(spark, qc, qp))
    for place, kind in qresult.places.items():
        assert qdead[place][0] == protobuf_error_type(qp, kind), (place, kind, qdead[place])
    heal_deleted_rows(spark, qc, qp, sorted(qresult.valid_ids)[:3], began, ended)

    # Protobuf in the Confluent frame on Kafka: every valid message once, each bad body at its place.
    (tmp_path / "p").mkdir()
    _, pc, pp = avro_pipeline(tmp_path / "p", "clicks_proto",
                              lambda name: {"topic": name, "group": f"{name}-group", "partitions": 2}, PROTO_EXAMPLE)
    ensure_topic(kafka_client_conf(pc, pp), pp.source.topic, 2)
    presult = produce(pc, pp, 400, seed=51, malformed_ratio=0.15)
    assert set(presult.places.values()) == {"empty", "truncated", "not_protobuf", "not_finite", "wrong_magic_byte",
                                            "unknown_schema_id"}
    # One run takes the whole topic (its batch_cap is above 400): nothing is left for a second one.
    run = drain(pc, pp, spark=spark)
    assert (run.claimed, run.written, run.dead_lettered) == (400, len(presult.valid_ids), len(presult.places))
    assert group_of(pc, pp) == {k: int(v) for k, v in end_offsets(pc, pp).items()}
    prows = spark.read.format("delta").load(str(pc.target_path(pp))).collect()
    ptable = {r.event_id: r for r in prows}
    assert len(prows) == len(ptable) == len(presult.valid_ids) and set(ptable) == set(presult.valid_ids)
    payload = payload_of(pp.payload_schema)
    status = payload.descriptor().fields_by_name["status"].enum_type
    for m in generate(pp, 400, seed=51, malformed_ratio=0.15):
        if m.kind == "valid":
            want = payload.message_class().FromString(m.value[6:])  # magic, id, the single-0 index
            row = ptable[m.key]
            assert (row.customer, row.amount, row.quantity, row.event_time.astimezone(UTC)) == (
                want.customer, want.amount, want.quantity, want.event_time.ToDatetime(tzinfo=UTC))
            assert row.status == status.values_by_number[want.status].name.lower()
    pdead = dead_by_place(dlq_rows(spark, pc, pp))
    assert set(pdead) == set(presult.places)
    for place, kind in presult.places.items():
        assert pdead[place][0] == protobuf_error_type(pp, kind), (place, kind, pdead[place])

    # Schema evolution (add_columns) with the schema in a file: the producer's new schema file adds fields,
    # and the next run, with nothing restarted, adds them as columns in its batch's commit.
    (tmp_path / "e").mkdir()
    evolving = tmp_path / "e" / "clicks.avsc"
    v1 = {"type": "record", "name": "Click", "fields": [{"name": "event_id", "type": "string"},
                                                        {"name": "customer", "type": ["null", "string"]}]}
    evolving.write_text(json.dumps(v1))
    data = yaml.safe_load(EXAMPLE.read_text())
    pipe = next(p for p in data["pipelines"] if p["name"] == "orders_avro")
    name = f"e_{uuid.uuid4().hex[:8]}"
    pipe.pop("transform")
    pipe.update(name=name, target={"path": name})
    pipe["source"]["streams"] = [f"{name}:{{0}}"]
    pipe["schema"].update(avro_schema_file=str(evolving), fields={"event_id": "string", "customer": "string"},
                          required=["event_id"], evolution="add_columns")
    _, ec, ep = write_config(tmp_path / "e", data, pipe)
    eclient = valkey_client(ec, ep)

    def send(schema: dict, records: list[dict]) -> None:
        for record in records:
            eclient.xadd(f"{name}:{{0}}", {b"data": encode(record, schema)})

    send(v1, [{"event_id": f"v1-{i}", "customer": f"c{i}"} for i in range(3)])
    assert drain(ec, ep, spark=spark).written == 3
    v2 = {**v1, "fields": [*v1["fields"], {"name": "score", "type": ["null", "int"], "default": None},
                           {"name": "seen_at", "type": {"type": "long", "logicalType": "timestamp-millis"}}]}
    evolving.write_text(json.dumps(v2))
    at = datetime(2026, 5, 1, tzinfo=UTC)
    send(v2, [{"event_id": f"v2-{i}", "customer": None, "score": i, "seen_at": at} for i in range(3)])
    second = drain(ec, ep, spark=spark)
    assert (second.written, second.dead_lettered) == (3, 0), second.line()
    erows = {r.event_id: r for r in spark.read.format("delta").load(str(ec.target_path(ep))).collect()}
    assert {k: (r.score, r.seen_at and r.seen_at.astimezone(UTC)) for k, r in erows.items()} == {
        **{f"v1-{i}": (None, None) for i in range(3)}, **{f"v2-{i}": (i, at) for i in range(3)}}
    changes = pipeline_status(ec, ep)["schema_changes"]
    assert [(ch["batch"], ch["added_columns"]) for ch in changes] == [(2, {"score": "int", "seen_at": "timestamp"})]
