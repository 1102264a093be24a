"""What reading a target's log costs a drain run: through the driver JVM (py4j: Delta's DeltaLog and
LogStore, how deltadrain read it before) against delta-rs in the Python process (how `deltadrain.lake.delta`
reads it now, which a Spark Connect client needs: it has no JVM to call).

A drain run reads the log three ways: the pipeline's txn version and the table version (the
checkpoint and the commit's outcome), and the newest commits' metadata (the positions, and whether
its own commit landed). The script makes a table the way drains do (one append per batch with the
txn options and the batch's metadata, FILES files each), then times each read, interleaved, ROUNDS
times per side, on a table of COMMITS commits; a Delta checkpoint lands every 10 commits as usual.

    DELTADRAIN_HOME=/tmp/ddlake .venv/bin/python bench/lake_reads/lake_reads.py WORKDIR [COMMITS [FILES [ROUNDS]]] > out.json
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))  # bench/common: shared helpers

from timing import median_ms

from deltadrain.lake.delta import delta as lake
from deltadrain.runtime.session import get_spark

APP = "bench-pipeline"


def jvm_reads(spark, path: str) -> tuple:
    """The former reads: DeltaLog's snapshot for the versions, its LogStore for the newest commit files."""
    jvm = spark._jvm
    log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, path)
    none = jvm.scala.Option.empty()
    snapshot = log.update(False, none, none)
    found = snapshot.transactions().get(APP)
    txn = int(found.get()) if found.isDefined() else None
    version = int(snapshot.version())
    conf, log_dir, store = log.newDeltaHadoopConf(), log.logPath(), log.store()
    commits = []
    for v in range(version, max(version - 5, -1), -1):
        lines = store.read(jvm.org.apache.hadoop.fs.Path(log_dir, f"{v:020d}.json"), conf)
        info = next(filter(None, (json.loads(lines.apply(k)).get("commitInfo") for k in range(lines.length()))))
        commits.append(json.loads(info["userMetadata"]))
    return txn, version, commits


def rs_reads(path: str) -> tuple:
    txn, version = lake.snapshot_txn(path, APP)
    return txn, version, [c["meta"] for c in lake.recent_commits(path, 5)]


def main(workdir: str, commits: int = 50, files: int = 4, rounds: int = 15) -> dict:
    spark = get_spark("lake-reads")
    spark.sparkContext.setLogLevel("ERROR")
    path = str(Path(workdir) / "t")
    shutil.rmtree(path, ignore_errors=True)
    for batch in range(1, commits + 1):
        meta = json.dumps({"deltadrain": 1, "pipeline": APP, "batch": batch, "positions": {"s": f"{batch}-0"}})
        (spark.range(batch * 1000, batch * 1000 + 1000).repartition(files).write.format("delta").mode("append")
         .option("txnAppId", APP).option("txnVersion", batch).option("userMetadata", meta).save(path))
    assert jvm_reads(spark, path) == rs_reads(path), "the two readers disagree"
    times: dict[str, list[float]] = {"jvm": [], "delta_rs": []}
    for _ in range(rounds):
        for side, read in (("jvm", lambda: jvm_reads(spark, path)), ("delta_rs", lambda: rs_reads(path))):
            started = time.perf_counter()
            read()
            times[side].append(time.perf_counter() - started)
    spark.stop()
    medians = {side: median_ms(xs, 2) for side, xs in times.items()}
    return {"command": " ".join(["bench/lake_reads/lake_reads.py", *sys.argv[1:]]), "commits": commits,
            "files_per_commit": files, "rounds": rounds, "median_ms": medians,
            "ratio_delta_rs_to_jvm": round(medians["delta_rs"] / medians["jvm"], 3)}


if __name__ == "__main__":
    args = sys.argv[1:]
    print(json.dumps(main(args[0], *(int(a) for a in args[1:])), indent=2))
