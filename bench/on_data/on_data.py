"""`schedule: on_data` against `@continuous`, side by side in one embedded Airflow: event to visible in Delta,
and DAG runs per hour while messages flow and while the source is idle (bench/on_data/README.md).

Two copies of the example config's Valkey pipeline (its transform and checks included), each on a stream of
its own, one per schedule, both with `airflow.wait_timeout` WAIT seconds (the continuous sensor's wait, and
the on_data watcher's "wake again" for work left undone) and a 2 s poll. After a warm-up batch each,
RATE messages a second go to each stream for BUSY seconds, then nothing for IDLE seconds. A message's
latency is its batch's Delta commit timestamp minus its append time (the stream id).

    DELTADRAIN_HOME=/tmp/ddod DELTADRAIN_VALKEY_PORT=26491 DELTADRAIN_SPARK_CONNECT_PORT=26413 \\
        DELTADRAIN_AIRFLOW_PORT=26480 .venv/bin/python bench/on_data/on_data.py WORKDIR [BUSY] [RATE] [IDLE] [WAIT] \\
        > RESULT.json

The services of that DELTADRAIN_HOME are started when they are not running and stopped at the end when
this script started them.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import datetime
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
SCHEDULES = {"cont": "@continuous", "data": "on_data"}


def make_config(workdir: Path, wait: int) -> Path:
    data = yaml.safe_load((ROOT / "config" / "pipelines.yaml").read_text())
    example = next(p for p in data["pipelines"] if p["source"]["kind"] == "valkey")
    pipes = []
    for name, schedule in SCHEDULES.items():
        pipe = json.loads(json.dumps(example))
        pipe.update(name=name, target={**pipe["target"], "path": name}, schedule=schedule,
                    airflow={"wait_timeout": f"PT{wait}S", "poll_interval": "PT2S"})
        pipe["source"]["streams"] = [f"{name}:{{0}}"]
        pipes.append(pipe)
    data.update(pipelines=pipes, data_dir=str(workdir / "lake"))
    path = workdir / "pipelines.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def rows_in_lake(path: str) -> list[dict]:
    from deltalake import DeltaTable

    try:
        return DeltaTable(path).to_pyarrow_table(columns=["_dd_position", "_dd_batch"]).to_pylist()
    except Exception:  # no table yet
        return []


def wait_for(paths: list[str], count: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while any(len(rows_in_lake(p)) < count for p in paths):
        if time.monotonic() > deadline:
            raise RuntimeError(f"fewer than {count} rows in {paths} after {timeout:.0f}s")
        time.sleep(1)


def percentile(values: list[float], q: float) -> float | None:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3) if ordered else None


def stamp(value: str | None) -> float | None:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() if value else None


def started_between(api, dag_id: str, start: float, end: float) -> int:
    return sum(1 for r in api.runs(dag_id) if (s := stamp(r.get("start_date") or r.get("queued_at"))) and start <= s < end)


def main(workdir: Path, busy: int, rate: int, idle: int, wait: int) -> dict:
    from deltadrain.airflow_api import embedded_api
    from deltadrain.config import load_config
    from deltadrain.dev import services
    from deltadrain.dev.produce import produce
    from deltadrain.lake.delta import recent_commits
    from deltadrain.names import batch_quality_dag_id, ingest_dag_id

    cfg = load_config(make_config(workdir, wait))
    tables = {name: str(cfg.target_path(cfg.pipeline(name))) for name in SCHEDULES}
    wanted = ["valkey", "spark_connect", "airflow"]
    started = [name for name in wanted if services.FACTORIES[name](cfg).pid() is None]
    services.up(cfg, wanted)
    out: dict = {"busy_s": busy, "rate_per_pipeline": rate, "idle_s": idle, "wait_timeout_s": wait}
    try:
        api = embedded_api(cfg)
        for name in SCHEDULES:
            for dag_id in (ingest_dag_id(name), batch_quality_dag_id(name)):
                api.wait_for_dag(dag_id, timeout=300)
                api.unpause(dag_id)
        for name in SCHEDULES:  # warm-up: the first run creates the table
            produce(cfg, cfg.pipeline(name), 10, seed=0, start=0, progress=False)
        wait_for(list(tables.values()), 10, 600)
        print("warm-up done", file=sys.stderr)
        flow_start, sent = time.time(), 10
        for second in range(busy):
            for name in SCHEDULES:
                produce(cfg, cfg.pipeline(name), rate, seed=1 + second, start=sent, progress=False)
            sent += rate
            time.sleep(max(0.0, flow_start + second + 1 - time.time()))
        flow_end = time.time()
        wait_for(list(tables.values()), sent, 900)
        idle_start = time.time()
        print(f"flow drained {idle_start - flow_end:.0f}s after it ended; idle now", file=sys.stderr)
        time.sleep(idle)
        idle_end = time.time()
        for name in SCHEDULES:
            dag_id = ingest_dag_id(name)
            busy_runs = started_between(api, dag_id, flow_start, flow_end)
            idle_runs = started_between(api, dag_id, idle_start, idle_end)
            commit_ts = {c["meta"]["batch"]: c["timestamp"].timestamp()
                         for c in recent_commits(tables[name], 100_000) if (c["meta"] or {}).get("batch") is not None}
            latencies = [commit_ts[r["_dd_batch"]] - int(r["_dd_position"].split("-")[0]) / 1000
                         for r in rows_in_lake(tables[name])
                         if int(r["_dd_position"].split("-")[0]) / 1000 >= flow_start]
            out[SCHEDULES[name]] = {
                "messages": len(latencies),
                "latency_s": {"p50": percentile(latencies, 0.5), "p95": percentile(latencies, 0.95),
                              "max": round(max(latencies), 3) if latencies else None},
                "runs_busy": busy_runs, "runs_per_hour_busy": round(busy_runs * 3600 / (flow_end - flow_start), 1),
                "runs_idle": idle_runs, "runs_per_hour_idle": round(idle_runs * 3600 / (idle_end - idle_start), 1),
                "run_states": sorted({r["state"] for r in api.runs(dag_id)}),
            }
            api.call("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": True})
    finally:
        services.down(cfg, started)
    out.update(cpus=os.cpu_count(), load_avg=os.getloadavg())
    return out


if __name__ == "__main__":
    work = Path(sys.argv[1]).resolve()
    work.mkdir(parents=True, exist_ok=True)
    args = [int(a) for a in sys.argv[2:6]]
    defaults = [120, 20, 300, 60]
    busy, rate, idle, wait = args + defaults[len(args):]
    print(json.dumps(main(work, busy, rate, idle, wait), indent=2))
