"""What reading a pipeline's txn version costs Delta per batch (bench/pipeline_alternatives/README.md).

Every drain commit carries a SetTransaction (appId = pipeline, version = batch), and Delta's write
with `txnAppId` first asks the new snapshot for that appId's version (`OptimisticTransaction.txnVersion`,
its idempotence check). This script makes a table the way a drain does (one append per batch with
the txn options), and after each new commit times, on the fresh snapshot: starting a transaction,
reading the table's newest Delta checksum file (`checksumOpt`, which holds the set transactions),
and `txnVersion`. A snapshot's state is cached, so a second `txnVersion` on the same snapshot is timed too.

With a fourth argument it then runs that many pairs of insert-only MERGEs into the same table, one
with the txn options and one without, alternating: what the check adds to a MERGE.

    DELTADRAIN_HOME=/tmp/ddtxn .venv/bin/python bench/pipeline_alternatives/txn_version.py WORKDIR COMMITS ROWS_PER_COMMIT [PAIRS] > out.json
"""

import json
import shutil
import sys
import time
from pathlib import Path

from deltadrain.runtime.session import get_spark

APP = "bench-pipeline"


def timed(action) -> tuple[float, object]:
    started = time.perf_counter()
    value = action()
    return round(time.perf_counter() - started, 4), value


def main(workdir: str, commits: int, rows: int) -> dict:
    spark = get_spark("txn-version")
    spark.sparkContext.setLogLevel("ERROR")
    path = Path(workdir) / "t"
    shutil.rmtree(path, ignore_errors=True)
    jvm = spark._jvm
    none = jvm.scala.Option.empty()
    out = {"command": " ".join(["bench/pipeline_alternatives/txn_version.py", *sys.argv[1:]]), "commits": []}
    for batch in range(1, commits + 1):
        (spark.range((batch - 1) * rows, batch * rows).selectExpr("id", "uuid() AS payload")
         .write.format("delta").mode("append").option("txnAppId", APP).option("txnVersion", batch).save(str(path)))
        log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, str(path))
        start, txn = timed(lambda log=log: log.update(False, none, none).deltaLog().startTransaction())
        snapshot = txn.snapshot()
        crc_s, crc = timed(lambda s=snapshot: s.checksumOpt())
        computed, version = timed(lambda t=txn: t.txnVersion(APP))
        again, _ = timed(lambda t=txn: t.txnVersion(APP))
        known = crc.get().setTransactions() if crc.isDefined() else none
        crc_version = known.get().head().version() if known.isDefined() else None
        row = {"batch": batch, "version": snapshot.version(), "files": snapshot.numOfFiles(), "start_s": start,
               "crc_read_s": crc_s, "crc_txn_version": crc_version, "txn_version": version,
               "txn_version_s": computed, "txn_version_again_s": again}
        out["commits"].append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
        if version != batch:
            raise RuntimeError(f"txn version {version} after batch {batch}")
    return out


def merges(spark, path: Path, rounds: int, rows: int, first: int) -> list[dict]:
    """Insert-only MERGEs of `rows` new ids into the table, with and without the txn options
    (alternating, so both meet the same table sizes): what the txn version check adds to a MERGE."""
    from delta.tables import DeltaTable

    from deltadrain.run.commit import TXN_APP, TXN_VERSION

    out, batch = [], first
    for k in range(2 * rounds):
        with_txn = k % 2 == 0
        if with_txn:
            batch += 1
            spark.conf.set(TXN_APP, APP)
            spark.conf.set(TXN_VERSION, str(batch))
        start = (first + k) * rows * 10  # clear of every id written before
        source = spark.range(start, start + rows).selectExpr("id", "uuid() AS payload")
        try:
            seconds, _ = timed(lambda s=source: DeltaTable.forPath(spark, str(path)).alias("t").merge(
                s.alias("s"), "t.id = s.id").whenNotMatchedInsertAll().execute())
        finally:
            spark.conf.unset(TXN_APP)
            spark.conf.unset(TXN_VERSION)
        out.append({"with_txn": with_txn, "seconds": seconds})
        print(json.dumps(out[-1]), file=sys.stderr, flush=True)
    return out


if __name__ == "__main__":
    report = main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
    if len(sys.argv) > 4:
        report["merges"] = merges(get_spark("txn-version"), Path(sys.argv[1]) / "t", int(sys.argv[4]),
                                  int(sys.argv[3]), int(sys.argv[2]))
    print(json.dumps(report, indent=1))
