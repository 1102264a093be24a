"""The CDC demo's steps (`deltadrain demo --cdc`, deltadrain.dev.cdc_demo) on real PostgreSQL, Debezium, Kafka,
Spark and Delta, with the demo's own config: its tables made and changed, then drained by the pipelines of
config/pipelines.cdc.yaml; then each Delta target equals its table (the orders the demo
purges, a soft delete, left out) and no DLQ holds anything. The demo drains through the Airflow DAGs; here
the drain runs in this process (the DAGs' own tests cover the DAG around it)."""

from __future__ import annotations

import psycopg
import pytest
import yaml

from deltadrain.catchup import drain
from deltadrain.config import load_config
from deltadrain.config.embedded import postgres_conninfo
from deltadrain.dev.cdc_demo import CDC_CONFIG, PURGED, caught_up, make_changes, make_tables, shown_config
from tests.support.lake import dlq_rows

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("debezium_connector")]

WHERE = {"demo_customers": "true", "demo_orders": f"status <> '{PURGED}'"}


def delta_rows(spark, c, p) -> list[tuple]:
    from pyspark.sql import functions as F

    df = spark.read.format("delta").load(str(c.target_path(p)))
    cols = [F.unix_micros(F.col(n)) if t == "timestamp" else F.col(n) for n, t in p.payload_schema.fields.items()]
    return sorted(tuple(r) for r in df.select(*cols).collect())


def pg_rows(conn, p) -> list[tuple]:
    cols = ", ".join(f"(extract(epoch from {n}) * 1000000)::bigint" if t == "timestamp" else n
                     for n, t in p.payload_schema.fields.items())
    table = p.source.topic.removeprefix("cdc.")
    return sorted(tuple(r) for r in conn.execute(f"SELECT {cols} FROM {table} WHERE {WHERE[p.name]}").fetchall())  # noqa: S608


def test_the_cdc_demo_mirrors_its_postgres_tables_into_delta(tmp_path, cfg, spark):
    data = yaml.safe_load(CDC_CONFIG.read_text())
    data["data_dir"] = str(tmp_path / "lake")
    path = tmp_path / "pipelines.cdc.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    c = load_config(path)
    assert shown_config(load_config(CDC_CONFIG)) == "config/pipelines.cdc.yaml"  # what its printed commands carry
    with psycopg.connect(**postgres_conninfo(cfg), autocommit=True) as conn:
        make_tables(conn)
        # One round (the changes to rows a target already holds, over several rounds: test_cdc.py).
        done = make_changes(conn, seed=62, customers=60, orders=150)
        assert min(done.values()) > 0, done
        caught_up(c, conn)
        for p in c.pipelines:
            s = drain(c, p, spark=spark)
            assert s.outcome == "committed" and s.dead_lettered == 0, s
        for p in c.pipelines:
            got, want = delta_rows(spark, c, p), pg_rows(conn, p)
            assert got == want and len(want) > 50, (p.name, len(got), len(want))
            assert dlq_rows(spark, c, p) == [], p.name
