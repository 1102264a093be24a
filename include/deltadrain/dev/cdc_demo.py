"""`deltadrain demo --cdc`: PostgreSQL, Debezium, Kafka, Spark Connect and Airflow up; the demo's tables made
and changed (inserts, updates, deletes); each table's ingest DAG drains its change topic into an upsert target;
where to look. The steps are functions of their own so that a test runs them without the Airflow scheduler."""

from __future__ import annotations

import random
import time
from pathlib import Path

from deltadrain.config import DeltadrainConfig
from deltadrain.config.embedded import (
    airflow_login,
    airflow_password_file,
    ports,
    postgres_conninfo,
    postgres_login_file,
)
from deltadrain.dev import services
from deltadrain.paths import PROJECT_ROOT

CDC_CONFIG = PROJECT_ROOT / "config" / "pipelines.cdc.yaml"
SERVICES = ["kafka", "postgres", "debezium", "spark_connect", "airflow"]
TABLES = {
    "public.demo_customers": "id bigint PRIMARY KEY, name text NOT NULL, email text, balance numeric(12,2), "
                             "active boolean, updated_at timestamp",
    "public.demo_orders": "id bigint PRIMARY KEY, customer_id bigint NOT NULL, amount numeric(12,2), "
                          "status text NOT NULL, created_at timestamp",
}
# The orders the demo soft-deletes: `delete_when` on the pipeline takes them out of the target.
PURGED = "purged"
STATUSES = ("new", "paid", "shipped", "cancelled")


def make_tables(conn) -> None:
    for table, columns in TABLES.items():
        conn.execute(f"CREATE TABLE IF NOT EXISTS {table} ({columns})")


def make_changes(conn, seed: int = 62, customers: int = 200, orders: int = 600) -> dict[str, int]:
    """Inserts, updates and deletes on the demo's tables, one transaction per statement as an application
    makes them, on top of whatever an earlier run left (new ids start after the largest): a customer updated
    twenty times, one deleted and inserted again, deletes, orders moved through their statuses and some
    purged (a soft delete). Returns how many statements of each kind ran."""
    rng = random.Random(seed)
    done = {"insert": 0, "update": 0, "delete": 0}

    def run(kind: str, statement: str, args: list) -> None:
        conn.execute(statement, args)
        done[kind] += 1

    start_c = conn.execute("SELECT coalesce(max(id), 0) FROM public.demo_customers").fetchone()[0] + 1
    start_o = conn.execute("SELECT coalesce(max(id), 0) FROM public.demo_orders").fetchone()[0] + 1
    cust = list(range(start_c, start_c + customers))
    for i in cust:
        run("insert", "INSERT INTO public.demo_customers VALUES (%s, %s, %s, %s, true, now())",
            [i, f"customer {i}", f"c{i}@example.com", rng.randrange(0, 100000) / 100])
    for i in range(start_o, start_o + orders):
        run("insert", "INSERT INTO public.demo_orders VALUES (%s, %s, %s, 'new', now())",
            [i, rng.choice(cust), rng.randrange(100, 50000) / 100])
    for _ in range(customers):
        run("update", "UPDATE public.demo_customers SET balance = %s, updated_at = now() WHERE id = %s",
            [rng.randrange(-10000, 100000) / 100, rng.choice(cust)])
    for v in range(20):  # one key changed many times between two drains: only its newest state lands
        run("update", "UPDATE public.demo_customers SET name = %s, updated_at = now() WHERE id = %s",
            [f"renamed {v}", cust[0]])
    for i in rng.sample(cust[1:], customers // 10):
        run("delete", "DELETE FROM public.demo_customers WHERE id = %s", [i])
    run("delete", "DELETE FROM public.demo_customers WHERE id = %s", [cust[0]])
    run("insert", "INSERT INTO public.demo_customers VALUES (%s, 'back again', NULL, 0, false, now())", [cust[0]])
    order_ids = list(range(start_o, start_o + orders))
    for i in rng.sample(order_ids, orders // 2):
        run("update", "UPDATE public.demo_orders SET status = %s WHERE id = %s", [rng.choice(STATUSES[1:]), i])
    picked = rng.sample(order_ids, orders // 10)
    for i in picked[: len(picked) // 2]:
        run("delete", "DELETE FROM public.demo_orders WHERE id = %s", [i])
    for i in picked[len(picked) // 2:]:
        run("update", "UPDATE public.demo_orders SET status = %s WHERE id = %s", [PURGED, i])
    return done


def caught_up(cfg: DeltadrainConfig, conn, timeout: float = 180) -> None:
    """Wait until Debezium has stored an offset past the database's current WAL position: every change
    made before it is in Kafka."""
    from deltadrain.dev.services.debezium import rest_get

    lsn = int(conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()[0])
    # A change after that position, which the stored offset passes once everything before it was sent.
    conn.execute("CREATE TABLE IF NOT EXISTS public.demo_marks (id serial PRIMARY KEY)")
    conn.execute("INSERT INTO public.demo_marks DEFAULT VALUES")
    deadline = time.monotonic() + timeout
    while True:
        offsets = rest_get(cfg, "/connectors/postgres/offsets")["offsets"]
        if max((o["offset"].get("lsn", 0) for o in offsets), default=0) >= lsn:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"Debezium sent nothing past WAL position {lsn} in {timeout:.0f} s; "
                               "see services/debezium/debezium.log under the services' home")
        time.sleep(0.5)


def shown_config(cfg: DeltadrainConfig) -> str:
    """The config's path as the printed commands give it: relative to the repository when it is in it."""
    path = Path(cfg.source_file or CDC_CONFIG).resolve()
    return str(path.relative_to(PROJECT_ROOT)) if path.is_relative_to(PROJECT_ROOT) else str(path)


def run_cdc_demo(cfg: DeltadrainConfig) -> dict[str, dict]:
    import psycopg

    from deltadrain.airflow_api import embedded_api
    from deltadrain.names import ingest_dag_id

    print("== starting the services (Kafka, PostgreSQL, Debezium, Spark Connect, Airflow)")
    for row in services.up(cfg, SERVICES):
        print(f"   {row['service']}: {row['result']} ({row.get('address', '')})")
    with psycopg.connect(**postgres_conninfo(cfg), autocommit=True) as conn:
        make_tables(conn)
        print("== changing the PostgreSQL tables " + ", ".join(TABLES))
        print(f"   {make_changes(conn)} statements")
        print("== waiting for Debezium to send every change to Kafka (topics cdc.public.demo_*)")
        caught_up(cfg, conn)
    api = embedded_api(cfg)
    summaries: dict[str, dict] = {}
    for p in cfg.pipelines:
        dag_id = ingest_dag_id(p.name)
        print(f"== triggering the Airflow DAG {dag_id} (newest change per key MERGEd, deletes applied, "
              "offsets in the same commit)")
        api.wait_for_dag(dag_id)
        api.unpause(dag_id)
        api.trigger(dag_id)
        run_id, summary = api.wait_for_drain(dag_id)
        print(f"   run {run_id}: drain succeeded")
        summaries[p.name] = summary
    user, _ = airflow_login()
    port = ports(cfg).airflow
    config = shown_config(cfg)
    bin_ = f".venv/bin/deltadrain --config {config}"
    print("== where to look")
    for p in cfg.pipelines:
        print(f"   {p.name}: Delta table {cfg.target_path(p)}, DLQ {cfg.dlq_path(p)}")
        print(f"      status:       {bin_} status {p.name}")
        print(f"      dead letters: {bin_} dlq list {p.name}")
        print(f"      deletes remembered (tombstone table): {cfg.tombstones_path(p)}")
    print(f"   Airflow UI:   http://127.0.0.1:{port}  login: {user}, password in {airflow_password_file()}")
    print(f"   DAG runs:     http://127.0.0.1:{port}/dags/{ingest_dag_id(cfg.pipelines[0].name)}")
    print(f"   change more, then drain again: PostgreSQL on 127.0.0.1:{ports(cfg).postgres}, database deltadrain "
          f"(login in {postgres_login_file()}), then {bin_} drain {cfg.pipelines[0].name}")
    print(f"   stop it all:  {bin_} services down")
    return summaries
