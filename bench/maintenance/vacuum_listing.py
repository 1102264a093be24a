"""What VACUUM's file listing costs at Spark's default parallelism and at deltadrain's
(bench/maintenance/README.md).

VACUUM lists every file under the table in `spark.sql.sources.parallelPartitionDiscovery.parallelism`
tasks: 10 000 by default, whatever the table's size. deltadrain's session sets 4 (`spark.py`). This
builds two tables of FILES small appends each, then, ROUNDS times and alternating which goes first,
gives each one more small append, compacts it (OPTIMIZE) and times its VACUUM with nothing retained,
one table under each setting (a runtime SQL conf, so one session runs both). It checks that both
tables deleted the same number of files each round: only the listing's task count differs.

Usage: .venv/bin/python bench/maintenance/vacuum_listing.py [FILES [ROUNDS]] > bench/maintenance/vacuum_listing_run1.json
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from deltadrain.lake.maintain import files_on_disk
from deltadrain.runtime.session import get_spark

LISTING = "spark.sql.sources.parallelPartitionDiscovery.parallelism"
SETTINGS = {"spark_default": "10000", "deltadrain": "4"}


def main(files: int = 6, rounds: int = 3) -> dict:
    from delta.tables import DeltaTable

    spark = get_spark("deltadrain-bench-vacuum")
    spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    root = Path(tempfile.mkdtemp(prefix="dd-vacuum-"))
    paths = {name: str(root / name) for name in SETTINGS}
    for path in paths.values():
        for k in range(files):
            spark.range(k * 100, k * 100 + 100).coalesce(1).write.format("delta").mode("append").save(path)
    seconds: dict[str, list[float]] = {name: [] for name in SETTINGS}
    deleted: dict[str, list[int]] = {name: [] for name in SETTINGS}
    for attempt in range(rounds):
        order = list(SETTINGS) if attempt % 2 == 0 else list(reversed(SETTINGS))
        for name in order:
            path = paths[name]
            spark.range(10**6 + attempt, 10**6 + attempt + 1).write.format("delta").mode("append").save(path)
            DeltaTable.forPath(spark, path).optimize().executeCompaction()
            spark.conf.set(LISTING, SETTINGS[name])
            before = files_on_disk(path)
            started = time.monotonic()
            DeltaTable.forPath(spark, path).vacuum(0.0)
            seconds[name].append(round(time.monotonic() - started, 3))
            deleted[name].append(before - files_on_disk(path))
    spark.conf.set(LISTING, SETTINGS["deltadrain"])
    shutil.rmtree(root)
    assert deleted["spark_default"] == deleted["deltadrain"], deleted
    medians = {name: round(statistics.median(v), 3) for name, v in seconds.items()}
    return {"files": files, "rounds": rounds, "listing_parallelism": SETTINGS, "vacuum_seconds": seconds,
            "vacuum_seconds_median": medians, "files_deleted": deleted,
            "ratio_default_to_deltadrain": round(medians["spark_default"] / medians["deltadrain"], 1)}


if __name__ == "__main__":
    from deltadrain.cli import stdout_to_stderr

    with stdout_to_stderr():  # VACUUM prints its count on stdout; the JSON stays alone there
        result = main(*map(int, sys.argv[1:3]))
    print(json.dumps(result))
