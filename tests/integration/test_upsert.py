"""Upsert mode (`target.mode: upsert`, docs/cdc.md) on a real broker, Spark and Delta: a Kafka topic of entity
states keyed by their id drains into a table that holds each key once, in its newest state, with deletes by
tombstone and by `delete_when`, an older state sent again afterwards changes nothing, and a state the target's
constraints refuse is a dead letter."""

from __future__ import annotations

import json
import time

import pytest
from confluent_kafka import Producer

from deltadrain.catchup import drain
from deltadrain.lake.delta import table_version
from deltadrain.sources.kafka.client import kafka_client_conf
from tests.support.kafka import make_kafka_pipeline
from tests.support.lake import dlq_rows

pytestmark = pytest.mark.usefixtures("kafka_broker")

SCHEMA = {"fields": {"id": "long", "name": "string", "version": "long", "gone": "boolean"}}


def states(spark, c, p) -> dict[int, tuple]:
    rows = spark.read.format("delta").load(str(c.target_path(p))).collect()
    assert len(rows) == len({r.id for r in rows}), "a key held twice"
    return {r.id: (r.name, r.asDict().get("version")) for r in rows}


@pytest.mark.parametrize("order_by", ["version"])  # position order: the Valkey test below
def test_entity_states_upsert_newest_per_key_with_tombstones_deletes_and_an_older_redelivery(order_by, tmp_path,
                                                                                             spark):
    _, c, p = make_kafka_pipeline(tmp_path, partitions=2, schema=SCHEMA, transform=None,
                                  target={"path": f"up_{order_by}", "mode": "upsert", "key": ["id"],
                                          "order_by": order_by, "delete_when": {"field": "gone", "equals": True}})
    producer = Producer(kafka_client_conf(c, p))
    topic = p.source.topic

    def send(key: int, value: dict | None) -> None:
        # Keyed by the id, as Kafka users do: a key's states stay in one partition.
        producer.produce(topic, None if value is None else json.dumps(value).encode(), key=str(key).encode(),
                         partition=key % 2)

    for v in range(1, 6):  # key 1 updated five times in one batch
        send(1, {"id": 1, "name": f"one-{v}", "version": v})
    send(2, {"id": 2, "name": "two", "version": 1})
    send(3, {"id": 3, "name": "three", "version": 1})
    send(3, {"id": 3, "name": "three", "version": 2})
    send(3, None)  # a tombstone deletes 3 (ordered after version 2: it takes the value it follows)
    send(4, {"id": 4, "name": "four", "version": 1})
    send(4, {"id": 4, "name": "four", "version": 2, "gone": True})  # delete_when
    send(5, {"id": 5, "name": "five", "version": 1})
    send(5, None)
    send(5, {"id": 5, "name": "five again", "version": 2})  # deleted and inserted again
    producer.produce(topic, b'{"name": "no id"}', key=b"6", partition=0)  # no key column: a dead letter
    producer.flush(30)
    s = drain(c, p, spark=spark)
    assert s.outcome == "committed" and s.claimed == 15 and s.dead_lettered == 1
    assert states(spark, c, p) == {1: ("one-5", 5), 2: ("two", 1), 5: ("five again", 2)}
    assert table_version(str(c.target_path(p))) == 0, "the first batch did not create the table in its commit"
    assert [r.error_type for r in dlq_rows(spark, c, p)] == ["missing_key"]

    # Next batch: an older state of 1 and of 3 (deleted) arrive late, 2 is updated.
    send(1, {"id": 1, "name": "one-2", "version": 2})
    send(3, {"id": 3, "name": "three", "version": 1})
    send(2, {"id": 2, "name": "two-2", "version": 2})
    producer.flush(30)
    remembered = table_version(str(c.tombstones_path(p)))
    assert remembered is not None, "the first batch's deletes made no tombstone table"
    s = drain(c, p, spark=spark)
    assert s.outcome == "committed"
    assert table_version(str(c.tombstones_path(p))) == remembered, "a batch without deletes wrote tombstones"
    got = states(spark, c, p)
    if order_by == "version":  # the late versions are older than what the table holds or remembers
        assert got == {1: ("one-5", 5), 2: ("two-2", 2), 5: ("five again", 2)}
    else:  # by position, a later record is a newer state, whatever its payload says
        assert got == {1: ("one-2", 2), 2: ("two-2", 2), 3: ("three", 1), 5: ("five again", 2)}
    # 2 deleted by tombstone: remembered in a commit of the tombstone table.
    send(2, None)
    producer.flush(30)
    assert drain(c, p, spark=spark).outcome == "committed"
    assert 2 not in states(spark, c, p)
    assert table_version(str(c.tombstones_path(p))) == remembered + 1

    # A constraint the operator put on the target refuses key 8's newest state: that message is a dead letter
    # naming it, the batch is decided again without it (8's older state is then its newest), the rest commits.
    spark.sql(f"ALTER TABLE delta.`{c.target_path(p)}` ADD CONSTRAINT no_bad_names CHECK (name <> 'bad')")
    send(8, {"id": 8, "name": "eight", "version": 1})
    send(8, {"id": 8, "name": "bad", "version": 2})
    send(1, {"id": 1, "name": "one-6", "version": 6})
    producer.flush(30)
    s = drain(c, p, spark=spark)
    assert (s.outcome, s.claimed, s.dead_lettered, s.written) == ("committed", 3, 1, 2), s.line()
    assert states(spark, c, p) == {1: ("one-6", 6), 5: ("five again", 2), 8: ("eight", 1)}
    refused = [r for r in dlq_rows(spark, c, p) if r.error_type == "refused"]
    assert len(refused) == 1 and json.loads(bytes(refused[0].original))["name"] == "bad"
    assert refused[0].error.startswith("the target table refused its row: CHECK constraint no_bad_names (")


def test_a_backfill_of_an_upsert_target_heals_lost_rows_and_rolls_none_back(tmp_path, spark):
    """Rows lost from an upsert target (deleted behind the drain's back) come back from the source's history in
    their newest state; a key deleted in that history stays deleted, and a key the table holds newer than the
    interval is not rolled back. Run twice, the second backfill changes nothing."""
    from datetime import UTC, datetime, timedelta

    from delta.tables import DeltaTable

    from deltadrain.heal.backfill import backfill

    _, c, p = make_kafka_pipeline(tmp_path, partitions=1, schema=SCHEMA, transform=None,
                                  target={"path": "up_heal", "mode": "upsert", "key": ["id"], "order_by": "version"})
    producer = Producer(kafka_client_conf(c, p))

    def send(key: int, value: dict | None) -> None:
        producer.produce(p.source.topic, None if value is None else json.dumps(value).encode(), key=str(key).encode())

    began = datetime.now(UTC) - timedelta(seconds=5)
    for v in (1, 2, 3):
        send(1, {"id": 1, "name": f"one-{v}", "version": v})
    send(2, {"id": 2, "name": "two", "version": 1})
    send(3, {"id": 3, "name": "three", "version": 1})
    send(3, None)
    send(4, {"id": 4, "name": "four", "version": 2})
    producer.flush(30)
    assert drain(c, p, spark=spark).outcome == "committed"
    ended = datetime.now(UTC) + timedelta(seconds=1)
    time.sleep(1.5)
    send(2, {"id": 2, "name": "two-5", "version": 5})  # after the interval
    producer.flush(30)
    assert drain(c, p, spark=spark).outcome == "committed"
    DeltaTable.forPath(spark, str(c.target_path(p))).delete("id IN (1, 4)")
    assert states(spark, c, p) == {2: ("two-5", 5)}

    healed = backfill(c, p, spark, began, ended)
    assert (healed.read, healed.written, healed.skipped_truncates, healed.skipped_refused) == (7, 2, 0, []), healed
    assert states(spark, c, p) == {1: ("one-3", 3), 2: ("two-5", 5), 4: ("four", 2)}
    again = backfill(c, p, spark, began, ended)
    assert (again.read, again.written) == (7, 0)
    assert states(spark, c, p) == {1: ("one-3", 3), 2: ("two-5", 5), 4: ("four", 2)}


@pytest.mark.usefixtures("valkey_server")
def test_a_valkey_stream_of_entity_states_upserts_in_stream_order_with_soft_deletes(tmp_path, spark):
    """An application publishing its entities' states to one Valkey stream, ordered by position (the stream's
    order, whatever the payload's version says): the last state per key, soft deletes by `delete_when`, a key
    deleted in one batch and written again in the next, an entry without its key a dead letter."""
    from tests.support.valkey import make_pipeline, valkey_admin

    _, c, p = make_pipeline(tmp_path, partitions=1, schema=SCHEMA, transform=None,
                            target={"path": "up_valkey", "mode": "upsert", "key": ["id"],
                                    "delete_when": {"field": "gone", "equals": True}})
    stream = p.source.streams[0]
    admin = valkey_admin()
    for fields in ({"id": 1, "name": "a", "version": 2}, {"id": 1, "name": "last", "version": 1},
                   {"id": 2, "name": "b", "version": 1}, {"id": 2, "name": "b", "version": 2, "gone": True},
                   {"id": 3, "name": "c", "version": 1}, {"name": "no key", "version": 1}):
        admin.xadd(stream, {"data": json.dumps(fields)})
    s = drain(c, p, spark=spark)
    assert s.outcome == "committed" and s.dead_lettered == 1, s
    assert states(spark, c, p) == {1: ("last", 1), 3: ("c", 1)}
    admin.xadd(stream, {"data": json.dumps({"id": 2, "name": "b again", "version": 1})})
    admin.xadd(stream, {"data": json.dumps({"id": 3, "name": "c", "version": 1, "gone": True})})
    assert drain(c, p, spark=spark).outcome == "committed"
    assert states(spark, c, p) == {1: ("last", 1), 2: ("b again", 1)}
    assert [r.error_type for r in dlq_rows(spark, c, p)] == ["missing_key"]


def test_a_debezium_truncate_fails_the_run_in_one_line_unless_the_target_may_be_truncated_too(tmp_path, spark):
    """Debezium's `op: t` (a TRUNCATE of the source table): under on_truncate fail the run stops, naming the
    table and the fix, with nothing committed; under truncate the batch's commit empties the target and keeps
    what came after the truncate."""
    import yaml

    from deltadrain.config import load_config
    from deltadrain.run.drain import DrainError

    path, c, p = make_kafka_pipeline(tmp_path, partitions=1, transform=None,
                                     schema={"envelope": "debezium", "fields": {"id": "long", "name": "string"}},
                                     target={"path": "up_truncate", "mode": "upsert", "order_by": "source.lsn"})
    producer = Producer(kafka_client_conf(c, p))
    source = {"connector": "postgresql", "db": "shop", "schema": "public", "table": "people"}

    def send(op: str, row: dict | None, lsn: int) -> None:
        key = json.dumps({"id": row["id"]}).encode() if row else None
        event = {"op": op, "before": None, "after": row, "ts_ms": 1, "source": {**source, "lsn": lsn}}
        producer.produce(p.source.topic, json.dumps(event).encode(), key=key, partition=0)

    send("c", {"id": 1, "name": "a"}, 10)
    send("c", {"id": 2, "name": "b"}, 20)
    producer.flush(30)
    assert drain(c, p, spark=spark).outcome == "committed"
    send("t", None, 30)
    send("c", {"id": 3, "name": "c"}, 40)
    producer.flush(30)
    with pytest.raises(DrainError, match=r"shop\.public\.people was truncated \(Debezium op 't' at lsn 30\).*"
                                         r"target\.on_truncate: truncate"):
        drain(c, p, spark=spark)
    assert states(spark, c, p) == {1: ("a", None), 2: ("b", None)}
    data = yaml.safe_load(path.read_text())
    data["pipelines"][0]["target"]["on_truncate"] = "truncate"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    c = load_config(path)
    p = c.pipeline(p.name)
    assert drain(c, p, spark=spark).outcome == "committed"
    assert states(spark, c, p) == {3: ("c", None)}
