"""What catch-up buys an Airflow drain task (bench/catch_up/README.md), side by side on one machine.

Two Valkey pipelines with the same backlog (own streams, tables and consumer group), each drained
to the end through `spark_jobs/drain.py` under spark-submit, as the ingest DAG's drain task runs it:
one with `airflow.max_batches_per_run: 1` (a job per batch), one with catch-up (one job for the
whole backlog). Which side goes first alternates per round. Wall time includes everything a task
pays: spark-submit, the JVM, the cold first batch.

    DELTADRAIN_HOME=/tmp/ddbench9 DELTADRAIN_VALKEY_PORT=26997 \\
        .venv/bin/python bench/catch_up/catch_up.py WORKDIR [MESSAGES] [BATCH] [ROUNDS]

The Valkey service of that DELTADRAIN_HOME is started if it is not running.
"""

import copy
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import yaml

from deltadrain.config import load_config
from deltadrain.dev import services
from deltadrain.dev.produce import produce
from deltadrain.jobs import SUMMARY_PREFIX
from deltadrain.paths import PROJECT_ROOT
from deltadrain.runtime.session import spark_submit_command


def config(workdir: Path, batch: int, tag: str) -> Path:
    data = yaml.safe_load((PROJECT_ROOT / "config" / "pipelines.yaml").read_text())
    base = next(p for p in data["pipelines"] if p["source"]["kind"] == "valkey")
    pipes = []
    for side, batches in (("per_batch", 1), ("catch_up", 1000)):
        p = copy.deepcopy(base)
        name = f"cu_{side}_{tag}"
        p.update(name=name, batch_cap=batch, transform="deltadrain.transforms.identity", target={"path": name},
                 airflow={"max_batches_per_run": batches, "max_drain_time": "PT25M"})
        p["source"].update(streams=[f"{name}:{{{i}}}" for i in range(4)], group=f"{name}-group")
        p.pop("quality", None)
        pipes.append(p)
    data.update(pipelines=pipes, data_dir=str(workdir / "lake"))
    path = workdir / f"catch_up_{tag}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def drain_to_the_end(path: Path, name: str, count: int) -> dict:
    """Run the drain job until all `count` messages are claimed (the ingest DAG's sensor starts no job
    when nothing waits); wall time and what each job reported."""
    jobs, started = [], time.monotonic()
    while sum(j["claimed"] for j in jobs) < count:
        t = time.monotonic()
        done = subprocess.run(spark_submit_command(str(PROJECT_ROOT / "spark_jobs" / "drain.py"),
                                                   [name, "--config", str(path)]),
                              capture_output=True, text=True, timeout=3600)
        if done.returncode != 0:
            raise SystemExit(f"{name}: the drain job failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
        line = [x for x in done.stdout.splitlines() if x.startswith(SUMMARY_PREFIX)][-1]
        s = json.loads(line[len(SUMMARY_PREFIX):])
        jobs.append({"wall_s": round(time.monotonic() - t, 2), "claimed": s["claimed"], "batches": s["batches"],
                     "drain_s": s["seconds"], "stopped": s["stopped"]})
        if s["claimed"] == 0:
            raise SystemExit(f"{name}: a job claimed nothing with {count - sum(j['claimed'] for j in jobs)} left")
    claimed = sum(j["claimed"] for j in jobs)
    wall = time.monotonic() - started
    return {"messages": claimed, "wall_s": round(wall, 1), "rate": round(claimed / wall), "jobs": jobs}


def main(workdir: Path, count: int, batch: int, rounds: int) -> dict:
    workdir.mkdir(parents=True, exist_ok=True)
    out = {"messages": count, "batch_cap": batch, "rounds": []}
    for r in range(rounds):
        path = config(workdir, batch, f"{r}{uuid.uuid4().hex[:4]}")
        cfg = load_config(path)
        services.up(cfg, ["valkey"])
        for p in cfg.pipelines:
            produce(cfg, p, count, seed=11, progress=False)
        sides = [p.name for p in cfg.pipelines]
        result = {}
        for name in sides if r % 2 == 0 else reversed(sides):
            result["per_batch" if "_per_batch_" in name else "catch_up"] = drain_to_the_end(path, name, count)
        result["speedup"] = round(result["per_batch"]["wall_s"] / result["catch_up"]["wall_s"], 2)
        out["rounds"].append(result)
    out["per_batch_wall_s"] = round(sum(x["per_batch"]["wall_s"] for x in out["rounds"]), 1)
    out["catch_up_wall_s"] = round(sum(x["catch_up"]["wall_s"] for x in out["rounds"]), 1)
    out["speedup"] = round(out["per_batch_wall_s"] / out["catch_up_wall_s"], 2)
    return out


if __name__ == "__main__":
    a = sys.argv[1:]
    print(json.dumps(main(Path(a[0]), int(a[1]) if len(a) > 1 else 1_000_000, int(a[2]) if len(a) > 2 else 200_000,
                          int(a[3]) if len(a) > 3 else 2), indent=1))
