"""What Delta confs do to a drain's commit (`commit.commit_batch`: the insert-only MERGE on the id with the
batch number as txnAppId/txnVersion and the positions as commit metadata), side by side on one table
(bench/merge_confs/README.md).

Batches of target-shaped rows (`deltadrain.dev.bench.target_shaped_rows`) are committed one after another into
one Delta table through `commit_batch`, as the drain commits them, in blocks of BLOCK commits per conf
set, the sets in turn A B B A ...: a conf that changes what a commit leaves behind (a checksum file)
also changes what the next commit starts from, so the first commit of each block is left out of the
medians. Afterwards the table is read back with Spark and with delta-rs: every id once.

    DELTADRAIN_HOME=/tmp/ddmc .venv/bin/python bench/merge_confs/merge_confs.py WORKDIR BLOCKS BLOCK ROWS > out.json
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

CONF_SETS = {
    "default": {},
    # Delta writes a checksum file (.crc: the table's size, file count, protocol, metadata, txns) after
    # each commit; without it, readers rebuild that state from the log when they need it.
    "no_checksum": {"spark.databricks.delta.writeChecksumFile.enabled": "false"},
}


def main(workdir: str, blocks: int, block: int, rows: int) -> dict:
    from deltadrain.lake.checkpoint import commit_metadata
    from deltadrain.run.commit import NewTable, commit_batch

    spark = get_spark("merge-confs")
    spark.sparkContext.setLogLevel("ERROR")
    work = Path(workdir)
    shutil.rmtree(work, ignore_errors=True)
    table = work / "target"
    names = list(CONF_SETS)
    order = [names[(b // 2 + b) % 2] for b in range(blocks)]  # A B B A A B ...
    out = {"command": " ".join(["bench/merge_confs/merge_confs.py", *sys.argv[1:]]), "rows": rows,
           "conf_sets": CONF_SETS, "commits": []}
    batch = 0
    for b, name in enumerate([names[0]] + order):  # one block of the first set creates and warms the table
        for key in {k for conf in CONF_SETS.values() for k in conf}:
            spark.conf.unset(key)
        for key, value in CONF_SETS[name].items():
            spark.conf.set(key, value)
        for k in range(block):
            target_shaped_rows(spark, work / "stage", batch, rows)
            source = spark.read.parquet(str(work / "stage"))
            ids = source.agg({"event_id": "min"}).first()[0], source.agg({"event_id": "max"}).first()[0]
            run_id = uuid.uuid4().hex
            meta = commit_metadata("bench", batch + 1, run_id, {"p": str(batch)})
            started = time.perf_counter()
            result = commit_batch(spark, str(table), pipeline="bench", expected_batch=batch, run_id=run_id,
                                  rows=source, id_field="event_id", window_start=None, metadata=meta, id_range=ids,
                                  create=None if batch else NewTable())
            if result.outcome != "committed":
                raise RuntimeError(f"batch {batch + 1}: {result}")
            row = {"block": b - 1, "conf": name, "batch": batch + 1, "first_in_block": k == 0,
                   "commit_s": round(time.perf_counter() - started, 3), "outcome": result.outcome}
            if b:
                out["commits"].append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
            batch += 1
    expected = batch * rows
    back = spark.read.format("delta").load(str(table))
    got = (back.count(), back.select("event_id").distinct().count())
    from deltalake import DeltaTable

    rs = DeltaTable(str(table))
    rs_ids = rs.to_pyarrow_table(columns=["event_id"]).column("event_id")
    out["read_back"] = {"spark_rows": got[0], "spark_distinct": got[1], "delta_rs_rows": len(rs_ids),
                        "delta_rs_txn": rs.transaction_version("bench"),
                        "expected": expected, "checksum_files": len(list((table / "_delta_log").glob("[0-9]*.crc")))}
    if got != (expected, expected) or len(rs_ids) != expected or out["read_back"]["delta_rs_txn"] != batch:
        raise RuntimeError(f"read back {out['read_back']}")
    for name in names:
        times = sorted(c["commit_s"] for c in out["commits"] if c["conf"] == name and not c["first_in_block"])
        firsts = sorted(c["commit_s"] for c in out["commits"] if c["conf"] == name and c["first_in_block"])
        out[name] = {"commit_s": times, "median_s": round(statistics.median(times), 3),
                     "first_in_block_s": firsts}
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])), indent=1))
