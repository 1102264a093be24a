"""The Spark Connect server's memory over many small batches: does a server that lives for weeks grow?
(bench/connect_memory/README.md).

One Valkey pipeline of the bench's own; each batch produces MESSAGES messages and drains them with the
drain job (`jobs.run("drain", ...)`, what the ingest DAG's task runs) on a new Connect session, stopped
after it, as each task has its own. Every EVERY batches (and after the first): the server JVM's live
heap (`jcmd PID GC.class_histogram` runs a full GC first and totals the live objects), its used heap
after that GC (`GC.heap_info`), its loaded classes, and the resident memory of the JVM and of its Python
workers. Then a least-squares slope of each over the batches, in MiB per 100 batches, over all samples
and over the second half (past the warm-up).

    DELTADRAIN_HOME=/tmp/ddmem DELTADRAIN_VALKEY_PORT=27479 DELTADRAIN_SPARK_CONNECT_PORT=27115 \\
        .venv/bin/python bench/connect_memory/connect_memory.py WORKDIR [BATCHES [EVERY [MESSAGES [MINUTES]]]] \\
        > RESULT.json

MINUTES (optional) stops the loop early, at the next sample, once that many minutes have passed: the
result says how many batches ran. The Valkey and Spark Connect services of that DELTADRAIN_HOME are
started when they are not running and stopped at the end when this script started them.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def jcmd() -> str:
    java_home = os.environ.get("JAVA_HOME")
    for candidate in ([Path(java_home) / "bin" / "jcmd"] if java_home else []) + [
            Path("/usr/lib/jvm/java-17-openjdk-amd64/bin/jcmd")]:
        if candidate.exists():
            return str(candidate)
    found = shutil.which("jcmd")
    if not found:
        raise SystemExit("no jcmd: set JAVA_HOME to the JDK the server runs on")
    return found


def _jcmd(pid: int, *command: str) -> str:
    return subprocess.run([jcmd(), str(pid), *command], capture_output=True, text=True, check=True,
                          timeout=300).stdout


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _descendants(root: int) -> list[int]:
    from deltadrain.runtime.python_daemon import parent_pids

    parents = parent_pids()
    out, stack = [], [root]
    while stack:
        pid = stack.pop()
        kids = [p for p, parent in parents.items() if parent == pid]
        out += kids
        stack += kids
    return out


# Classes of Spark's status store (what its UI would show of past queries, jobs, stages and tasks).
STATUS_STORE = ("org.apache.spark.status.", "org.apache.spark.sql.execution.ui.")


def sample(pid: int, batch: int) -> dict:
    """Live heap after a full GC, heap used after it, loaded classes, RSS of the JVM and its workers, and
    the live bytes of the status store's own objects (not the strings and arrays they hold)."""
    histogram = _jcmd(pid, "GC.class_histogram")  # a full GC first, then the live objects
    total = next(line for line in reversed(histogram.splitlines()) if line.strip().startswith("Total"))
    live_bytes = int(total.split()[2])
    rows = re.findall(r"^\s*\d+:\s+\d+\s+(\d+)\s+(\S+)", histogram, re.M)
    status_bytes = sum(int(size) for size, name in rows if name.startswith(STATUS_STORE))
    heap = _jcmd(pid, "GC.heap_info")
    used = re.search(r"used (\d+)K", heap)
    counters = dict(re.findall(r"^(java\.cls\.\w+)=(\d+)", _jcmd(pid, "PerfCounter.print"), re.M))
    loaded = (int(counters["java.cls.loadedClasses"]) - int(counters.get("java.cls.unloadedClasses", 0))
              if "java.cls.loadedClasses" in counters else None)
    workers = 0.0
    for child in _descendants(pid):
        with contextlib.suppress(OSError):  # gone meanwhile
            workers += _rss_mib(child)
    return {"batch": batch, "live_heap_mib": round(live_bytes / 2**20, 2),
            "status_store_objects_mib": round(status_bytes / 2**20, 2),
            "heap_used_after_gc_mib": round(int(used.group(1)) / 1024, 1) if used else None,
            "loaded_classes": loaded, "jvm_rss_mib": round(_rss_mib(pid), 1),
            "python_workers_rss_mib": round(workers, 1), "load_avg_1m": os.getloadavg()[0], "at": time.time()}


def slope_per_100(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of y over x, times 100 (per 100 batches)."""
    if len(points) < 2:
        return None
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if not sxx:
        return None
    return round(100 * sum((x - mx) * (y - my) for x, y in points) / sxx, 3)


def make_config(workdir: Path, messages: int) -> tuple[Path, str]:
    data = yaml.safe_load((ROOT / "config" / "pipelines.yaml").read_text())
    pipe = next(p for p in data["pipelines"] if p["source"]["kind"] == "valkey")
    name = "mem"
    pipe.update(name=name, batch_cap=messages, target={**pipe["target"], "path": name})
    pipe["source"]["streams"] = [f"{name}:{{0}}"]
    pipe.pop("quality", None)
    data.update(pipelines=[pipe], data_dir=str(workdir / "lake"))
    path = workdir / "pipelines.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path, name


def main(workdir: Path, batches: int, every: int, messages: int, minutes: float | None) -> dict:
    from deltadrain import jobs
    from deltadrain.config import load_config
    from deltadrain.config.embedded import spark_connect_url
    from deltadrain.dev import services
    from deltadrain.dev.produce import produce
    from deltadrain.runtime.session import connect_session

    config, name = make_config(workdir, messages)
    cfg = load_config(config)
    pipeline = cfg.pipeline(name)
    wanted = ["valkey", "spark_connect"]
    started_here = [n for n in wanted if services.FACTORIES[n](cfg).pid() is None]
    services.up(cfg, wanted)
    pid = services.FACTORIES["spark_connect"](cfg).pid()
    url = spark_connect_url(cfg)
    deadline = time.monotonic() + minutes * 60 if minutes else None
    samples, times, done = [], [], 0
    try:
        for batch in range(1, batches + 1):
            produce(cfg, pipeline, messages, seed=batch, start=batch * messages, progress=False)
            t0 = time.monotonic()
            session = connect_session(url, purpose="connect memory bench")
            try:
                result = jobs.run("drain", session, [name, "--config", str(config), "--run-id", f"mem_{batch}"])
            finally:
                session.stop()
            times.append(round(time.monotonic() - t0, 3))
            if result.error or result.summary.get("outcome") != "committed":
                raise RuntimeError(f"batch {batch}: {result.error or result.summary}")
            done = batch
            if batch == 1 or batch % every == 0:
                samples.append(sample(pid, batch))
                print(json.dumps(samples[-1]), file=sys.stderr, flush=True)
                if deadline and time.monotonic() > deadline:
                    break
    finally:
        services.down(cfg, started_here)

    def slopes(key: str) -> dict:
        points = [(s["batch"], s[key]) for s in samples if s[key] is not None]
        half = [p for p in points if p[0] > done / 2]
        return {"all": slope_per_100(points), "second_half": slope_per_100(half)}

    keys = ("live_heap_mib", "status_store_objects_mib", "heap_used_after_gc_mib", "jvm_rss_mib", "python_workers_rss_mib", "loaded_classes")
    ordered = sorted(times)
    return {"batches": done, "batches_asked": batches, "messages_per_batch": messages, "sample_every": every,
            "slope_per_100_batches": {k: slopes(k) for k in keys},
            "task_seconds": {"median": ordered[len(ordered) // 2], "first": times[0] if times else None,
                             "last": times[-1] if times else None},
            "samples": samples, "task_seconds_each": times, "cpus": os.cpu_count(), "load_avg": os.getloadavg()}


if __name__ == "__main__":
    work = Path(sys.argv[1]).resolve()
    work.mkdir(parents=True, exist_ok=True)
    argv = sys.argv[2:] + [None] * 4
    print(json.dumps(main(work, int(argv[0] or 500), int(argv[1] or 25), int(argv[2] or 10),
                          float(argv[3]) if argv[3] else None), indent=2))
