"""Debezium change events in Avro through the schema registry, end to end on real parts: a PostgreSQL table's
snapshot and changes written by Debezium's Postgres connector with Apicurio Registry's Avro converter (keys and
values, their schemas registered in the embedded registry) into the embedded broker, drained by deltadrain into
an upsert target that then equals the table row for row; a record framed with an id the registry does not know
is a dead letter with its reason, and the only one."""

from __future__ import annotations

import time
import uuid
from decimal import Decimal

import psycopg
import pytest
from psycopg import sql

from deltadrain.catchup import drain
from deltadrain.config.embedded import REGISTRY_CONNECTION_ID, postgres_conninfo, registry_url
from deltadrain.dev.services.debezium import (
    AVRO_SLOT,
    add_avro_connector,
    connector_running,
    remove_connector,
    rest_get,
)
from deltadrain.formats.confluent import header
from deltadrain.sources.kafka.client import kafka_client_conf
from deltadrain.sources.kafka.offsets import TopicMissing
from tests.support.kafka import end_offsets, lake_checkpoint, make_kafka_pipeline
from tests.support.lake import dlq_rows

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("debezium_connector", "registry_server")]

FIELDS = {"id": "long", "name": "string", "qty": "long", "price": "decimal(18,2)", "at": "timestamp",
          "born": "date"}
UNKNOWN_ID = 987_654


def q(statement: str, table: str) -> sql.Composed:
    return sql.SQL(statement).format(sql.Identifier(*table.split(".")))


def wait_for(what: str, ready, cfg, name: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {rest_get(cfg, f'/connectors/{name}/status')}"
        time.sleep(0.25)


def written(c, p) -> int:
    """The records in the connector's topic (none before it makes the topic)."""
    try:
        return int(end_offsets(c, p).get("0", 0))
    except TopicMissing:
        return 0


def running(cfg, name: str) -> bool:
    try:
        return connector_running(rest_get(cfg, f"/connectors/{name}/status"))
    except (OSError, ValueError):
        return False


def drop_slot(cfg, slot: str) -> None:
    """The connector's replication slot, once the stopped connector has let go of it."""
    with psycopg.connect(**postgres_conninfo(cfg, admin=True), autocommit=True) as admin:
        for _ in range(60):
            try:
                admin.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                              "WHERE slot_name = %s", [slot])
                return
            except psycopg.errors.ObjectInUse:
                time.sleep(0.5)


def test_debezium_avro_changes_through_the_registry_equal_the_table_and_an_unknown_id_is_a_dead_letter(
        tmp_path, cfg, spark):
    from pyspark.sql import functions as F

    conn = psycopg.connect(**postgres_conninfo(cfg), autocommit=True)
    table = f"public.cdca_{uuid.uuid4().hex[:8]}"
    topic = f"cdcavro.{table}"
    conn.execute(q("CREATE TABLE {} (id int PRIMARY KEY, name text, qty bigint, price numeric(12,2), "
                   "at timestamp, born date)", table))
    insert = q("INSERT INTO {} VALUES (%s, %s, %s, %s, %s, %s)", table)
    events = 0  # the records the connector writes: one per row change, and a tombstone after each delete
    for i in range(1, 6):  # read by the connector's first snapshot (op r)
        conn.execute(insert, [i, f"snap {i}", i * 10, Decimal(i) / 4, f"2026-01-0{i} 10:00:00.12345{i}", f"1990-01-0{i}"])
        events += 1
    _, c, p = make_kafka_pipeline(
        tmp_path, partitions=1, transform=None, source={"topic": topic},
        target={"path": table.split(".")[1], "mode": "upsert", "order_by": "source.lsn"},
        schema={"envelope": "debezium", "format": "avro", "avro": {"wire": "confluent"},
                "registry": {"url": registry_url(cfg), "connection_id": REGISTRY_CONNECTION_ID}, "fields": FIELDS})
    name = add_avro_connector(cfg, [table])
    try:
        wait_for("the Avro connector", lambda: running(cfg, name), cfg, name)
        for i in range(6, 16):
            conn.execute(insert, [i, f"new {i}", -i, Decimal(f"-{i}.05"), f"2026-02-{i:02d} 23:59:59.999999",
                                  None if i % 3 == 0 else f"2000-12-{i:02d}"])
            events += 1
        for v in range(1, 9):  # one key updated many times
            conn.execute(q("UPDATE {} SET qty = %s, price = price + 1.01, name = %s WHERE id = 3", table),
                         [v, f"three v{v}"])
            events += 1
        conn.execute(q("DELETE FROM {} WHERE id = 4", table))  # deleted and inserted again
        conn.execute(insert, [4, "four again", 44, Decimal("4444.44"), "2026-03-01 00:00:00", "2001-01-01"])
        conn.execute(q("DELETE FROM {} WHERE id IN (5, 7)", table))
        conn.execute(q("UPDATE {} SET name = NULL, at = NULL WHERE id = 9", table))
        events += 2 + 1 + 2 * 2 + 1
        wait_for("every change in Kafka", lambda: written(c, p) >= events, cfg, name)
        assert written(c, p) == events

        # A record produced by hand into the same topic, framed with an id nobody registered.
        from confluent_kafka import Producer

        producer = Producer(kafka_client_conf(c, p))
        producer.produce(topic, header(UNKNOWN_ID) + b"\x02", key=b'{"id": 77}', partition=0)
        producer.flush(30)

        summary = drain(c, p, spark=spark)  # one run: every record in one batch, the dead letter decided by decoding
        assert summary.error is None and lake_checkpoint(spark, c, p).positions == end_offsets(c, p), summary.line()
        df = spark.read.format("delta").load(str(c.target_path(p)))
        got = sorted(tuple(r) for r in df.select("id", "name", "qty", "price", F.unix_micros("at"), "born").collect())
        want = sorted(tuple(r) for r in conn.execute(q(
            "SELECT id, name, qty, price, (extract(epoch from at) * 1000000)::bigint, born FROM {}", table)).fetchall())
        assert got == want, [(r.error_type, r.error) for r in dlq_rows(spark, c, p)][:5]
        assert len(got) == 13 and (3, "three v8", 8, Decimal("8.83")) in [r[:4] for r in got]
        dead = dlq_rows(spark, c, p)
        assert [(r.error_type, r.message_id, r.state) for r in dead] == [("unknown_schema_id", '{"id":77}', "DEAD")]
        assert f"unknown schema id {UNKNOWN_ID}" in dead[0].error, dead[0].error
    finally:
        conn.close()
        remove_connector(cfg, name)
        drop_slot(cfg, AVRO_SLOT)
