"""Change data capture end to end, on real parts: a random workload on PostgreSQL tables, captured by Debezium's
Postgres connector into the embedded Kafka broker, drained by deltadrain into upsert targets (docs/cdc.md) by
runs killed at random moments and started again; then each Delta target equals its table, row for row, and the
DLQ holds nothing valid: its one dead letter (a change too large for the pipeline's max_message_bytes) was
replayed once the limit was raised, after its key had been updated again, and changed nothing."""

from __future__ import annotations

import random
import time
import uuid
from decimal import Decimal

import psycopg
import pytest
import yaml
from psycopg import sql

from deltadrain import failpoints
from deltadrain.config import load_config
from deltadrain.config.embedded import debezium_topic, postgres_conninfo
from deltadrain.dev.services.debezium import rest_get
from deltadrain.heal.replay import ReplayRequest, replay
from tests.support.kafka import end_offsets, lake_checkpoint, make_kafka_pipeline
from tests.support.lake import dlq_rows
from tests.support.processes import cli_drain, run_or_killed

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("debezium_connector")]

# Where a run is stopped as a SIGKILL stops it: after its claim, after its dead letters, after it remembered
# its deletes (before its commit), after its commit (before its group commit).
KILL_POINTS = ("after_claim", "after_dead_letters", "after_tombstones", "after_commit")
FIELDS = {"name": "string", "qty": "long", "price": "decimal(18,2)", "active": "boolean", "at": "timestamp"}
COLUMNS = ("name", "qty", "price", "active", "at")
LIMIT = 12_000  # max_message_bytes while the workload runs: the 20 KB change is a dead letter


def q(statement: str, table: str) -> sql.Composed:
    return sql.SQL(statement).format(sql.Identifier(*table.split(".")))


def make_table(conn, keys: tuple[str, ...]) -> str:
    table = f"public.cdc_{uuid.uuid4().hex[:8]}"
    key_cols = ", ".join(f"{k} int NOT NULL" for k in keys)
    conn.execute(q(f"CREATE TABLE {{}} ({key_cols}, name text, qty bigint, price numeric(12,2), active boolean, "
                   f"at timestamp, PRIMARY KEY ({', '.join(keys)}))", table))
    return table


def pipeline_for(tmp_path, table: str, keys: tuple[str, ...]):
    home = tmp_path / table.split(".")[1]
    home.mkdir()
    path, c, p = make_kafka_pipeline(
        home, partitions=1, transform=None, batch_cap=1500, min_idle_ms=500,
        max_message_bytes=LIMIT, source={"topic": debezium_topic(table)},
        target={"path": table.split(".")[1], "mode": "upsert", "order_by": "source.lsn"},
        schema={"envelope": "debezium", "evolution": "add_columns",
                "fields": {**dict.fromkeys(keys, "long"), **FIELDS}})
    return path, c, p


def row_values(rng: random.Random, i: int) -> tuple:
    return (f"n{i}-{rng.randrange(10**6)}", rng.randrange(-10**12, 10**12),
            Decimal(rng.randrange(-10**9, 10**9)) / 100, rng.random() < 0.5,
            f"2026-0{rng.randint(1, 9)}-1{rng.randint(0, 9)} 12:34:56.{rng.randrange(10**6):06d}")


def workload(conn, rng: random.Random, tables: dict[str, tuple[str, ...]], live: dict[str, set], size: int) -> None:
    """Random inserts, updates and deletes, one transaction each, on random tables."""
    for n in range(size):
        table = rng.choice(list(tables))
        keys = tables[table]
        have = live[table]
        roll = rng.random()
        if roll < 0.45 or len(have) < 5:
            k = tuple(rng.randrange(1, 400) for _ in keys)
            if k in have:
                continue
            cols = ", ".join(keys)
            conn.execute(q(f"INSERT INTO {{}} ({cols}, name, qty, price, active, at) VALUES "  # noqa: S608 - our names
                           f"({', '.join(['%s'] * len(keys))}, %s, %s, %s, %s, %s)", table), [*k, *row_values(rng, n)])
            have.add(k)
        elif roll < 0.8:
            k = rng.choice(sorted(have))
            where = " AND ".join(f"{c} = %s" for c in keys)
            conn.execute(q(f"UPDATE {{}} SET name = %s, qty = %s, price = %s, active = %s, at = %s WHERE {where}",  # noqa: S608
                           table), [*row_values(rng, n), *k])
        else:
            k = rng.choice(sorted(have))
            where = " AND ".join(f"{c} = %s" for c in keys)
            conn.execute(q(f"DELETE FROM {{}} WHERE {where}", table), list(k))  # noqa: S608 - our column names
            have.discard(k)


def caught_up(cfg, conn, timeout: float = 120) -> None:
    """Wait until the connector has stored an offset past the database's current WAL position: every change
    made before is in Kafka."""
    lsn = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()[0]
    # A change after it, which the connector's stored offset passes once it has sent everything before.
    conn.execute("CREATE TABLE IF NOT EXISTS public.cdc_marks (id serial PRIMARY KEY)")
    conn.execute("INSERT INTO public.cdc_marks DEFAULT VALUES")
    deadline = time.monotonic() + timeout
    while True:
        stored = max((o["offset"].get("lsn", 0) for o in rest_get(cfg, "/connectors/postgres/offsets")["offsets"]),
                     default=0)
        if stored >= int(lsn):
            return
        assert time.monotonic() < deadline, f"the connector stored no offset past lsn {lsn} ({stored})"
        time.sleep(0.5)


def drain_with_kills(rng: random.Random, c, p, spark, kills: list[str], monkeypatch, max_runs: int = 30) -> None:
    """Drain to the end of the topic; a third of the runs (never two in a row) are stopped at a random point."""
    last_killed = False
    for _ in range(max_runs):
        point = rng.choice(KILL_POINTS) if not last_killed and rng.random() < 0.35 else None

        def hit(name: str, pid=None, point=point) -> None:
            if name == point:
                raise RuntimeError(f"{failpoints.ABANDON}: killed at {name}")

        monkeypatch.setattr(failpoints, "hit", hit)
        got = run_or_killed(c, p, spark)
        monkeypatch.undo()
        last_killed = got == "killed"
        if last_killed:
            kills.append(f"{p.name}@{point}")
            time.sleep(p.min_idle_ms / 1000 + 0.2)  # its claim notices count from here on
            continue
        assert isinstance(got, dict) and got["error"] is None, got
        if lake_checkpoint(spark, c, p).positions == end_offsets(c, p):
            return
    raise AssertionError(f"{p.name}: not drained to the end in {max_runs} runs (kills: {kills})")


def delta_rows(spark, c, p, keys: tuple[str, ...], extra: tuple[str, ...]) -> list[tuple]:
    from pyspark.sql import functions as F

    df = spark.read.format("delta").load(str(c.target_path(p)))
    cols = [*(F.col(k) for k in keys), *(F.col(x) for x in COLUMNS if x != "at"), F.unix_micros("at"),
            *(F.col(x) for x in extra)]
    return sorted(tuple(r) for r in df.select(*cols).collect())


def pg_rows(conn, table: str, keys: tuple[str, ...], extra: tuple[str, ...]) -> list[tuple]:
    cols = ", ".join([*keys, "name", "qty", "price", "active",
                      "(extract(epoch from at) * 1000000)::bigint", *extra])
    return sorted(tuple(r) for r in conn.execute(q(f"SELECT {cols} FROM {{}}", table)).fetchall())  # noqa: S608


@pytest.mark.parametrize("seed", [62])
def test_postgres_changes_through_debezium_drained_with_kills_equal_the_tables_row_for_row(seed, tmp_path, cfg,
                                                                                         spark, monkeypatch,
                                                                                         spark_connect_server):
    rng = random.Random(seed)
    conn = psycopg.connect(**postgres_conninfo(cfg), autocommit=True)
    tables = {make_table(conn, ("id",)): ("id",), make_table(conn, ("a", "b")): ("a", "b"),
              make_table(conn, ("id",)): ("id",)}
    first, second, third = list(tables)
    live: dict[str, set] = {t: set() for t in tables}
    pipes = {t: pipeline_for(tmp_path, t, k) for t, k in tables.items()}
    kills: list[str] = []
    try:
        # Round 1: a random workload, one key updated many times, deleted and inserted again.
        workload(conn, rng, tables, live, 300)
        conn.execute(q("INSERT INTO {} (id, name, qty) VALUES (1000, 'many', 0)", first))
        for v in range(1, 31):
            conn.execute(q("UPDATE {} SET qty = %s, name = %s WHERE id = 1000", first), [v, f"many-{v}"])
        conn.execute(q("DELETE FROM {} WHERE id = 1000", first))
        conn.execute(q("INSERT INTO {} (id, name, qty) VALUES (1000, 'back', 1)", first))
        # One transaction of a couple of thousand rows.
        with conn.transaction():
            for i in range(2000):
                conn.execute(q("INSERT INTO {} (id, name, qty, active) VALUES (%s, %s, %s, true)", third),
                             [10_000 + i, f"bulk {i}", i])
            conn.execute(q("UPDATE {} SET qty = qty + 1 WHERE id % 3 = 0", third))
        live[third] |= {(10_000 + i,) for i in range(2000)}
        # A change too large for max_message_bytes: a dead letter, its key updated again afterwards.
        conn.execute(q("INSERT INTO {} (id, name, qty) VALUES (2000, %s, 1)", first), ["x" * 20_000])
        caught_up(cfg, conn)
        # One run a real SIGKILL ends: a CLI drain, a client of the worker's Connect server as an Airflow task is.
        path2, _, p2 = pipes[second]
        point = rng.choice(("after_claim", "after_commit"))
        proc = cli_drain(path2, p2.name, {failpoints.ENV: point}, remote=True)
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == -9 and failpoints.fired(point) in err, err[-3000:]
        kills.append(f"{p2.name}@{point} (SIGKILL)")
        time.sleep(p2.min_idle_ms / 1000 + 0.2)  # its claim notices count from here on
        for t in tables:
            drain_with_kills(rng, pipes[t][1], pipes[t][2], spark, kills, monkeypatch)
        _, c1, p1 = pipes[first]
        dead = dlq_rows(spark, c1, p1)
        assert [(r.error_type, r.message_id) for r in dead] == [("oversized", '{"id":2000}')], dead

        # Round 2: a column added mid-stream, more random changes, the oversized key updated again.
        conn.execute(q("ALTER TABLE {} ADD COLUMN note text", second))
        workload(conn, rng, tables, live, 200)
        conn.execute(q("UPDATE {} SET note = 'noted ' || a WHERE a % 2 = 0", second))
        conn.execute(q("UPDATE {} SET name = 'small', qty = 2 WHERE id = 2000", first))
        caught_up(cfg, conn)
        for t in tables:
            drain_with_kills(rng, pipes[t][1], pipes[t][2], spark, kills, monkeypatch)

        # The operator raises the limit and replays the dead letter: older than the row, it changes nothing.
        path1 = pipes[first][0]
        data = yaml.safe_load(path1.read_text())
        data["pipelines"][0]["max_message_bytes"] = 1_048_576
        path1.write_text(yaml.safe_dump(data, sort_keys=False))
        c1 = load_config(path1)
        p1 = c1.pipeline(p1.name)
        result = replay(c1, spark, ReplayRequest(pipeline=p1.name, mode="dlq", dry_run=False))
        assert result.replayed == 1, result
        drain_with_kills(rng, c1, p1, spark, kills, monkeypatch)
        pipes[first] = (path1, c1, p1)

        for t, keys in tables.items():
            _, c, p = pipes[t]
            extra = ("note",) if t == second else ()
            assert delta_rows(spark, c, p, keys, extra) == pg_rows(conn, t, keys, extra), (t, kills)
            assert [r for r in dlq_rows(spark, c, p) if r.state == "DEAD"] == [], (t, kills)
        assert {r.state for r in dlq_rows(spark, c1, p1)} == {"REPLAYED"}
        assert conn.execute(q("SELECT name FROM {} WHERE id = 2000", first)).fetchone() == ("small",)
        assert kills, "no run was killed"
    finally:
        conn.close()

