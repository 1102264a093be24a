"""Whether the driver JVM's live heap follows the batches one process drains (bench/live_heap/README.md):
one Spark session drains a backlog batch after batch, and after each batch the live heap (used heap
after full GCs, `bench.jvm_live_heap_mib`) and the number of loaded classes are taken. Heap readings
do not depend on CPU load, so this may run beside other work.

    DELTADRAIN_HOME=/tmp/ddbench9 DELTADRAIN_VALKEY_PORT=26997 \\
        .venv/bin/python bench/live_heap/live_heap.py WORKDIR [MESSAGES] [BATCH] [CODEGEN_CACHE_ENTRIES] > out.json

CODEGEN_CACHE_ENTRIES sets spark.sql.codegen.cache.maxEntries (Spark's default is 100). The Valkey
service of that DELTADRAIN_HOME is started if it is not running.
"""

import gc
import json
import sys
import time
from pathlib import Path

from deltadrain.catchup import drain
from deltadrain.config import load_config
from deltadrain.dev import services
from deltadrain.dev.bench import _bench_config, jvm_live_heap_mib
from deltadrain.dev.produce import produce
from deltadrain.runtime.session import get_spark


def main(workdir: Path, messages: int, batch: int, cache_entries: str | None) -> dict:
    workdir.mkdir(parents=True, exist_ok=True)
    config, name = _bench_config(workdir, 4, batch)
    cfg = load_config(config)
    pipeline = cfg.pipeline(name)
    services.up(cfg, ["valkey"])
    produce(cfg, pipeline, messages, seed=7, progress=False)
    extra = {"spark.sql.codegen.cache.maxEntries": cache_entries} if cache_entries else None
    spark = get_spark("live-heap", extra=extra)
    spark.sparkContext.setLogLevel("ERROR")
    classes = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getClassLoadingMXBean()
    after = []
    while True:
        summary = drain(cfg, pipeline, spark=spark)
        if summary.outcome == "empty":
            break
        gc.collect()  # Python's proxies of JVM objects first, so that the JVM may free them
        time.sleep(0.5)
        after.append({"batch": summary.batch, "claimed": summary.claimed, "seconds": summary.seconds,
                      "live_heap_mib": jvm_live_heap_mib(spark), "loaded_classes": classes.getLoadedClassCount()})
        print(json.dumps(after[-1]), file=sys.stderr, flush=True)
    spark.stop()
    return {"messages": messages, "batch": batch, "codegen_cache_entries": cache_entries or "default (100)",
            "after_batch": after}


if __name__ == "__main__":
    args = sys.argv[1:]
    out = main(Path(args[0]), int(args[1]) if len(args) > 1 else 600_000, int(args[2]) if len(args) > 2 else 20_000,
               args[3] if len(args) > 3 else None)
    print(json.dumps(out, indent=1))
