"""What keeping a table's file list in Delta's checksum file saves a drain's commit (`commit.commit_batch`:
the insert-only MERGE on the id within the batch's id range, with the batch number as txnAppId/txnVersion),
side by side (bench/checksum_files/README.md).

After each commit Delta writes a checksum (`.crc`) of the new version, computed from the previous one and
the commit's actions. Below `spark.databricks.delta.allFilesInCrc.thresholdNumFiles` files (Delta's
default 50) it also holds the table's whole file list, and the next commit's snapshot takes its files from
there; above it, that snapshot is rebuilt from the last checkpoint and the commits since, in Spark jobs.
Two tables take the same staged batches in turn, alternating which commits first; each first gets SETUP
small commits, so both hold more than 50 files before the measured ones. Side `checksum_files` commits with
the threshold at THRESHOLD, side `default` with Delta's. Afterwards both are read back: every id once.

    DELTADRAIN_HOME=/tmp/ddcf .venv/bin/python bench/checksum_files/checksum_files.py WORKDIR PAIRS ROWS SETUP THRESHOLD > out.json
"""

import json
import shutil
import statistics
import sys
import time
import uuid
from pathlib import Path

from deltadrain.dev.bench import target_shaped_rows
from deltadrain.runtime.session import get_spark

SIDES = ("default", "checksum_files")
THRESHOLD = "spark.databricks.delta.allFilesInCrc.thresholdNumFiles"
SMALL = 1000  # rows of a setup commit


def main(workdir: str, pairs: int, rows: int, setup: int, threshold: int) -> dict:
    from deltadrain.lake.checkpoint import commit_metadata
    from deltadrain.run.commit import NewTable, commit_batch

    spark = get_spark("checksum-files")
    spark.sparkContext.setLogLevel("ERROR")
    work = Path(workdir)
    shutil.rmtree(work, ignore_errors=True)
    tables = {side: work / side for side in SIDES}
    out = {"command": " ".join(["bench/checksum_files/checksum_files.py", *sys.argv[1:]]), "rows": rows,
           "setup_commits": setup, "threshold": threshold, "commits": []}
    total = 0
    for batch in range(setup + pairs):
        small = batch < setup
        size = SMALL if small else rows
        # Setup batches hold ids below SMALL * setup; measured batch k holds those of rows-sized index k + 1.
        index = batch if small else batch - setup + 1
        target_shaped_rows(spark, work / "stage", index, size)
        total += size
        source = spark.read.parquet(str(work / "stage"))
        ids = f"evt-7-{index * size:09d}", f"evt-7-{(index + 1) * size - 1:09d}"
        order = SIDES if batch % 2 == 0 else SIDES[::-1]
        for side in order:
            if side == "checksum_files":
                spark.conf.set(THRESHOLD, str(threshold))
            else:
                spark.conf.unset(THRESHOLD)
            run_id = uuid.uuid4().hex
            meta = commit_metadata("bench", batch + 1, run_id, {"p": str(batch)})
            started = time.perf_counter()
            result = commit_batch(spark, str(tables[side]), pipeline="bench", expected_batch=batch, run_id=run_id,
                                  rows=source, id_field="event_id", window_start=None, metadata=meta, id_range=ids,
                                  create=None if batch else NewTable())
            seconds = time.perf_counter() - started
            if result.outcome != "committed":
                raise RuntimeError(f"{side} batch {batch + 1}: {result}")
            if not small:
                crc = tables[side] / "_delta_log" / f"{result.table_version:020d}.crc"
                row = {"side": side, "batch": batch + 1, "first": side == order[0], "commit_s": round(seconds, 3),
                       "files": len(list(tables[side].glob("*.parquet"))),
                       "crc_bytes": crc.stat().st_size if crc.exists() else None}
                out["commits"].append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    spark.conf.unset(THRESHOLD)
    for side in SIDES:
        back = spark.read.format("delta").load(str(tables[side]))
        got = back.count(), back.select("event_id").distinct().count()
        if got != (total, total):
            raise RuntimeError(f"{side} read back {got}, expected {total}")
        times = sorted(c["commit_s"] for c in out["commits"] if c["side"] == side and c["batch"] > setup + 1)
        out[side] = {"commit_s": times, "median_s": round(statistics.median(times), 3), "rows": got[0],
                     "distinct": got[1], "expected": total}
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])),
                     indent=1))
