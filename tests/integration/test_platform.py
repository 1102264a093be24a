"""The ground everything stands on, on real parts: Spark + Delta, Valkey, Kafka, the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "deltadrain.cli"]


def test_pyspark_is_the_pinned_version_and_not_clobbered_by_pyspark_client():
    import importlib.metadata as md

    import pyspark

    assert pyspark.__version__ == md.version("pyspark") == md.version("pyspark-client")
    from pyspark.sql import SparkSession  # noqa: F401  (fails when pyspark-client overwrote the files)


def test_delta_merge_with_set_transaction_in_the_project_session(spark, tmp_path):
    from delta.tables import DeltaTable

    path = str(tmp_path / "t")
    spark.range(10).selectExpr("id", "'old' AS v").write.format("delta").save(path)
    spark.conf.set("spark.databricks.delta.write.txnAppId", "platform-test")
    spark.conf.set("spark.databricks.delta.write.txnVersion", "1")
    spark.conf.set("spark.databricks.delta.commitInfo.userMetadata", '{"batch": 1}')
    try:
        (DeltaTable.forPath(spark, path).alias("t")
         .merge(spark.range(5, 15).selectExpr("id", "'new' AS v").alias("s"), "t.id = s.id")
         .whenNotMatchedInsertAll().execute())
    finally:
        for key in ("txnAppId", "txnVersion"):
            spark.conf.unset(f"spark.databricks.delta.write.{key}")
        spark.conf.unset("spark.databricks.delta.commitInfo.userMetadata")
    rows = {(r.id, r.v) for r in spark.read.format("delta").load(path).collect()}
    assert rows == {(i, "old") for i in range(10)} | {(i, "new") for i in range(10, 15)}
    last = json.loads(Path(path, "_delta_log", "00000000000000000001.json").read_text().splitlines()[0])
    assert "commitInfo" in last
    actions = [json.loads(line) for line in Path(path, "_delta_log", "00000000000000000001.json").read_text().splitlines()]
    assert {k: v for a in actions if "txn" in a
                                                       for k, v in a["txn"].items() if k != "lastUpdated"} == {"appId": "platform-test", "version": 1}


def test_a_commit_writes_the_id_and_position_without_a_dictionary_and_restores_the_session(spark, tmp_path):
    """commit_batch switches Parquet's dictionary off for the id and the position only, in both the
    creating append and the MERGE, and leaves the session's conf as it found it. Real batches never
    repeat those values, so Parquet would drop the dictionary anyway; these rows repeat every column,
    so that a dictionary left on shows in the files' encodings."""
    import pyarrow.parquet as pq

    from deltadrain.run.commit import (
        TXN_APP,
        TXN_VERSION,
        USER_METADATA,
        NewTable,
        commit_batch,
        no_dictionary,
    )

    path = tmp_path / "t"
    spark.conf.set(no_dictionary("note"), "true")  # the session's own switch for another column stays

    def rows(batch: int):
        return spark.range(2000).selectExpr(
            f"format_string('evt-%d-%d', {batch}, id % 5) AS event_id", "'orders:0' AS _dd_partition",
            f"'{batch}-0' AS _dd_position", "'x' AS note")

    def encodings(files) -> dict:
        seen = {}
        for f in files:
            meta = pq.ParquetFile(f).metadata
            for i in range(meta.num_columns):
                seen.setdefault(meta.schema.column(i).name, set()).update(meta.row_group(0).column(i).encodings)
        return seen

    for batch in (0, 1):
        before = set(path.glob("*.parquet"))
        result = commit_batch(spark, str(path), pipeline="dict", expected_batch=batch, run_id=f"r{batch}",
                              rows=rows(batch), id_field="event_id", window_start=None,
                              metadata=json.dumps({"pipeline": "dict", "batch": batch + 1, "run_id": f"r{batch}"}),
                              create=NewTable() if batch == 0 else None)
        assert result.outcome.value == "committed", result
        new = set(path.glob("*.parquet")) - before
        seen = encodings(new)
        assert new and not any("DICTIONARY" in e for c in ("event_id", "_dd_position") for e in seen[c]), seen
        assert all(any("DICTIONARY" in e for e in seen[c]) for c in ("_dd_partition", "note")), seen
    assert spark.read.format("delta").load(str(path)).count() == 4000
    assert all(spark.conf.get(no_dictionary(c), None) is None for c in ("event_id", "_dd_position"))
    assert spark.conf.get(no_dictionary("note")) == "true"
    assert all(spark.conf.get(key, None) is None for key in (TXN_APP, TXN_VERSION, USER_METADATA))
    spark.conf.unset(no_dictionary("note"))


def test_the_benchs_live_heap_probe_sees_what_the_driver_jvm_holds(spark):
    """bench.jvm_live_heap_mib counts 128 MiB the driver holds, and is steady while nothing changes.
    The session has run other tests, so Spark and Delta may still free memory in the background
    (one CI run read 12.8 MiB less on the next call, another failed here once): so the baseline is
    taken only once two probes in a row agree, and only then is the 128 MiB added. G1 counts a
    4 MiB array as five 1 MiB regions, hence up to 160 MiB for the 128.
    (Py4J keeps arrays it handed out alive, so letting them go is not part of this check.)"""
    from deltadrain.dev.bench import jvm_live_heap_mib

    gateway = spark.sparkContext._gateway
    readings = [jvm_live_heap_mib(spark)]
    for _ in range(10):
        readings.append(jvm_live_heap_mib(spark))
        if abs(readings[-1] - readings[-2]) < 2:
            break
    assert abs(readings[-1] - readings[-2]) < 2, readings  # the probe settles when nothing changes
    held = [gateway.new_array(gateway.jvm.long, 2**19) for _ in range(32)]  # 4 MiB each
    with_it = jvm_live_heap_mib(spark)
    assert 112 < with_it - readings[-1] < 200, (readings, with_it)
    assert len(held) == 32


BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}:\n    pass\n"


def test_the_benchs_cpu_accounting_puts_each_process_under_its_role(spark):
    """bench.cpu_by_role on real processes: a stand-in server in a session of its own burns 1 core-second,
    the Spark job's Python workers 2 x 0.6, this driver 0.5; each shows under its own role, and the
    machine's busy time covers them all. (How much the JIT compiles for one job is the JVM's business:
    only that it is read.)"""
    from deltadrain.dev.bench import cpu_by_role, cpu_report

    server = subprocess.Popen([sys.executable, "-c", BURN.format(s=1.0) + "print('burnt', flush=True)\ntime.sleep(60)"],
                              start_new_session=True, stdout=subprocess.PIPE, text=True)
    try:
        before = cpu_by_role(server.pid, spark)
        started = time.monotonic()
        sc = spark.sparkContext
        assert sc.parallelize(range(2), 2).mapPartitions(lambda _: [exec(BURN.format(s=0.6)) or 1]).sum() == 2
        exec(BURN.format(s=0.5))
        assert server.stdout.readline().strip() == "burnt"
        after = cpu_by_role(server.pid, spark)
    finally:
        server.kill()
        server.wait()
    used = {k: after[k] - before[k] for k in after}
    assert 0.95 <= used["source_server"] < 1.3, used  # the server's own start may precede `before`
    assert 1.2 <= used["python_workers"] < 3.0, used  # plus the workers' start and their imports
    assert 0.5 <= used["driver_python"] < 1.2, used
    assert used["driver_jvm"] > 0 and 0 <= used["driver_jvm_jit"] < 30, used
    assert used["machine_busy"] >= used["source_server"] + used["python_workers"] + used["driver_python"] - 0.1, used
    report = cpu_report(before, after, 200_000, time.monotonic() - started)
    assert report["core_seconds_per_100k"]["source_server"] == round(used["source_server"] / 2, 3)


def test_a_table_another_process_created_meanwhile_is_taken_as_it_is(spark, tmp_path):
    """A table another process created after this session looked at the path and found none (here
    delta-rs; in the stale-run test a second drain) is taken as it is: not re-created, not
    replaced, no error. (The simultaneous race itself is timing-bound; the stale-run and
    concurrent-drain tests meet it.)"""
    import pyarrow as pa
    from deltalake import write_deltalake

    from deltadrain.lake.delta import ensure_table, is_table, table_version

    path = str(tmp_path / "raced")
    assert not is_table(spark, path)
    write_deltalake(path, pa.table({"id": pa.array([7], pa.int64())}))
    ensure_table(spark, path, spark.range(1).schema)
    assert table_version(path) == 0
    assert [r.id for r in spark.read.format("delta").load(path).collect()] == [7]


def test_a_creation_under_way_or_abandoned_does_not_fail_table_creation(spark, tmp_path):
    """Another creator's `_delta_log` directory exists before its first commit, and stays if that
    creator died: Delta's table builder fails on it with DELTA_TABLE_NOT_FOUND (the stale-run test
    met this in CI). A plain table is created all the same; a clustered one, which only the builder
    can declare, waits for the creator under way and takes its table."""
    import threading

    import pyarrow as pa
    from deltalake import write_deltalake

    from deltadrain.lake.delta import ensure_table, exists, table_version

    abandoned = tmp_path / "abandoned"
    (abandoned / "_delta_log").mkdir(parents=True)
    assert not exists(str(abandoned))
    ensure_table(spark, str(abandoned), spark.range(1).schema)
    assert table_version(str(abandoned)) == 0

    under_way = tmp_path / "under_way"
    (under_way / "_delta_log").mkdir(parents=True)
    creator = threading.Timer(1.5, write_deltalake, (str(under_way), pa.table({"id": pa.array([7], pa.int64())})))
    creator.start()
    ensure_table(spark, str(under_way), spark.range(1).schema, cluster_by=["id"])
    creator.join()
    assert table_version(str(under_way)) == 0
    assert [r.id for r in spark.read.format("delta").load(str(under_way)).collect()] == [7]


def test_a_plain_table_is_made_by_delta_rs_as_spark_would_make_it(spark, tmp_path):
    """A plain table (no clustering, no properties) is created with delta-rs, no Spark job: the same
    columns and types as Spark's own empty write, every one nullable (as a DataFrame write makes them),
    the same partitioning, and Spark MERGEs into it."""
    import json

    from pyspark.sql.types import _parse_datatype_string

    from deltadrain.lake.delta import ensure_table, merge_into, table_version

    schema = _parse_datatype_string(
        "id STRING NOT NULL, p STRING, n BIGINT NOT NULL, amount DECIMAL(38,9), at TIMESTAMP, raw BINARY, "
        "tags ARRAY<STRING>, attrs MAP<STRING, INT>, inner STRUCT<a: INT NOT NULL, b: ARRAY<STRUCT<c: STRING>>>")
    ours, theirs = str(tmp_path / "ours"), str(tmp_path / "theirs")
    ensure_table(spark, ours, schema, partition_by=["p"])
    spark.createDataFrame([], schema).write.format("delta").partitionBy("p").save(theirs)
    assert table_version(ours) == 0
    first = [json.loads(line) for line in (tmp_path / "ours" / "_delta_log" / f"{0:020d}.json").read_text().splitlines()]
    info = next(a["commitInfo"] for a in first if "commitInfo" in a)
    assert "Apache-Spark" not in json.dumps(info), info  # delta-rs made it
    meta = next(a["metaData"] for a in first if "metaData" in a)
    assert meta["partitionColumns"] == ["p"]
    read = [spark.read.format("delta").load(path).schema for path in (ours, theirs)]
    assert read[0] == read[1] and read[0].fieldNames() == schema.fieldNames()
    row = ("a", "x", 1, None, None, b"r", ["t"], {"k": 1}, (1, [("c",)]))
    merge_into(spark, ours, spark.createDataFrame([row], schema), "d.id = s.id", "WHEN NOT MATCHED THEN INSERT *",
               alias="d")
    assert [(r.id, r.p, r.inner.a) for r in spark.read.format("delta").load(ours).collect()] == [("a", "x", 1)]


def test_valkey_xadd_xreadgroup_xack_roundtrip_with_aof(valkey_server, cfg):
    from deltadrain.sources.valkey.client import valkey_client
    from tests.support.valkey import valkey_admin

    client = valkey_client(cfg, cfg.pipeline("orders"))
    assert valkey_admin().config_get("appendonly")["appendonly"] == "yes"
    assert valkey_admin().config_get("appendfsync")["appendfsync"] == "always"
    stream = "platform:{rt}"
    client.delete(stream)
    client.xgroup_create(stream, "g", id="0", mkstream=True)
    ids = [client.xadd(stream, {b"data": f"m{i}".encode()}) for i in range(3)]
    got = client.xreadgroup("g", "c1", {stream: ">"}, count=10)
    assert [e[0] for e in got[0][1]] == ids
    assert client.xpending(stream, "g")["pending"] == 3
    assert client.xack(stream, "g", *ids) == 3
    assert client.xpending(stream, "g")["pending"] == 0


def test_kafka_produce_consume_roundtrip_and_spark_batch_read(kafka_broker, cfg, spark):
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    from deltadrain.dev.produce import produce
    from deltadrain.sources.kafka.client import kafka_bootstrap, kafka_spark_options

    pipeline = cfg.pipeline("clicks")
    result = produce(cfg, pipeline, 300, seed=11)
    assert result.count == 300 and len(result.per_partition) == 6
    consumer = Consumer({"bootstrap.servers": kafka_bootstrap(cfg, pipeline.source), "group.id": "rt",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition("clicks", p, OFFSET_BEGINNING) for p in range(6)])
    seen = set()
    deadline = time.monotonic() + 60
    while len(seen) < 300 and time.monotonic() < deadline:
        msg = consumer.poll(1.0)
        if msg is not None and msg.error() is None:
            seen.add(msg.key().decode())
    consumer.close()
    assert seen == set(result.valid_ids)
    df = (spark.read.format("kafka").options(**kafka_spark_options(cfg, pipeline))
          .option("subscribe", "clicks").option("startingOffsets", "earliest")
          .option("endingOffsets", "latest").load())
    assert df.count() == 300


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env={**os.environ, **(env or {})},
                          timeout=300, cwd=ROOT)


def test_produce_is_deterministic_for_a_seed(valkey_server, cfg):
    from deltadrain.sources.valkey.client import valkey_client

    client = valkey_client(cfg, cfg.pipeline("orders"))
    streams = cfg.pipeline("orders").source.streams

    def contents():
        return {s: [fields[b"data"] for _, fields in client.xrange(s)] for s in streams}

    runs = []
    for _ in range(2):
        client.delete(*streams)
        done = run_cli("produce", "orders", "--count", "400", "--seed", "5", "--malformed-ratio", "0.1",
                       "--poison-ratio", "0.01")
        assert done.returncode == 0, done.stderr
        summary = json.loads(done.stdout.splitlines()[-1])
        runs.append((summary, contents()))
    assert runs[0] == runs[1]
    assert runs[0][0]["produced"] == 400 and runs[0][0]["malformed"] > 0 and runs[0][0]["poison"] > 0
    assert sum(len(v) for v in runs[0][1].values()) == 400
    client.delete(*streams)


def test_cli_config_error_names_file_pipeline_and_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text((ROOT / "config" / "pipelines.yaml").read_text().replace("batch_cap: 10000", "batch_cap: -5"))
    done = run_cli("--config", str(bad), "produce", "orders", "--count", "1")
    assert done.returncode == 2
    assert str(bad) in done.stderr and "pipeline 'orders'" in done.stderr and "field 'batch_cap'" in done.stderr
    assert "Traceback" not in done.stderr


def test_missing_jar_cache_names_the_fix(tmp_path):
    done = subprocess.run([sys.executable, "-c", "from deltadrain.runtime.session import get_spark; get_spark()"],
                          capture_output=True, text=True, env={**os.environ, "DELTADRAIN_JARS": str(tmp_path)})
    assert done.returncode != 0 and "make jars" in done.stderr
