"""A Spark driver on a lake on the embedded S3 server, run as its own process by test_object_store.py
(hadoop-aws joins a JVM's class path only when it starts). Prints one JSON line.

    s3_driver.py s3a://bucket/table WRITER APPENDS READY_FILE GO_FILE ROUNDS

Writer 0 first creates the table, MERGEs into it and tries the log store directly; each writer then
says it is ready, waits for GO_FILE, and appends APPENDS times, racing the other. The first append
of each waits, inside its transaction (the version it read is fixed), until the other's is there
too: both then commit the same version, and one of them must lose it.

Then, after a second ready/go (the files' names with a "2"), both write versions 0..ROUNDS-1 of one
log straight through the session's log store, as Delta commits, version i at the same moment (each
waits for the other at every round): each reports the versions it won; none may be won twice.
"""

from __future__ import annotations

import functools
import json
import os
import random
import sys
import time
from pathlib import Path

from py4j.protocol import Py4JJavaError

from deltadrain.lake.objectstore import embedded_connection, resolve
from deltadrain.runtime.session import get_spark


def log_store_writes(spark, path: str) -> dict:
    """Version 0 of a log written again through deltadrain's S3 log store: another writer's bytes are
    refused (java.nio's FileAlreadyExistsException, which Delta takes for a lost race), the same
    bytes count as our own write whose answer was lost."""
    jvm = spark._jvm
    conf = spark._jsc.hadoopConfiguration()
    store = jvm.dev.deltadrain.storage.S3ConditionalLogStore(conf)
    log = jvm.org.apache.hadoop.fs.Path(f"{path}/_delta_log/{0:020d}.json")
    lines = jvm.java.util.ArrayList()
    lines.add('{"other":"writer"}')
    try:
        store.write(log, lines.iterator(), False, conf)
        other = "written"
    except Py4JJavaError as exc:
        other = f"{exc.java_exception.getClass().getName()}: {exc.java_exception.getMessage()}"
    mine = [line for line in store.read(log, conf)]
    lines = jvm.java.util.ArrayList()
    for line in mine:
        lines.add(line)
    store.write(log, lines.iterator(), False, conf)  # the same bytes: no error
    return {"other_writer": other, "still": len(mine)}


def log_store_race(spark, log: str, writer: int, rounds: int, ready: Path, go: Path) -> dict:
    jvm = spark._jvm
    conf = spark._jsc.hadoopConfiguration()
    name = spark.conf.get("spark.delta.logStore.s3a.impl")
    store = functools.reduce(getattr, name.split("."), jvm)(conf)

    refused_puts = 0

    def write(version: int, line: str, where: str = log) -> bool:
        nonlocal refused_puts
        lines = jvm.java.util.ArrayList()
        lines.add(line)
        try:
            store.write(jvm.org.apache.hadoop.fs.Path(f"{where}/_delta_log/{version:020d}.json"), lines.iterator(),
                        False, conf)
            return True
        except Py4JJavaError as exc:
            if exc.java_exception.getClass().getName() != "java.nio.file.FileAlreadyExistsException":
                raise
            cause = exc.java_exception.getCause()
            refused_puts += cause is not None and cause.getClass().getSimpleName() == "RemoteFileChangedException"
            return False

    # Both ways through the store once (a win, a loss), so that neither writer starts the race slowed
    # by loading classes and falls behind for good.
    assert write(0, "{}", f"{log}-warm-{writer}") and not write(0, '{"again":1}', f"{log}-warm-{writer}")
    ready.touch()
    while not go.exists():
        time.sleep(0.01)
    refused_puts, won = 0, []
    jitter = random.Random(writer)
    for i in range(rounds):
        # Both writers of version i at once: each waits for the other to get here (a loss costs more
        # than a win, so a writer that lost once would otherwise trail and lose every later round),
        # then a few ms more at random, so that neither wins only for being the quicker process.
        (go.parent / f"round-{writer}-{i}").touch()
        while not (go.parent / f"round-{1 - writer}-{i}").exists():
            time.sleep(0.001)
        time.sleep(jitter.uniform(0, 0.01))
        if write(i, json.dumps({"writer": writer})):
            won.append(i)
    return {"won": won, "refused_puts": refused_puts}


def meet_the_other(where: Path, writer: int, value: int) -> int:
    """Runs in the first append's task: after its transaction read the table's version, before it
    commits. Returns when the other writer's task got here too (or after two minutes)."""
    (where / f"in-{writer}").touch()
    deadline = time.monotonic() + 120
    while not (where / f"in-{1 - writer}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return value


def main() -> None:
    path, writer, appends, ready, go = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]), Path(sys.argv[5])
    t0 = time.monotonic()
    # S3_DRIVER_LOG_STORE=io.delta.storage.S3SingleDriverLogStore shows what Delta's own store does here.
    store = os.environ.get("S3_DRIVER_LOG_STORE")
    spark = get_spark(f"deltadrain-s3-{writer}", object_store=resolve(embedded=embedded_connection),
                      extra={"spark.delta.logStore.s3a.impl": store} if store else None)
    spark.sparkContext.setLogLevel("ERROR")
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    out: dict = {"session_s": round(time.monotonic() - t0, 1), "store": spark.conf.get("spark.delta.logStore.s3a.impl")}
    if writer == 0:
        spark.range(5).selectExpr("id", "'first' AS v").write.format("delta").save(path)
        out["create_s"] = round(time.monotonic() - t0, 1)
        changes = spark.range(3, 8).selectExpr("id", "'merged' AS v")
        (DeltaTable.forPath(spark, path).alias("t").merge(changes.alias("c"), "t.id = c.id")
         .whenMatchedUpdateAll().whenNotMatchedInsertAll().execute())
        out["merge_s"] = round(time.monotonic() - t0, 1)
        out["rows"] = sorted([r.id, r.v] for r in spark.read.format("delta").load(path).collect())
        out.update(log_store_writes(spark, path))
    ready.touch()
    while not go.exists():
        time.sleep(0.05)
    t1 = time.monotonic()
    rows = 10
    meet = F.udf(functools.partial(meet_the_other, go.parent, writer), "long").asNondeterministic()
    for k in range(appends):
        first = 100 + (writer * appends + k) * rows
        ids = spark.range(first, first + rows, numPartitions=1)
        ids = ids.select(meet("id").alias("id")) if k == 0 else ids
        ids.selectExpr("id", f"'w{writer}' AS v").write.format("delta").mode("append").save(path)
    out["appends_s"] = round(time.monotonic() - t1, 1)
    t2 = time.monotonic()
    out["log_store_race"] = log_store_race(spark, f"{path}-log", writer, int(sys.argv[6]),
                                ready.with_name(ready.name + "2"), go.with_name(go.name + "2"))
    out["race_s"] = round(time.monotonic() - t2, 1)
    print(json.dumps(out), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
