"""What the statistics Delta collects on every column cost a drain's commit (`commit.commit_batch`: the
insert-only MERGE on the id within the batch's id range, with the batch number as txnAppId/txnVersion),
side by side (bench/stats_columns/README.md).

Two tables take the same staged 200 000-row batches in turn, alternating which commits first: one with
Delta's default (statistics on the first 32 columns: every column of a drain's target here), one with
`delta.dataSkippingStatsColumns` naming only the columns deltadrain's own reads filter on. Each table's
first commit creates it and is left out. Afterwards both are read back: every id once, and a MERGE-style
filter on the id range reads one batch's files from each.

    DELTADRAIN_HOME=/tmp/ddsc .venv/bin/python bench/stats_columns/stats_columns.py WORKDIR PAIRS ROWS > out.json
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

SIDES = ("all_columns", "filter_columns")


def main(workdir: str, pairs: int, rows: int) -> dict:
    from deltadrain.lake.checkpoint import commit_metadata
    from deltadrain.run.commit import NewTable, commit_batch

    spark = get_spark("stats-columns")
    spark.sparkContext.setLogLevel("ERROR")
    work = Path(workdir)
    shutil.rmtree(work, ignore_errors=True)
    tables = {side: work / side for side in SIDES}
    stats = ",".join(("event_id", "_dd_source_ts", "_dd_batch", "_dd_partition", "_dd_position", "_dd_pos_hi", "_dd_pos_lo"))
    out = {"command": " ".join(["bench/stats_columns/stats_columns.py", *sys.argv[1:]]), "rows": rows,
           "filter_columns": stats, "commits": []}
    for batch in range(pairs + 1):
        target_shaped_rows(spark, work / "stage", batch, rows)
        source = spark.read.parquet(str(work / "stage"))
        ids = source.agg({"event_id": "min"}).first()[0], source.agg({"event_id": "max"}).first()[0]
        order = SIDES if batch % 2 == 0 else SIDES[::-1]
        for side in order:
            run_id = uuid.uuid4().hex
            meta = commit_metadata("bench", batch + 1, run_id, {"p": str(batch)})
            started = time.perf_counter()
            result = commit_batch(spark, str(tables[side]), pipeline="bench", expected_batch=batch, run_id=run_id,
                                  rows=source, id_field="event_id", window_start=None, metadata=meta, id_range=ids,
                                  create=None if batch else NewTable())
            seconds = time.perf_counter() - started
            if result.outcome != "committed":
                raise RuntimeError(f"{side} batch {batch + 1}: {result}")
            if batch == 0 and side == "filter_columns":
                spark.sql(f"ALTER TABLE delta.`{tables[side]}` SET TBLPROPERTIES "
                          f"('delta.dataSkippingStatsColumns' = '{stats}')")
            row = {"side": side, "batch": batch + 1, "first": side == order[0], "commit_s": round(seconds, 3)}
            if batch:
                out["commits"].append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    expected = (pairs + 1) * rows
    for side in SIDES:
        back = spark.read.format("delta").load(str(tables[side]))
        got = back.count(), back.select("event_id").distinct().count()
        lo, hi = f"evt-7-{rows:09d}", f"evt-7-{2 * rows - 1:09d}"
        one = back.where(f"event_id >= '{lo}' AND event_id <= '{hi}'")
        files = len(one.inputFiles())
        times = sorted(c["commit_s"] for c in out["commits"] if c["side"] == side)
        out[side] = {"commit_s": times, "median_s": round(statistics.median(times), 3),
                     "rows": got[0], "distinct": got[1], "expected": expected,
                     "files_for_one_batch": files, "files": len(back.inputFiles()),
                     "bytes": sum(p.stat().st_size for p in tables[side].glob("*.parquet"))}
        if got != (expected, expected):
            raise RuntimeError(f"{side} read back {got}, expected {expected}")
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])), indent=1))
