"""Event to visible in Delta under the event-driven schedule: a steady flow into a Valkey pipeline whose
ingest DAG has `schedule: "@continuous"`, drained by the embedded Airflow on the warm Spark Connect server
(bench/event_latency/README.md).

The pipeline is the example config's Valkey pipeline (its transform and quality checks included), on a
stream of its own. After a warm-up (the first run creates the table), messages are appended at RATE per
second for SECONDS seconds. Each message's latency is its batch's Delta commit timestamp minus its own
append time (the stream id's milliseconds): the time from the source accepting it to a reader of the
table seeing it. The DAG runs of the steady part say where a cycle's time goes.

    DELTADRAIN_HOME=/tmp/ddev DELTADRAIN_VALKEY_PORT=26391 DELTADRAIN_SPARK_CONNECT_PORT=26013 \\
        DELTADRAIN_AIRFLOW_PORT=26080 .venv/bin/python bench/event_latency/event_latency.py WORKDIR \\
        [SECONDS] [RATE] > RESULT.json

The services of that DELTADRAIN_HOME are started when they are not running and stopped at the end when
this script started them.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from datetime import datetime
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = "ev"


def make_config(workdir: Path) -> Path:
    data = yaml.safe_load((ROOT / "config" / "pipelines.yaml").read_text())
    pipe = next(p for p in data["pipelines"] if p["source"]["kind"] == "valkey")
    pipe.update(name=PIPELINE, target={**pipe["target"], "path": PIPELINE}, schedule="@continuous")
    pipe["source"]["streams"] = [f"{PIPELINE}:{{0}}"]
    data.update(pipelines=[pipe], data_dir=str(workdir / "lake"))
    path = workdir / "pipelines.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def rows_in_lake(path: str):
    from deltalake import DeltaTable

    try:
        return DeltaTable(path).to_pyarrow_table(columns=["_dd_position", "_dd_batch"]).to_pylist()
    except Exception:  # no table yet
        return []


def wait_for(path: str, count: int, timeout: float) -> list[dict]:
    deadline = time.monotonic() + timeout
    while True:
        rows = rows_in_lake(path)
        if len(rows) >= count or time.monotonic() > deadline:
            return rows
        time.sleep(1)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


def stamp(value: str | None) -> float | None:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() if value else None


def run_rows(api, dag_id: str, since: float) -> list[dict]:
    """The DAG's runs that started after `since`, with each task's duration."""
    out = []
    for run in api.runs(dag_id):
        start = stamp(run.get("start_date"))
        if start is None or start < since or run.get("end_date") is None:
            continue
        tasks = api.call("GET", f"/api/v2/dags/{dag_id}/dagRuns/{api._q(run['dag_run_id'])}/taskInstances")
        out.append({"run_id": run["dag_run_id"], "state": run["state"], "start": start,
                    "seconds": round(stamp(run["end_date"]) - start, 3),
                    "tasks": {t["task_id"]: {"state": t["state"], "queued_to_start": round(
                        (stamp(t["start_date"]) or 0) - (stamp(t.get("queued_when")) or stamp(t["start_date"]) or 0), 3)
                        if t.get("start_date") else None,
                        "seconds": t.get("duration")} for t in tasks["task_instances"]}})
    return sorted(out, key=lambda r: r["start"])


def main(workdir: Path, seconds: int, rate: int) -> dict:
    from deltadrain.airflow_api import embedded_api
    from deltadrain.config import load_config
    from deltadrain.dev import services
    from deltadrain.dev.produce import produce
    from deltadrain.lake.delta import recent_commits
    from deltadrain.names import batch_quality_dag_id, ingest_dag_id

    cfg = load_config(make_config(workdir))
    pipeline = cfg.pipeline(PIPELINE)
    table = str(cfg.target_path(pipeline))
    wanted = ["valkey", "spark_connect", "airflow"]
    started = [name for name in wanted if services.FACTORIES[name](cfg).pid() is None]
    services.up(cfg, wanted)
    try:
        api = embedded_api(cfg)
        dag_id = ingest_dag_id(PIPELINE)
        api.wait_for_dag(dag_id)
        produce(cfg, pipeline, 10, seed=0, start=0, progress=False)  # warm-up: the first run creates the table
        checks = batch_quality_dag_id(PIPELINE)
        if separate_checks := checks in {d["dag_id"] for d in api.call("GET", "/api/v2/dags?limit=100")["dags"]}:
            api.unpause(checks)
        api.unpause(dag_id)
        if len(wait_for(table, 10, 600)) < 10:
            raise RuntimeError("the warm-up batch did not reach the table in 10 minutes")
        print("warm-up done", file=sys.stderr)
        flow_start = time.time()
        sent = 10
        for second in range(seconds):
            produce(cfg, pipeline, rate, seed=1 + second, start=sent, progress=False)
            sent += rate
            time.sleep(max(0.0, flow_start + second + 1 - time.time()))
        flow_end = time.time()
        rows = wait_for(table, sent, 600)
        finished = time.time()
        runs = run_rows(api, dag_id, flow_start - 60)
        check_runs = run_rows(api, checks, flow_start - 60) if separate_checks else []
        api.call("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": True})
    finally:
        services.down(cfg, started)

    commit_ts = {c["meta"]["batch"]: c["timestamp"].timestamp()
                 for c in recent_commits(table, 100_000) if (c["meta"] or {}).get("batch") is not None}
    latencies = []
    for row in rows:
        appended = int(row["_dd_position"].split("-")[0]) / 1000
        if appended >= flow_start:
            latencies.append(commit_ts[row["_dd_batch"]] - appended)
    steady = [r for r in runs if r["start"] >= flow_start and r["start"] <= flow_end]
    cycle = [b["start"] - a["start"] for a, b in zip(steady, steady[1:], strict=False)]

    def task_median(task: str) -> float | None:
        values = [r["tasks"][task]["seconds"] for r in steady if task in r["tasks"] and r["tasks"][task]["seconds"]]
        return round(statistics.median(values), 3) if values else None

    return {
        "seconds": seconds, "rate": rate, "messages": sent - 10, "in_lake": len(rows), "measured": len(latencies),
        "latency_s": {"p50": percentile(latencies, 0.5), "p95": percentile(latencies, 0.95),
                      "p99": percentile(latencies, 0.99), "max": round(max(latencies), 3),
                      "min": round(min(latencies), 3)},
        "runs_during_flow": len(steady),
        "cycle_s_median": round(statistics.median(cycle), 3) if cycle else None,
        "run_s_median": round(statistics.median(r["seconds"] for r in steady), 3) if steady else None,
        "task_s_median": {t: task_median(t) for t in ("wait_for_work", "drain", "quality", "alerts")},
        "catch_up_after_flow_s": round(finished - flow_end, 3),
        "checks_in_a_dag_of_their_own": separate_checks,
        "check_runs_during_flow": len([r for r in check_runs if flow_start <= r["start"] <= flow_end]),
        "runs": runs, "check_runs": check_runs, "cpus": os.cpu_count(), "load_avg": os.getloadavg(),
    }


if __name__ == "__main__":
    work = Path(sys.argv[1]).resolve()
    work.mkdir(parents=True, exist_ok=True)
    print(json.dumps(main(work, int(sys.argv[2]) if len(sys.argv) > 2 else 180,
                          int(sys.argv[3]) if len(sys.argv) > 3 else 100), indent=2))
