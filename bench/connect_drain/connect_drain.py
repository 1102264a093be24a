"""A one-message batch through the ingest DAG's drain task: on the warm Spark Connect server (executor
`connect`) against spark-submit (executor `submit`), side by side (bench/connect_drain/README.md).

Each round produces one message to a Valkey pipeline of the bench's own, then runs the drain task's own
operator (`DrainOperator.execute`, as Airflow's task runner calls it) in a new Python process, the way
an Airflow task is one, alternating which side goes first. Measured per round: the task's start (the
process's first line) to the batch's commit (the Delta commit's own timestamp), and the whole task.
Each side drains its own pipeline, so neither finds the other's work.

    DELTADRAIN_HOME=/tmp/ddcd DELTADRAIN_VALKEY_PORT=26390 DELTADRAIN_SPARK_CONNECT_PORT=26012 \\
        .venv/bin/python bench/connect_drain/connect_drain.py WORKDIR [ROUNDS] > RESULT.json

The Valkey and Spark Connect services of that DELTADRAIN_HOME are started when they are not running
and stopped at the end when this script started them.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import yaml

ROOT = Path(__file__).resolve().parents[2]
SIDES = ("connect", "submit")


def one_task(config: str, pipeline: str, side: str, round_no: int) -> dict:
    """In a process of its own: the drain task, as Airflow's runner executes it."""
    started = time.time()
    from deltadrain.orchestration.operators import DrainOperator

    ti = SimpleNamespace(dag_id=f"deltadrain__{pipeline}__ingest", run_id=f"bench__{side}_{round_no}", try_number=1)
    context = {"ti": ti, "dag_run": SimpleNamespace(run_type="scheduled"), "data_interval_start": None,
               "data_interval_end": None, "params": {}}
    summary = DrainOperator(task_id="drain", pipeline=pipeline, config=config, executor=side).execute(context)
    ended = time.time()
    with (Path(config).parent / "tasks.jsonl").open("a") as out:  # the drain's own summary: where the time went
        out.write(json.dumps({"side": side, "round": round_no, "started": started, "summary": summary},
                             default=str) + "\n")
    return {"started": started, "ended": ended, "batch": summary["batch"], "claimed": summary["claimed"],
            "outcome": summary["outcome"]}


def commit_time(table: str, batch: int) -> float:
    """The Delta commit of `batch` (its own timestamp), in seconds since the epoch."""
    from deltadrain.lake.checkpoint import find_commit

    commit = find_commit(table, Path(table).name, batch)
    return commit["timestamp"].timestamp()


def run_round(config: Path, cfg, pipeline, side: str, round_no: int) -> dict:
    from deltadrain.dev.produce import produce

    produce(cfg, pipeline, 1, seed=round_no, start=round_no, progress=False)
    env = {k: v for k, v in os.environ.items() if k != "SPARK_CONNECT_MODE_ENABLED"}
    t0 = time.time()
    done = subprocess.run([sys.executable, __file__, "--one", str(config), pipeline.name, side, str(round_no)],
                          capture_output=True, text=True, timeout=900, env=env, cwd=ROOT)
    wall = time.time() - t0
    if done.returncode != 0:
        raise RuntimeError(f"{side} round {round_no} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    task = json.loads(done.stdout.strip().splitlines()[-1])
    assert (task["outcome"], task["claimed"]) == ("committed", 1), task
    committed = commit_time(str(cfg.target_path(pipeline)), task["batch"])
    return {"side": side, "round": round_no, "start_to_commit_s": round(committed - task["started"], 3),
            "task_s": round(task["ended"] - task["started"], 3), "process_s": round(wall, 3)}


def make_config(workdir: Path) -> Path:
    data = yaml.safe_load((ROOT / "config" / "pipelines.yaml").read_text())
    template = next(p for p in data["pipelines"] if p["source"]["kind"] == "valkey")
    pipes = []
    for side in SIDES:
        pipe = json.loads(json.dumps(template))
        pipe.update(name=f"bench_{side}", target={**pipe["target"], "path": f"bench_{side}"})
        pipe["source"]["streams"] = [f"bench_{side}:{{0}}"]
        pipe.pop("quality", None)
        pipes.append(pipe)
    data.update(pipelines=pipes, data_dir=str(workdir / "lake"))
    path = workdir / "pipelines.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def main(workdir: Path, rounds: int) -> dict:
    from deltadrain.config import load_config
    from deltadrain.config.embedded import airflow_env
    from deltadrain.dev import services

    config = make_config(workdir)
    cfg = load_config(config)
    wanted = ["valkey", "spark_connect"]
    started = [name for name in wanted if services.FACTORIES[name](cfg).pid() is None]
    services.up(cfg, wanted)
    # The task reads the `spark_connect` Airflow connection as it would in the embedded Airflow.
    os.environ.update({k: v for k, v in airflow_env(cfg).items() if k.startswith("AIRFLOW_CONN_")})
    try:
        rows = []
        for side in SIDES:  # each side's first batch creates its tables: a warm-up, not a round
            rows.append({**run_round(config, cfg, cfg.pipeline(f"bench_{side}"), side, 0), "warm_up": True})
            print(json.dumps(rows[-1]), file=sys.stderr)
        for r in range(1, rounds + 1):
            for side in (SIDES if r % 2 else SIDES[::-1]):
                rows.append(run_round(config, cfg, cfg.pipeline(f"bench_{side}"), side, r))
                print(json.dumps(rows[-1]), file=sys.stderr)
    finally:
        services.down(cfg, started)

    def median(side: str, key: str) -> float:
        return round(statistics.median(x[key] for x in rows if x["side"] == side and not x.get("warm_up")), 3)

    medians = {side: {k: median(side, k) for k in ("start_to_commit_s", "task_s", "process_s")} for side in SIDES}
    return {"rounds": rows, "median": medians,
            "ratio_start_to_commit": round(medians["connect"]["start_to_commit_s"]
                                           / medians["submit"]["start_to_commit_s"], 3),
            "cpus": os.cpu_count(), "load_avg": os.getloadavg()}


if __name__ == "__main__":
    if sys.argv[1] == "--one":
        print(json.dumps(one_task(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))))
    else:
        work = Path(sys.argv[1]).resolve()
        work.mkdir(parents=True, exist_ok=True)
        print(json.dumps(main(work, int(sys.argv[2]) if len(sys.argv) > 2 else 5), indent=2))
