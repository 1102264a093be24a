"""What table maintenance buys a drain and a reader, and what it costs (bench/maintenance/README.md).

A target that took many small batches holds one or more small files per batch, and the MERGE of the
next batch reads every file whose rows lie inside the dedup window. This builds such a target (FILES
appends of ROWS rows each, spread over the last FILES x 5 minutes, all inside the 7-day window, as
five-minute batches leave them), copies it, compacts and vacuums the copy with `maintain_table`
(timed: the maintenance task's cost), and then MERGEs the same new batch of BATCH rows into both,
alternately, over seven rounds after a warm-up, as `bench.phase_window` does. It also times a full
read (count, and a grouped count) of each, alternately.

The rows come from one real drain of the sample `orders` pipeline (Valkey started and stopped here;
DELTADRAIN_HOME and DELTADRAIN_VALKEY_PORT private to it).

Usage: DELTADRAIN_HOME=/tmp/ddmaint DELTADRAIN_VALKEY_PORT=26962 .venv/bin/python bench/maintenance/maintenance.py [FILES [ROWS [BATCH]]]
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from deltadrain.catchup import drain
from deltadrain.config import MaintenanceConfig, load_config
from deltadrain.dev import services
from deltadrain.dev.produce import produce
from deltadrain.lake.maintain import files_on_disk, maintain_table, snapshot_files
from deltadrain.run.commit import commit_batch
from deltadrain.runtime.session import get_spark

ROUNDS = 7


def main(files: int = 400, rows: int = 250, batch: int = 2000) -> dict:
    from pyspark.sql import functions as F

    cfg = load_config()
    p = cfg.pipeline("orders").model_copy(update={"batch_cap": max(rows, batch)})
    spark = get_spark("deltadrain-bench-maintenance")
    lake = Path(cfg.lake_dir())
    with services.running(cfg, ["valkey"]):
        produce(cfg, p, max(rows, batch), seed=7, progress=False)
        assert drain(cfg, p, spark=spark).outcome == "committed"
    template = spark.read.format("delta").load(str(cfg.target_path(p))).cache()
    template.count()
    now = datetime.now(UTC).replace(microsecond=0)
    small, compacted = str(lake / "maint_small"), str(lake / "maint_compacted")
    began = time.monotonic()
    for k in range(files):  # one file per append, as a small batch leaves it
        (template.limit(rows).withColumn("event_id", F.concat(F.lit(f"old{k}-"), F.col("event_id")))
         .withColumn("_dd_source_ts", F.lit(now - timedelta(minutes=5 * (files - k)))).coalesce(1)
         .write.format("delta").mode("append").save(small))
    build_s = time.monotonic() - began
    shutil.copytree(small, compacted)
    files_before = snapshot_files(spark, compacted)
    report = maintain_table(spark, "target", compacted, MaintenanceConfig(retain=timedelta(0)))
    on_disk = {"small_files": files_on_disk(small), "compacted": files_on_disk(compacted)}

    paths = {"small_files": small, "compacted": compacted}
    merge: dict[str, list[float]] = {name: [] for name in paths}
    read: dict[str, list[float]] = {name: [] for name in paths}
    for attempt in range(ROUNDS + 1):
        order = list(paths) if attempt % 2 == 0 else list(reversed(paths))
        for name in order:
            new = (template.limit(batch).withColumn("event_id", F.concat(F.lit(f"new{attempt}-"), F.col("event_id")))
                   .withColumn("_dd_source_ts", F.lit(now)))
            started = time.monotonic()
            commit_batch(spark, paths[name], pipeline=f"m_{name}", expected_batch=attempt, run_id=f"m{attempt}",
                         rows=new, id_field="event_id", window_start=now - p.dedup_window,
                         metadata=json.dumps({"pipeline": f"m_{name}", "batch": attempt + 1, "run_id": f"m{attempt}"}))
            merge[name].append(time.monotonic() - started)
        for name in order:
            started = time.monotonic()
            df = spark.read.format("delta").load(paths[name])
            df.count()
            df.groupBy("status").count().collect()
            read[name].append(time.monotonic() - started)
    template.unpersist()

    def median(values: list[float]) -> float:
        return round(statistics.median(values[1:]), 3)  # the first round warms the JVM up

    out = {
        "files": files, "rows_per_file": rows, "batch_rows": batch, "rounds": ROUNDS,
        "build_seconds": round(build_s, 1),
        "maintenance": {"files_before": files_before, "files_after": report.files_after,
                        "compacted": report.compacted, "vacuumed": report.vacuumed, "seconds": report.seconds,
                        "data_files_on_disk": on_disk},
        "merge_seconds_median": {name: median(v) for name, v in merge.items()},
        "read_seconds_median": {name: median(v) for name, v in read.items()},
        "merge_seconds": {name: [round(t, 3) for t in v] for name, v in merge.items()},
        "read_seconds": {name: [round(t, 3) for t in v] for name, v in read.items()},
    }
    out["merge_ratio_small_to_compacted"] = round(out["merge_seconds_median"]["small_files"]
                                                  / out["merge_seconds_median"]["compacted"], 2)
    out["read_ratio_small_to_compacted"] = round(out["read_seconds_median"]["small_files"]
                                                 / out["read_seconds_median"]["compacted"], 2)
    return out


if __name__ == "__main__":
    from deltadrain.cli import stdout_to_stderr

    with stdout_to_stderr():  # what the JVM prints (VACUUM's count) stays out of the JSON
        result = main(*map(int, sys.argv[1:4]))
    print(json.dumps(result))
