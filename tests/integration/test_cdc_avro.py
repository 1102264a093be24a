"""Debezium change events in Avro through the schema registry, end to end on real parts: a PostgreSQL table's
snapshot and changes written by Debezium's Postgres connector with Apicurio Registry's Avro converter (keys and
values, their schemas registered in the embedded registry) into the embedded broker, drained by deltadrain into
an upsert target that then equals the table row for row; a record framed with an id the registry does not know
is a dead letter with its reason, and the only one. Columns added to the table mid-stream become columns of the
target (`schema.evolution: add_columns`) typed as the converter's writer schema says, not as their values would
type them."""

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
# Added mid-stream, each with the Delta type its Avro writer schema gives it: smallint is Avro's int (its values
# alone would make a long), numeric(10,3) Avro's decimal (a double), timestamp Debezium's MicroTimestamp (a string).
ADDED = {"rank": "int", "paid": "decimal(38,9)", "seen": "timestamp"}


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


def test_debezium_avro_changes_through_the_registry_equal_the_table_across_added_columns_and_an_unknown_id_is_a_dead_letter(
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
        schema={"envelope": "debezium", "format": "avro", "avro": {"wire": "confluent"}, "evolution": "add_columns",
                "registry": {"url": registry_url(cfg), "connection_id": REGISTRY_CONNECTION_ID}, "fields": FIELDS})

    def mirrored(added: bool) -> list:
        """The target's rows and the table's, each sorted, the timestamps as epoch microseconds."""
        df = spark.read.format("delta").load(str(c.target_path(p)))
        new = [F.col("rank"), F.col("paid"), F.unix_micros("seen")] if added else []
        got = sorted(tuple(r) for r in df.select("id", "name", "qty", "price", F.unix_micros("at"), "born", *new)
                     .collect())
        select = ("SELECT id, name, qty, price, (extract(epoch from at) * 1000000)::bigint, born, rank, paid, "
                  "(extract(epoch from seen) * 1000000)::bigint FROM {}") if added else \
            "SELECT id, name, qty, price, (extract(epoch from at) * 1000000)::bigint, born FROM {}"
        want = sorted(tuple(r) for r in conn.execute(q(select, table)).fetchall())
        assert got == want, [(r.error_type, r.error) for r in dlq_rows(spark, c, p)][:5]
        return got

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
        got = mirrored(added=False)
        assert len(got) == 13 and (3, "three v8", 8, Decimal("8.83")) in [r[:4] for r in got]
        dead = dlq_rows(spark, c, p)
        assert [(r.error_type, r.message_id, r.state) for r in dead] == [("unknown_schema_id", '{"id":77}', "DEAD")]
        assert f"unknown schema id {UNKNOWN_ID}" in dead[0].error, dead[0].error

        # Columns added mid-stream: the next batch holds changes of the old writer schema and of the new one.
        conn.execute(q("UPDATE {} SET qty = 100 WHERE id = 10", table))
        conn.execute(q("ALTER TABLE {} ADD COLUMN rank smallint, ADD COLUMN paid numeric(10,3), "
                       "ADD COLUMN seen timestamp", table))
        wide = q("INSERT INTO {} VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)", table)
        for i in range(16, 19):
            conn.execute(wide, [i, f"wide {i}", i, Decimal(i), "2026-04-01 12:00:00", None, i - 20,
                                Decimal(f"{i}.125") if i != 17 else None, f"2026-05-{i:02d} 01:02:03.000004"])
        conn.execute(q("UPDATE {} SET rank = 7, paid = -0.001, seen = '1999-12-31 23:59:59.5' WHERE id = 3", table))
        conn.execute(q("UPDATE {} SET rank = 1 WHERE id = 11", table))  # paid and seen stay null
        events += 1 + 3 + 2
        wait_for("the new columns' changes in Kafka", lambda: written(c, p) >= events + 1, cfg, name)
        summary = drain(c, p, spark=spark)
        assert summary.error is None and summary.dead_lettered == 0, summary.line()
        assert lake_checkpoint(spark, c, p).positions == end_offsets(c, p), summary.line()
        df = spark.read.format("delta").load(str(c.target_path(p)))
        assert {f.name: f.dataType.simpleString() for f in df.schema.fields if f.name in ADDED} == ADDED
        got = mirrored(added=True)
        assert len(got) == 16 and (3, 7, Decimal("-0.001"), 946684799500000) in [(r[0], *r[-3:]) for r in got]
    finally:
        conn.close()
        remove_connector(cfg, name)
        drop_slot(cfg, AVRO_SLOT)
