"""Do HotSpot flags buy back the JIT's share of a batch? (bench/jit_flags/README.md, "HotSpot flags";
the class-data archive's runs are in "One-message drains and the class-data archive")

One backlog is produced once; then, per round and per flag set, a fresh process (its own Spark JVM,
started with those extra driver JVM options) drains BATCHES batches of CAP entries of it, each run
with a consumer group and a lake of its own, so that every run reads the same entries. Per batch:
the drain's seconds and step timings, the JIT's compile time (the JVM's own count, elapsed), the
JVM's CPU and its code cache; per run, the process's wall time from its start (Python, the JVM,
the Spark session, every batch), as an Airflow task's spark-submit pays it. The flag sets
alternate, so the machine's drift spreads over all.

    DELTADRAIN_HOME=/tmp/ddjit DELTADRAIN_VALKEY_PORT=26993 \\
        .venv/bin/python bench/jit_flags/jit_flags.py WORKDIR ROUNDS BATCHES CAP "" "-XX:TieredStopAtLevel=1" ... > out.json

An empty string is the default JVM, without the class-data archive that `make install` builds (the
options given replace the project's): pass `-XX:SharedArchiveFile=.cache/jars/cds/drain-....jsa` to use it.
"""

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path


def run(config: str, batches: int, opts: str) -> dict:
    """One drain process: BATCHES batches under `opts`, measured batch by batch."""
    from deltadrain.catchup import drain
    from deltadrain.config import load_config
    from deltadrain.dev.bench import own_cpu_seconds
    from deltadrain.dev.services.process import proc_stat
    from deltadrain.runtime.session import DEFAULT_CONF, get_spark

    cfg = load_config(config)
    pipeline = cfg.pipelines[0]
    shutil.rmtree(cfg.lake_dir(), ignore_errors=True)
    java_opts = f"{DEFAULT_CONF['spark.driver.extraJavaOptions']} {opts}".strip()
    spark = get_spark("jit-flags", extra={"spark.driver.extraJavaOptions": java_opts})
    spark.sparkContext.setLogLevel("ERROR")
    beans = spark._jvm.java.lang.management.ManagementFactory
    compiler = beans.getCompilationMXBean()
    jvm = int(spark._jvm.java.lang.ProcessHandle.current().pid())

    def jvm_cpu() -> float:
        return own_cpu_seconds(proc_stat(jvm))

    def code_cache_mib() -> float:
        return sum(p.getUsage().getUsed() for p in beans.getMemoryPoolMXBeans() if "Code" in p.getName()) / 2**20

    out = []
    for _ in range(batches):
        jit, cpu = compiler.getTotalCompilationTime(), jvm_cpu()
        s = drain(cfg, pipeline, spark=spark)
        if s.outcome != "committed":
            raise RuntimeError(f"batch {s.batch} ended {s.outcome}: {s.error}")
        out.append({"claimed": s.claimed, "seconds": s.seconds, "timings": s.timings,
                    "jit_seconds": round((compiler.getTotalCompilationTime() - jit) / 1000, 2),
                    "jvm_cpu_seconds": round(jvm_cpu() - cpu, 2), "code_cache_mib": round(code_cache_mib())})
        print(json.dumps(out[-1]), file=sys.stderr, flush=True)
    return {"opts": opts, "batches": out}


def summary(batches: list[dict]) -> dict | None:
    """Means over the warm batches (all but the first two, which carry most of the JVM's warm-up)."""
    warm = batches[2:]
    n = len(warm)
    if not n:
        return None
    mean = {k: round(sum(b[k] for b in warm) / n, 2) for k in ("seconds", "jit_seconds", "jvm_cpu_seconds")}
    return {**mean, "msg_per_s": round(sum(b["claimed"] for b in warm) / sum(b["seconds"] for b in warm))}


def main(workdir: Path, rounds: int, batches: int, cap: int, flag_sets: list[str]) -> dict:
    from deltadrain.config import load_config
    from deltadrain.dev import services
    from deltadrain.dev.bench import _bench_config, _config_copy, _machine
    from deltadrain.dev.produce import produce

    workdir.mkdir(parents=True, exist_ok=True)
    config, name = _bench_config(workdir, 4, cap)
    cfg = load_config(config)
    services.up(cfg, ["valkey"])
    produce(cfg, cfg.pipeline(name), cap * batches, seed=13, progress=False)
    runs = []
    for r in range(rounds):
        for i, opts in enumerate(flag_sets):
            copy = _config_copy(config, f"run_{r}_{i}")
            started = time.monotonic()
            done = subprocess.run([sys.executable, __file__, "--run", str(copy), str(batches), opts],
                                  capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"run {r}/{opts!r} failed: {done.stderr[-3000:]}")
            result = json.loads(done.stdout.strip().splitlines()[-1])
            result.update(round=r, wall_seconds=round(time.monotonic() - started, 1),
                          warm=summary(result["batches"]))
            print(json.dumps({"round": r, "opts": opts, "wall_seconds": result["wall_seconds"],
                              "batch_seconds": [b["seconds"] for b in result["batches"]]}), file=sys.stderr, flush=True)
            runs.append(result)
    return {"machine": _machine(), "messages_per_run": cap * batches, "batch_cap": cap, "runs": runs,
            "command": " ".join(["bench/jit_flags/jit_flags.py", str(workdir), str(rounds), str(batches), str(cap),
                                 *[repr(f) for f in flag_sets]])}


if __name__ == "__main__":
    if sys.argv[1] == "--run":
        print(json.dumps(run(sys.argv[2], int(sys.argv[3]), sys.argv[4])))
    else:
        print(json.dumps(main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5:]), indent=1))
