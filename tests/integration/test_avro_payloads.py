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

from deltadrain.catchup import drain
from deltadrain.dev.produce import avro_error_type, ensure_topic, generate, produce, protobuf_error_type
from deltadrain.failpoints import fired
from deltadrain.formats.avro import encode
from deltadrain.formats.payloads import payload_of
from deltadrain.formats.protobuf import encode as encode_protobuf
from deltadrain.heal.backfill import backfill
from deltadrain.heal.replay import ReplayRequest, replay
from deltadrain.observe.status import pipeline_status
from deltadrain.sources.kafka.client import kafka_client_conf
from tests.support.kafka import drain_until_done, end_offsets, group_of, lake_checkpoint
from tests.support.lake import dlq_rows
from tests.support.pipelines import ROOT, write_config
from tests.support.processes import cli_drain
from tests.support.valkey import assert_exactly_once as assert_valkey_exactly_once
from tests.support.valkey import drain_until_done as drain_valkey

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
        pipe["schema"]["avro"]["schema_file"] = str(SCHEMA_FILE)
    else:
        pipe["schema"]["protobuf"]["descriptor_file"] = str(ROOT / "config" / "schemas" / "clicks.desc")
    pipe["source"].update(source(name))
    return write_config(tmp_path, data, pipe)


def heal_deleted_rows(spark, c, p, lost: list[str], began: datetime, ended: datetime) -> None:
    """Delete `lost` from the target, backfill [began, ended] from the source's history: each comes back
    once, decoded as the drain decoded it, with the checkpoint where it was; a second backfill writes nothing."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    from deltadrain.lake.checkpoint import read_checkpoint

    target = str(c.target_path(p))

    def rows() -> list[dict]:
        """The target's rows: its ids and the lost rows' values, from one read."""
        return [r.asDict() for r in spark.read.format("delta").load(target).select(*p.payload_schema.fields).collect()]

    before, table = read_checkpoint(spark, target, p.name), rows()
    ids = sorted(r["event_id"] for r in table)
    kept = {r["event_id"]: r for r in table if r["event_id"] in lost}
    DeltaTable.forPath(spark, target).delete(F.col("event_id").isin(lost))
    s = backfill(c, p, spark, began, ended)
    assert s.written == len(lost) and s.acked == 0 and not s.gaps, s
    table = rows()
    assert sorted(r["event_id"] for r in table) == ids
    healed = {r["event_id"]: r for r in table if r["event_id"] in lost}
    assert healed == kept
    after = read_checkpoint(spark, target, p.name)
    assert (after.batch, after.positions) == (before.batch, before.positions)
    assert backfill(c, p, spark, began, ended).written == 0


def dead_by_place(rows) -> dict:
    return {(r.partition, r.position): (r.error_type, r.error) for r in rows if r.state == "DEAD"}


@pytest.mark.slow
def test_avro_and_protobuf_pipelines_drain_exactly_once_and_dead_letter_bad_bodies_with_reasons(
        tmp_path, cfg, spark, kafka_broker, valkey_server, spark_connect_server):
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
    proc = cli_drain(path, p.name, {"DELTADRAIN_FAILPOINT": "after_commit"}, remote=True)
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
    pipe["schema"]["avro"]["schema_file"] = str(evolving)
    pipe["schema"].update(fields={"event_id": "string", "customer": "string"},
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

    # Protobuf with its descriptor file on Kafka: the producer's new descriptor widens an evolved int32
    # to int64 and adds scalars, a Timestamp and bytes (a repeated field is left out); the next run, with
    # nothing restarted, adds and widens them in its batch's commit. Old rows read null in the new columns.
    (tmp_path / "pe").mkdir()
    descriptor = tmp_path / "pe" / "click.desc"
    descriptor.write_bytes(click_descriptor(1))
    _, pec, pep = avro_pipeline(tmp_path / "pe", "clicks_proto",
                                lambda name: {"topic": name, "group": f"{name}-group", "partitions": 1}, PROTO_EXAMPLE)
    data = yaml.safe_load((tmp_path / "pe" / "pipelines.yaml").read_text())
    pipe = data["pipelines"][0]
    pipe.pop("transform")
    pipe["schema"]["protobuf"]["descriptor_file"] = str(descriptor)
    pipe["schema"].update(fields={"event_id": "string", "customer": "string"},
                          required=["event_id"], evolution="add_columns")
    _, pec, pep = write_config(tmp_path / "pe", data, pipe)
    ensure_topic(kafka_client_conf(pec, pep), pep.source.topic, 1)
    from confluent_kafka import Producer

    producer = Producer(kafka_client_conf(pec, pep))

    def publish(records: list[dict]) -> None:
        payload = payload_of(pep.payload_schema)  # the descriptor file as it is now
        for record in records:
            producer.produce(pep.source.topic, encode_protobuf(record, payload), partition=0)
        producer.flush(30)

    publish([{"event_id": f"p1-{i}", "customer": f"c{i}", "quantity": i} for i in range(3)])
    first = drain(pec, pep, spark=spark)
    assert (first.written, first.dead_lettered) == (3, 0), first.line()
    descriptor.write_bytes(click_descriptor(2))
    publish([{"event_id": f"p2-{i}", "customer": None, "quantity": 2**40 + i, "status": "PAID", "event_time": at,
              "raw": b"\x00\xff", "tags": ["a"], "ratio": 0.25} for i in range(3)])
    second = drain(pec, pep, spark=spark)
    assert (second.written, second.dead_lettered) == (3, 0), second.line()
    target = str(pec.target_path(pep))
    from deltalake import DeltaTable

    table = DeltaTable(target)
    assert {f.name: f.type.type for f in table.schema().fields if not f.name.startswith("_dd_")} == {
        "event_id": "string", "customer": "string", "quantity": "long", "status": "string", "event_time": "timestamp",
        "raw": "binary", "ratio": "float"}
    prows = {r.event_id: r for r in spark.read.format("delta").load(target).collect()}
    assert {k: (r.customer, r.quantity, r.status, r.event_time and r.event_time.astimezone(UTC), r.raw, r.ratio)
            for k, r in prows.items()} == {
        **{f"p1-{i}": (f"c{i}", i, None, None, None, None) for i in range(3)},
        **{f"p2-{i}": (None, 2**40 + i, "PAID", at, bytearray(b"\x00\xff"), 0.25) for i in range(3)}}
    history = [json.loads(h["userMetadata"]) for h in table.history() if "batch" in (h.get("userMetadata") or "")]
    changed = {m["batch"]: (m.get("added_columns"), m.get("widened_columns")) for m in history}
    assert changed == {1: ({"quantity": "int"}, None), 2: (
        {"status": "string", "event_time": "timestamp", "raw": "binary", "ratio": "float"}, {"quantity": "int -> long"})}
    assert not (table.protocol().reader_features or [])  # the widening's feature is dropped again


def click_descriptor(version: int) -> bytes:
    """A descriptor set of dev.deltadrain.sample.Click (config/schemas/clicks.desc, with its Timestamp import)
    as the producer evolves it: version 1 has event_id, customer and an int32 quantity; version 2 widens
    quantity to int64 and adds an enum, a Timestamp, bytes, a float and a repeated string."""
    from google.protobuf import descriptor_pb2

    fds = descriptor_pb2.FileDescriptorSet.FromString((ROOT / "config" / "schemas" / "clicks.desc").read_bytes())
    click = next(f for f in fds.file if f.name.endswith("clicks.proto")).message_type[0]
    T = descriptor_pb2.FieldDescriptorProto  # the protobuf type's name
    kept = {f.name: f for f in click.field}
    fields = [kept["event_id"], kept["customer"], T(name="quantity", number=4, type=T.TYPE_INT32, label=T.LABEL_OPTIONAL)]
    if version == 2:
        fields[2] = kept["quantity"]  # int64
        fields += [kept["status"], kept["event_time"],
                   T(name="raw", number=8, type=T.TYPE_BYTES, label=T.LABEL_OPTIONAL),
                   T(name="tags", number=9, type=T.TYPE_STRING, label=T.LABEL_REPEATED),
                   T(name="ratio", number=10, type=T.TYPE_FLOAT, label=T.LABEL_OPTIONAL)]
    del click.field[:]
    click.field.extend(fields)
    fields[1].oneof_index = 0  # customer is proto3 `optional`: the only synthetic oneof left
    del click.oneof_decl[1:]
    return fds.SerializeToString()


@pytest.mark.slow
def test_a_batchs_writer_typed_new_fields_become_its_columns(tmp_path, spark):
    """With a registry, the decoding tasks stage each message's new fields as JSON with its writer's types
    (tests/unit/test_registry.py drives them against a registry's API); here Spark turns a staged batch
    of such rows into the batch's columns: int and long make long, a minority type is a `schema` dead letter
    naming both, a writer's long widens the table's evolved int column, a left-out field is reported."""
    from deltadrain.formats.avro import convert
    from deltadrain.run.layout import new_columns
    from deltadrain.schema.evolution import WriterColumns, writer_extras

    at = datetime(2026, 5, 1, 1, 2, 3, 456789, tzinfo=UTC)
    a = WriterColumns({"n": "int", "at": "timestamp", "raw": "binary", "day": "date"},
                      {"tags": "Avro field 'tags' is array, which no column type deltadrain writes holds"})
    b = WriterColumns({"n": "long", "x": "double"})
    c = WriterColumns({"n": "string"})
    d = WriterColumns({"q": "long"})  # the table's evolved int column q, widened by this writer
    staged = [("m1", 5, a, {"n": 1, "at": at, "raw": b"\x00\x01", "day": at.date(), "tags": ["t"]}),
              ("m2", None, a, {"n": 2, "at": None, "raw": None, "day": None}),
              ("m3", None, b, {"n": 2**40, "x": 0.5}),
              ("m4", None, c, {"n": "seven"}),
              ("m5", None, d, {"q": 2**33}),
              ("m6", 6, WriterColumns(), {})]
    rows = []
    for pos, (mid, q, writer, record) in enumerate(staged):
        extra, kinds, problem = writer_extras(dict(record), writer, convert)
        assert problem is None
        rows.append(("0", pos, 0, mid, None, None, q, extra, kinds))
    schema = ("_dd_partition string, _dd_pos_hi long, _dd_pos_lo long, _dd_message_id string, _dd_error_type string, "
              "_dd_error string, q int, _dd_extra string, _dd_extra_kinds string")
    path = str(tmp_path / "staged")
    spark.createDataFrame(rows, schema).coalesce(1).write.parquet(path)
    got = new_columns(spark.read.parquet(path), {"q": "int"}, by_writer=True)
    assert (got.added, got.widened, got.moved) == (
        {"n": "long", "at": "timestamp", "raw": "binary", "day": "date", "x": "double"}, {"q": ("int", "long")}, 1)
    assert got.skipped == {"tags": "Avro field 'tags' is array, which no column type deltadrain writes holds"}
    assert dict(got.rows.dtypes)["q"] == "bigint" and dict(got.rows.dtypes)["at"] == "timestamp"
    out = {r._dd_message_id: r for r in got.rows.collect()}
    assert (out["m1"].n, out["m1"].at.astimezone(UTC), out["m1"].raw, out["m1"].day, out["m1"].q) == (
        1, at, bytearray(b"\x00\x01"), at.date(), 5)
    assert (out["m2"].n, out["m2"].at, out["m3"].n, out["m3"].x, out["m5"].q, out["m6"].q) == (
        2, None, 2**40, 0.5, 2**33, 6)
    assert (out["m4"]._dd_error_type, out["m4"]._dd_error, out["m4"].n) == (
        "schema", "new field 'n' is long in this batch (the writer schemas of most of its messages say so), this "
        "message's writer schema gives it string", None)
