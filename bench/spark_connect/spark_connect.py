"""A one-row MERGE on a warm Spark Connect server against one in a fresh local driver (docs/benchmarks.md,
"Spark Connect: a warm server"). Each round runs both sides, alternating which goes first, each as a
new Python process the way an Airflow task is one: `connect` makes a Connect session on the embedded
server (`spark.connect_session`), `local` starts a driver (`spark.get_spark`); both then MERGE one new
row into a Delta table of their own with a Delta app transaction (txnAppId, txnVersion = the round).
The server's start (`services up`, until a client's `spark.range(1).count()` answers) is timed first.

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


def one_merge(side: str, table: str, version: int) -> dict:
    """In a process of its own: a session (Connect or a local driver), then a one-row MERGE."""
    t0 = time.perf_counter()
    from deltadrain.config import load_config
    from deltadrain.embedded import spark_connect_url
    from deltadrain.spark import connect_session, get_spark

    spark = connect_session(spark_connect_url(load_config())) if side == "connect" else get_spark("bench-local")
    t1 = time.perf_counter()
    spark.conf.set(TXN_APP, f"bench-{side}")
    spark.conf.set(TXN_VERSION, str(version))
    spark.createDataFrame([(f"r{version}", version)], "id string, v int").createOrReplaceTempView("batch")
    spark.sql(f"MERGE INTO delta.`{table}` t USING batch s ON t.id = s.id "
              "WHEN NOT MATCHED THEN INSERT *").collect()
    t2 = time.perf_counter()
    spark.stop()
    return {"side": side, "session_s": round(t1 - t0, 3), "merge_s": round(t2 - t1, 3)}


def run_side(side: str, table: Path, version: int) -> dict:
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, __file__, "--one", side, str(table), str(version)],
                          capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"{side} round failed:\n{done.stderr[-3000:]}")
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "process_s": round(wall, 3)}


def main(workdir: Path, rounds: int) -> dict:
    import psutil
    from deltalake import DeltaTable

    from deltadrain.config import load_config
    from deltadrain.dev import services
    from deltadrain.embedded import spark_connect_url
    from deltadrain.spark import connect_session

    cfg = load_config()
    server = services.FACTORIES["spark_connect"](cfg)
    started = server.pid() is None
    t0 = time.perf_counter()
    services.up(cfg, ["spark_connect"])
    start_s = round(time.perf_counter() - t0, 3) if started else None
    try:
        tables = {side: workdir / side for side in ("connect", "local")}
        setup = connect_session(spark_connect_url(cfg))
        for table in tables.values():
            setup.sql(f"CREATE TABLE delta.`{table}` (id STRING, v INT) USING delta").collect()
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

    return {"server_start_s": start_s, "server_rss_mib": round(rss / 2**20), "rounds": rows,
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
