"""The change-data-capture services on real parts: the embedded PostgreSQL (Debian's server), Debezium's
Postgres connector on Kafka Connect's standalone worker, and the embedded Kafka broker it writes into.
A connector SIGKILLed mid-stream resumes from its stored offsets: nothing lost, duplicates allowed."""

from __future__ import annotations

import json
import os
import signal
import stat
import threading
import time
import urllib.error
import urllib.request
import uuid

import psycopg
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from psycopg import sql

from deltadrain.config.embedded import (
    debezium_login_file,
    debezium_topic,
    debezium_url,
    ports,
    postgres_conninfo,
    postgres_login_file,
)
from deltadrain.dev import services
from deltadrain.dev.services.debezium import rest_get
from deltadrain.dev.services.process import pid_alive
from tests.support.processes import beyond_loopback, listening_addresses


def new_table(cfg) -> str:
    """A table of its own (id primary key, name, version), as the deltadrain role; its schema-qualified name."""
    table = f"public.cdc_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(**postgres_conninfo(cfg), autocommit=True) as conn:
        conn.execute(q("CREATE TABLE {} (id int PRIMARY KEY, name text NOT NULL, version int NOT NULL)", table))
        # The whole old row in `before` of updates and deletes (the default keeps only the key).
        conn.execute(q("ALTER TABLE {} REPLICA IDENTITY FULL", table))
    return table


def q(statement: str, table: str) -> sql.Composed:
    """`statement` with the table's quoted name in place of {}."""
    return sql.SQL(statement).format(sql.Identifier(*table.split(".")))


class TopicReader:
    """Reads one topic's partition 0 from its start, keeping every record it has seen."""

    def __init__(self, cfg, topic: str, timeout: float = 60):
        self.consumer = Consumer({"bootstrap.servers": f"127.0.0.1:{ports(cfg).kafka}", "group.id": f"t-{uuid.uuid4()}",
                                  "enable.auto.commit": False, "log_level": 3})
        deadline = time.monotonic() + timeout
        # The worker makes the topic when the table's first change arrives.
        while (meta := self.consumer.list_topics(topic, timeout=5).topics.get(topic)) is None or meta.error:
            assert time.monotonic() < deadline, f"no topic {topic} after {timeout:.0f} s"
            time.sleep(0.5)
        self.consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        self.records: list[dict] = []

    def read_until(self, done, timeout: float, what: str) -> list[dict]:
        deadline = time.monotonic() + timeout
        while not done(self.records):
            assert time.monotonic() < deadline, f"waited {timeout:.0f} s for {what}; {len(self.records)} records"
            msg = self.consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            self.records.append({"offset": msg.offset(), "key": json.loads(msg.key()),
                                 "value": json.loads(msg.value()) if msg.value() is not None else None})
        return self.records

    def close(self) -> None:
        self.consumer.close()


OFFSETS = "/connectors/postgres/offsets"


def stored_lsn(cfg) -> int:
    """The WAL position of the connector's offsets as the worker has stored them (0: none yet)."""
    return max((o["offset"].get("lsn", 0) for o in rest_get(cfg, OFFSETS)["offsets"]), default=0)


def envelopes(records: list[dict]) -> list[dict]:
    """The change events' payloads (Debezium's envelope), tombstones left out."""
    return [r["value"]["payload"] for r in records if r["value"] is not None]


def test_changes_arrive_keyed_by_the_primary_key_with_a_tombstone_after_a_delete(cfg, debezium_connector):
    table = new_table(cfg)
    with psycopg.connect(**postgres_conninfo(cfg), autocommit=True) as conn:
        conn.execute(q("INSERT INTO {} VALUES (1, 'ann', 1), (2, 'bob', 1)", table))
        conn.execute(q("UPDATE {} SET name = 'anne', version = 2 WHERE id = 1", table))
        conn.execute(q("DELETE FROM {} WHERE id = 2", table))

    reader = TopicReader(cfg, debezium_topic(table))
    try:
        records = reader.read_until(lambda rs: len(rs) >= 5, 60, "insert, insert, update, delete, tombstone")
    finally:
        reader.close()

    # The key is the primary key, in Kafka Connect's schema/payload wrapper.
    assert [r["key"]["payload"] for r in records] == [{"id": 1}, {"id": 2}, {"id": 1}, {"id": 2}, {"id": 2}]
    assert [f["field"] for f in records[0]["key"]["schema"]["fields"]] == ["id"]
    assert all(r["value"] is None or set(r["value"]) == {"schema", "payload"} for r in records)
    c1, c2, u1, d2 = envelopes(records)
    assert (c1["op"], c1["before"], c1["after"]) == ("c", None, {"id": 1, "name": "ann", "version": 1})
    assert (c2["op"], c2["after"]) == ("c", {"id": 2, "name": "bob", "version": 1})
    assert (u1["op"], u1["before"], u1["after"]) == ("u", {"id": 1, "name": "ann", "version": 1},
                                                      {"id": 1, "name": "anne", "version": 2})
    assert (d2["op"], d2["before"], d2["after"]) == ("d", {"id": 2, "name": "bob", "version": 1}, None)
    assert records[4]["value"] is None  # the tombstone, for compaction
    assert {e["source"]["table"] for e in (c1, c2, u1, d2)} == {table.split(".")[1]}
    assert u1["source"]["lsn"] > c1["source"]["lsn"]


def test_a_killed_connector_resumes_from_its_stored_offsets_without_loss(cfg, debezium_connector):
    table = new_table(cfg)
    rows, written = 400, []
    stop, killed = threading.Event(), threading.Event()

    def write() -> None:
        # One transaction per change, at a steady pace; the last quarter only once the worker is killed, so
        # that however slow the machine, the kill lands mid-stream and changes are made while it is down.
        with psycopg.connect(**postgres_conninfo(cfg), autocommit=True) as conn:
            for i in range(1, rows + 1):
                if i == rows * 3 // 4 + 1:
                    killed.wait(120)
                if stop.is_set():
                    return
                conn.execute(q("INSERT INTO {} VALUES (%s, %s, 1)", table), [i, f"row {i}"])
                if i % 10 == 0:
                    conn.execute(q("UPDATE {} SET version = 2 WHERE id = %s", table), [i - 5])
                written.append(i)
                time.sleep(0.015)

    writer = threading.Thread(target=write, daemon=True)
    svc = services.FACTORIES["debezium"](cfg)
    reader = None
    try:
        writer.start()
        reader = TopicReader(cfg, debezium_topic(table))
        # A position the worker has stored: the 50th change's, read back from its offsets (KIP-875's API).
        mark = envelopes(reader.read_until(lambda rs: len(rs) >= 60, 60, "the first 60 changes"))[49]["source"]["lsn"]
        deadline = time.monotonic() + 30
        while stored_lsn(cfg) < mark:
            assert time.monotonic() < deadline, f"the worker stored no offset past {mark}: {rest_get(cfg, OFFSETS)}"
            time.sleep(0.2)
        pid = svc.pid()
        os.killpg(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not pid_alive(pid)
        killed.set()
        # Changes made while the connector is down wait in the slot; it is started again meanwhile.
        while len(written) < rows * 3 // 4 + 50 and writer.is_alive():
            time.sleep(0.1)
        assert services.up(cfg, ["debezium"])[0]["result"] == "started"
        writer.join(timeout=60)
        assert not writer.is_alive() and len(written) == rows

        expected = {(i, "c", 1) for i in range(1, rows + 1)} | {(i - 5, "u", 2) for i in range(10, rows + 1, 10)}

        def seen(records):
            return {(e["after"]["id"], e["op"], e["after"]["version"]) for e in envelopes(records)}

        records = reader.read_until(lambda rs: expected <= seen(rs), 90, "every change after the restart")
    finally:
        stop.set()
        killed.set()
        if reader is not None:
            reader.close()
        services.up(cfg, ["debezium"])  # for the tests after this one, whatever happened here

    events = envelopes(records)
    assert seen(records) == expected
    # From its stored offsets, not from scratch: no new snapshot (op r), nothing up to the stored position
    # sent again; what came after it may be (at-least-once).
    assert {e["op"] for e in events} == {"c", "u"}
    early = [e["source"]["lsn"] for e in events if e["source"]["lsn"] <= mark]
    assert len(early) >= 50 and len(early) == len(set(early))
    assert len(events) >= len(expected)


def test_the_services_listen_on_loopback_only_and_want_their_logins(cfg, debezium_connector):
    for name in ("postgres", "debezium"):
        listening = listening_addresses(services.FACTORIES[name](cfg).pid())
        assert listening and not beyond_loopback(listening), (name, listening)
    for login in (postgres_login_file(), debezium_login_file()):
        assert stat.S_IMODE(login.stat().st_mode) == 0o600, login

    with psycopg.connect(**postgres_conninfo(cfg)) as conn:
        assert conn.execute("SHOW wal_level").fetchone() == ("logical",)
        assert conn.execute("SELECT rolsuper, rolreplication FROM pg_roles WHERE rolname = current_user").fetchone() \
            == (False, True)
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(**{**postgres_conninfo(cfg), "password": "wrong"}).close()

    with pytest.raises(urllib.error.HTTPError) as denied:
        urllib.request.urlopen(f"{debezium_url(cfg)}/connectors", timeout=5)
    assert denied.value.code == 401
    assert rest_get(cfg, "/connectors") == ["postgres"]
    # The database password reaches the connector through the worker's file config provider: the REST API
    # shows the reference, never the secret.
    shown = rest_get(cfg, "/connectors/postgres/config")
    assert shown["database.password"].startswith("${file:")
