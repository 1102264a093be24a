"""A one-row MERGE on a warm Spark Connect server against one in a fresh local driver
(bench/spark_connect/README.md). Each round runs both sides, alternating which goes first, each as a new
Python process the way an Airflow task is one: `connect` makes a Connect session on the embedded
server (`spark.connect_session`), `local` starts a driver (`spark.get_spark`); both then MERGE one new
row into a Delta table of their own with a Delta app transaction (txnAppId, txnVersion = the round).
The server's start (`services up`, until a client's `spark.range(1).count()` answers) is timed first,
then its first MERGE (a warm-up, on a table of its own).

    DELTADRAIN_HOME=/tmp/ddsc DELTADRAIN_SPARK_CONNECT_PORT=25012 \\
        .venv/bin/python bench/spark_connect/spark_connect.py WORKDIR [ROUNDS] > RESULT.json

The Spark Connect service of that DELTADRAIN_HOME is started if it is not running (its start is then
not timed) and stopped at the end only if this script started it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

TXN_APP = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"


def merge_one_row(spark, table: str, app: str, version: int) -> None:
    spark.conf.set(TXN_APP, app)
    spark.conf.set(TXN_VERSION, str(version))
    spark.createDataFrame([(f"r{version}", version)], "id string, v int").createOrReplaceTempView("batch")
    spark.sql(f"MERGE INTO delta.`{table}` t USING batch s ON t.id = s.id "
              "WHEN NOT MATCHED THEN INSERT *").collect()


def one_merge(side: str, table: str, version: int) -> dict:
    """In a process of its own: a session (Connect or a local driver), then a one-row MERGE."""
    t0 = time.perf_counter()
    from deltadrain.config import load_config
    from deltadrain.config.embedded import spark_connect_url
    from deltadrain.runtime.session import connect_session, get_spark

    spark = connect_session(spark_connect_url(load_config())) if side == "connect" else get_spark("bench-local")
    t1 = time.perf_counter()
    merge_one_row(spark, table, f"bench-{side}", version)
    t2 = time.perf_counter()
    spark.stop()
    return {"side": side, "session_s": round(t1 - t0, 3), "merge_s": round(t2 - t1, 3)}


def run_side(side: str, table: Path, version: int) -> dict:
    t0 = time.perf_counter()
    # A process that made a Connect session carries pyspark's Connect mark in its environment (this one
    # did, for the setup): a child that inherited it could not start a local driver.
    env = {k: v for k, v in os.environ.items() if k != "SPARK_CONNECT_MODE_ENABLED"}
    done = subprocess.run([sys.executable, __file__, "--one", side, str(table), str(version)],
                          capture_output=True, text=True, timeout=600, env=env)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"{side} round failed:\n{done.stderr[-3000:]}")
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "process_s": round(wall, 3)}


def main(workdir: Path, rounds: int) -> dict:
    import psutil
    from deltalake import DeltaTable

    from deltadrain.config import load_config
    from deltadrain.config.embedded import spark_connect_url
    from deltadrain.dev import services
    from deltadrain.runtime.session import connect_session

    cfg = load_config()
    server = services.FACTORIES["spark_connect"](cfg)
    started = server.pid() is None
    t0 = time.perf_counter()
    services.up(cfg, ["spark_connect"])
    start_s = round(time.perf_counter() - t0, 3) if started else None
    try:
        tables = {side: workdir / side for side in ("connect", "local")}
        setup = connect_session(spark_connect_url(cfg))
        for table in [*tables.values(), workdir / "warm_up"]:
            setup.sql(f"CREATE TABLE delta.`{table}` (id STRING, v INT) USING delta").collect()
        # The server's first MERGE compiles what later ones reuse: timed apart, so the rounds are warm.
        t1 = time.perf_counter()
        merge_one_row(setup, str(workdir / "warm_up"), "bench-warm-up", 0)
        first_merge_s = round(time.perf_counter() - t1, 3)
        setup.stop()
        rows = []
        for r in range(rounds):
            order = ("connect", "local") if r % 2 == 0 else ("local", "connect")
            for side in order:
                rows.append({"round": r, **run_side(side, tables[side], r)})
                print(json.dumps(rows[-1]), file=sys.stderr)
        for side, table in tables.items():
            assert DeltaTable(str(table)).transaction_version(f"bench-{side}") == rounds - 1
            assert len(DeltaTable(str(table)).to_pyarrow_table()) == rounds
        proc = psutil.Process(server.pid())
        rss = proc.memory_info().rss + sum(c.memory_info().rss for c in proc.children(recursive=True))
    finally:
        if started:
            services.down(cfg, ["spark_connect"])

    def median(side: str, key: str) -> float:
        import statistics

        return round(statistics.median(x[key] for x in rows if x["side"] == side), 3)

    return {"server_start_s": start_s, "server_first_merge_s": first_merge_s, "server_rss_mib": round(rss / 2**20), "rounds": rows,
            "median": {side: {k: median(side, k) for k in ("session_s", "merge_s", "process_s")}
                       for side in ("connect", "local")},
            "cpus": os.cpu_count()}


if __name__ == "__main__":
    if sys.argv[1] == "--one":
        print(json.dumps(one_merge(sys.argv[2], sys.argv[3], int(sys.argv[4]))))
    else:
        work = Path(sys.argv[1]).resolve()
        work.mkdir(parents=True, exist_ok=True)
        print(json.dumps(main(work, int(sys.argv[2]) if len(sys.argv) > 2 else 5), indent=2))
