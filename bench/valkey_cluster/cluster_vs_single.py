"""Drain rate of a four-stream Valkey pipeline on one server against the same pipeline on the embedded
Valkey Cluster, its streams spread over three primaries (bench/valkey_cluster/README.md).

Both sides get the same messages (same seed), are drained batch by batch in one Spark session, one
after the other, and report msg/s, the per-step seconds summed over their batches, and the CPU seconds
each Valkey server process spent meanwhile (/proc utime + stime).

    DELTADRAIN_HOME=/tmp/ddcluster DELTADRAIN_VALKEY_PORT=26499 DELTADRAIN_VALKEY_CLUSTER_PORT=26500 \\
        .venv/bin/python bench/valkey_cluster/cluster_vs_single.py WORKDIR [MESSAGES] [BATCH]

The single Valkey and the cluster of that DELTADRAIN_HOME are started if they are not running, and
stopped again if this started them.
"""

import json
import os
import sys
import time
from pathlib import Path

import yaml

from deltadrain.catchup import drain
from deltadrain.config import load_config
from deltadrain.dev import services
from deltadrain.dev.produce import produce
from deltadrain.dev.services.process import proc_stat
from deltadrain.paths import PROJECT_ROOT
from deltadrain.runtime.session import get_spark

TICK = os.sysconf("SC_CLK_TCK")


def config(workdir: Path, batch: int) -> Path:
    data = yaml.safe_load((PROJECT_ROOT / "config" / "pipelines.yaml").read_text())
    base = next(p for p in data["pipelines"] if p["source"]["kind"] == "valkey")
    base.pop("quality", None)
    pipes = []
    for side, cluster in (("single", False), ("cluster", True)):
        name = f"vc_{side}_{int(time.time())}"
        pipes.append({**base, "name": name, "batch_cap": batch, "min_idle_ms": 60_000,
                      "source": {**base["source"], "cluster": cluster, "streams": [f"{name}:{{{i}}}" for i in range(4)]},
                      "target": {**base["target"], "path": name}})
    data["pipelines"], data["data_dir"] = pipes, str(workdir / "lake")
    path = workdir / "pipelines.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        st = proc_stat(pid)
        total += int(st[11]) + int(st[12]) if st else 0
    return total / TICK


def server_pids(cfg, cluster: bool) -> list[int]:
    if cluster:
        return [n.pid() for n in services.FACTORIES["valkey_cluster"](cfg).nodes]
    return [services.FACTORIES["valkey"](cfg).pid()]


def side(cfg, pipeline, spark, count: int, cluster: bool) -> dict:
    produce(cfg, pipeline, count, seed=11, progress=False)
    pids = server_pids(cfg, cluster)
    cpu0, t0 = cpu_seconds(pids), time.monotonic()
    steps: dict[str, float] = {}
    runs = []
    while True:
        s = drain(cfg, pipeline, spark=spark)
        if s.outcome == "empty":
            break
        assert s.outcome == "committed", s.line()
        runs.append(s.claimed)
        for step, secs in s.timings.items():
            steps[step] = round(steps.get(step, 0) + secs, 2)
    seconds = time.monotonic() - t0
    assert sum(runs) == count, runs
    return {"messages": count, "batches": len(runs), "seconds": round(seconds, 1), "msg_per_s": round(count / seconds),
            "steps_s": steps, "valkey_cpu_s": round(cpu_seconds(pids) - cpu0, 2), "valkey_processes": len(pids)}


def main(workdir: Path, count: int, batch: int) -> dict:
    workdir.mkdir(parents=True, exist_ok=True)
    cfg = load_config(config(workdir, batch))
    single, cluster = cfg.pipelines
    with services.running(cfg, ["valkey", "valkey_cluster"]):
        spark = get_spark("valkey-cluster-bench")
        # A first drain pays the JVM's warm-up, for neither side.
        produce(cfg, single, 20_000, seed=99, progress=False)
        warm = drain(cfg, single, spark=spark)
        report = {"count": count, "batch": batch, "warm_up": warm.claimed,
                  "single_server": side(cfg, single, spark, count, cluster=False),
                  "cluster_3_primaries": side(cfg, cluster, spark, count, cluster=True),
                  "load_average_1m_at_end": os.getloadavg()[0]}
    return report


if __name__ == "__main__":
    out = main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 400_000,
               int(sys.argv[3]) if len(sys.argv) > 3 else 100_000)
    print(json.dumps(out, indent=2))
