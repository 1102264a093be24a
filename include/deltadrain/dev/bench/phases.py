"""The benchmark's phases, each run inside one Spark driver process (`run_phase`, started by
`_subphase` as `python -m deltadrain.dev.bench`) so that peak memory does not mix."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, cast

from deltadrain.dev.bench.measure import (
    _rss_kib,
    cpu_by_role,
    cpu_report,
    jvm_live_heap_mib,
    memory_report,
    tree_cpu_seconds,
)

# -- phases run inside one Spark driver process ------------------------------------------------------

def phase_raw_read(cfg, pipeline, spark, server_group: int | None = None) -> dict:
    """XREADGROUP only, with its own group and the drain's own task plan: the read limit."""
    from deltadrain.sources.valkey.claim import READ_CHUNK, _client, allocate, plan, read_new, reader
    from deltadrain.sources.valkey.drain import backlog, claim_context

    client_ctx = claim_context(cfg, pipeline, "raw-reader")
    ctx = client_ctx.__class__(**{**client_ctx.__dict__, "group": "bench-raw"})
    client = _client(ctx)
    for stream in pipeline.source.streams:
        try:
            client.xgroup_create(stream, "bench-raw", id="0")
        except Exception as exc:
            if "BUSYGROUP" not in str(exc):
                raise
    total = sum(backlog(client, pipeline.source).values())
    tasks = plan(allocate(total, {s: client.xlen(s) for s in pipeline.source.streams}))

    def read(task):
        c = reader(ctx)
        got = 0
        while got < task.quota:
            # The claim's own read (unparsed replies, READ_CHUNK at a time): the limit is the read alone.
            entries = read_new(c, ctx.group, ctx.consumer, task.stream, min(READ_CHUNK, task.quota - got))
            if not entries:
                break
            got += len(entries)
        yield got

    cpu_before = cpu_by_role(server_group, spark)
    started = time.monotonic()
    n = spark.sparkContext.parallelize(tasks, len(tasks)).flatMap(read).sum()
    seconds = time.monotonic() - started
    cpu = cpu_report(cpu_before, cpu_by_role(server_group, spark), n, seconds)
    for stream in pipeline.source.streams:
        client.xgroup_destroy(stream, "bench-raw")
    return {"messages": int(n), "seconds": round(seconds, 2), "rate": round(n / seconds), "cpu": cpu}


def phase_cpu(server_group: int | None, spark, connect_pid: int | None) -> dict:
    """`cpu_by_role` for a phase; with `connect_pid`, `spark` is a Spark Connect session and the server's
    process tree (its JVM and Python workers) is a role of its own."""
    if connect_pid is None:
        return cpu_by_role(server_group, spark)
    return {**cpu_by_role(server_group), "connect_server": tree_cpu_seconds(connect_pid)}


def phase_drain(cfg, pipeline, spark, server_group: int | None = None, connect_pid: int | None = None) -> dict:
    """Batches until the backlog is gone. With `connect_pid`, `spark` is a Spark Connect session and the
    server's process tree (its JVM and Python workers) is a role of its own in the CPU report."""
    from deltadrain.catchup import drain

    def cpu() -> dict:
        return phase_cpu(server_group, spark, connect_pid)

    runs: list[dict[str, Any]] = []
    cpu_before = cpu()
    started = time.monotonic()
    while True:
        s = drain(cfg, pipeline, spark=spark)
        if s.outcome == "empty":
            break
        runs.append({"claimed": s.claimed, "written": s.written, "seconds": s.seconds, "timings": s.timings})
    seconds = time.monotonic() - started
    n = sum(r["claimed"] for r in runs)
    return {"messages": n, "seconds": round(seconds, 2), "rate": round(n / seconds) if seconds else 0,
            "batches": len(runs), "runs": runs, "cpu": cpu_report(cpu_before, cpu(), n, seconds)}


def phase_delta_append(cfg, pipeline, spark, workdir: Path) -> dict:
    """Plain Delta append of the same rows the drain wrote: the write limit."""
    rows = spark.read.format("delta").load(str(cfg.target_path(pipeline)))
    staged = str(workdir / "append-source")
    rows.write.mode("overwrite").parquet(staged)  # so that reading the Delta table is not timed
    src = spark.read.parquet(staged)
    n = src.count()
    started = time.monotonic()
    src.write.format("delta").mode("append").save(str(workdir / "plain-append"))
    seconds = time.monotonic() - started
    return {"messages": n, "seconds": round(seconds, 2), "rate": round(n / seconds)}


WINDOW_ROUNDS = 7


def phase_window(cfg, pipeline, spark, batch_rows: int) -> dict:
    """The same batch MERGEd into a target of 1x and of 100x rows; the 100x rows are older than the
    dedup window (spread over the 100 windows before it), as a table that grew over time is.
    Both tables are built first, then the two are measured alternately, so neither gets the colder JVM."""
    from datetime import UTC, datetime, timedelta

    from pyspark.sql import functions as F

    from deltadrain.run.commit import commit_batch

    now = datetime.now(UTC).replace(microsecond=0)
    window = pipeline.dedup_window
    template = spark.read.format("delta").load(str(cfg.target_path(pipeline))).limit(batch_rows).cache()
    have = template.count()
    paths = {}
    for factor in (1, 100):
        path = paths[factor] = str(Path(cfg.lake_dir()) / f"window_{factor}x")
        # Each older window's rows are written as files of their own, as successive batches are.
        for k in range(factor):
            age = window * (k + (1 if factor > 1 else 0)) + timedelta(seconds=1)
            (template.withColumn("event_id", F.concat(F.lit(f"old{k}-"), F.col("event_id")))
             .withColumn("_dd_source_ts", F.lit(now - age)).coalesce(1)
             .write.format("delta").mode("append").save(path))
    timings: dict[int, list[float]] = {1: [], 100: []}
    # One warm-up round and seven measured ones: with three, one slow MERGE moved the ratio by 0.2.
    for attempt in range(WINDOW_ROUNDS + 1):
        for factor in (1, 100) if attempt % 2 == 0 else (100, 1):
            b = (template.withColumn("event_id", F.concat(F.lit(f"new{attempt}-"), F.col("event_id")))
                 .withColumn("_dd_source_ts", F.lit(now)))
            started = time.monotonic()
            commit_batch(spark, paths[factor], pipeline=f"window{factor}", expected_batch=attempt,
                         run_id=f"w{attempt}", rows=b, id_field="event_id", window_start=now - window,
                         metadata=json.dumps({"pipeline": f"window{factor}", "batch": attempt + 1,
                                              "run_id": f"w{attempt}"}))
            timings[factor].append(time.monotonic() - started)
    template.unpersist()
    results = {}
    for factor, values in timings.items():
        measured = sorted(values[1:])  # the first round warms the JVM up
        results[f"{factor}x"] = {"target_rows": have * factor, "batch_rows": have,
                                 "batch_seconds_median": round(measured[len(measured) // 2], 3),
                                 "batch_seconds": [round(t, 3) for t in values]}
    results["ratio_100x_to_1x"] = round(results["100x"]["batch_seconds_median"] / results["1x"]["batch_seconds_median"], 3)
    return results


def phase_structured_streaming(cfg, pipeline, spark, workdir: Path, server_group: int | None = None,
                               connect_pid: int | None = None) -> dict:
    """The canonical alternative for a Kafka topic: Structured Streaming with Trigger.AvailableNow and
    foreachBatch MERGE (insert-only on the id) made idempotent by txnAppId/txnVersion = batch id.
    Same topic, same target columns, same batch size (maxOffsetsPerTrigger = the drain's batch cap).
    The MERGE is the drain's own SQL statement (`lake.merge_into`), so the same function runs in a
    local driver and, with `connect_pid`, in the Spark Connect server's Python worker that runs a
    Connect client's foreachBatch."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType, _parse_datatype_string

    from deltadrain.sources.kafka.client import kafka_spark_options

    schema = pipeline.payload_schema
    # A list of fields parses to a StructType.
    payload = cast(StructType, _parse_datatype_string(", ".join(f"`{n}` {t}" for n, t in schema.fields.items())))
    target = str(workdir / "ss-target")
    app_id = f"{pipeline.name}-ss"
    stream = (spark.readStream.format("kafka").options(**kafka_spark_options(cfg, pipeline))
              .option("subscribe", pipeline.source.topic).option("startingOffsets", "earliest")
              .option("maxOffsetsPerTrigger", str(pipeline.batch_cap)).load())
    rows = stream.select(
        F.from_json(F.col("value").cast("string"), payload).alias("j"), "partition", "offset", "timestamp").select(
        *[F.col(f"j.`{n}`").alias(n) for n in schema.fields],
        F.col("partition").cast("string").alias("_dd_partition"), F.col("offset").cast("string").alias("_dd_position"),
        F.col("offset").alias("_dd_pos_hi"), F.lit(0).cast("long").alias("_dd_pos_lo"),
        F.col("timestamp").alias("_dd_source_ts"), F.lit(1).alias("_dd_attempts"))

    def upsert(df, batch_id: int) -> None:
        from pyspark.sql import functions as F

        from deltadrain.lake.delta import ensure_table, merge_into
        from deltadrain.run.commit import TXN_APP, TXN_VERSION

        session = df.sparkSession
        out = df.select("*", F.lit(batch_id).cast("long").alias("_dd_batch"), F.lit("ss").alias("_dd_run_id"),
                        F.current_timestamp().alias("_dd_ingested_at"))
        ensure_table(session, target, out.schema)
        session.conf.set(TXN_APP, app_id)
        session.conf.set(TXN_VERSION, str(batch_id))
        try:
            merge_into(session, target, out, "t.event_id = s.event_id", "WHEN NOT MATCHED THEN INSERT *")
        finally:
            session.conf.unset(TXN_APP)
            session.conf.unset(TXN_VERSION)

    def cpu() -> dict:
        return phase_cpu(server_group, spark, connect_pid)

    cpu_before = cpu()
    started = time.monotonic()
    query = (rows.writeStream.foreachBatch(upsert).trigger(availableNow=True)
             .option("checkpointLocation", str(workdir / "ss-checkpoint")).start())
    query.awaitTermination()
    seconds = time.monotonic() - started
    cpu_after = cpu()
    n = spark.read.format("delta").load(target).count()
    # Through Connect the function runs in the server's worker: the table's log counts the batches.
    from deltalake import DeltaTable

    batches = sum(1 for c in DeltaTable(target).history() if c.get("operation") in ("MERGE", "WRITE"))
    return {"messages": n, "seconds": round(seconds, 2), "rate": round(n / seconds) if seconds else 0,
            "batches": batches, "cpu": cpu_report(cpu_before, cpu_after, n, seconds)}


SINGLE_APP = "single-process"


def target_shaped_rows(spark, path: Path, batch: int, rows: int) -> None:
    """`rows` rows shaped like the bench pipeline's target rows for batch `batch` (the produce module's
    event: a unique id, a customer out of 10 000, amount, quantity, status, event time, a padding note;
    plus deltadrain's meta columns), staged as Parquet at `path` as claims stage them. Ids and positions
    never repeat across batches: batch b holds `evt-7-%09d` of b * rows to (b + 1) * rows - 1."""
    first = batch * rows
    (spark.range(first, first + rows, numPartitions=2).selectExpr(
        "format_string('evt-7-%09d', id) AS event_id",
        "format_string('cust-%05d', pmod(hash(id, 1), 10000)) AS customer",
        "pmod(hash(id, 2), 50000) / 100.0 AS amount",
        "pmod(hash(id, 3), 9) + 1 AS quantity",
        "element_at(array('created', 'paid', 'shipped', 'refunded'), pmod(hash(id, 4), 4) + 1) AS status",
        "timestamp_millis(1790000000000 + id) AS event_time",
        "repeat('x', 20 + pmod(hash(id, 5), 20)) AS note",
        "'orders:' || CAST(id % 4 AS STRING) AS _dd_partition",
        "format_string('%d-%d', 1790000000000 + id, 0) AS _dd_position",
        "1790000000000 + id AS _dd_pos_hi", "0L AS _dd_pos_lo",
        "timestamp_millis(1790000000000 + id) AS _dd_source_ts", "1 AS _dd_attempts",
        f"{batch}L AS _dd_batch", f"'run-{batch}' AS _dd_run_id", "current_timestamp() AS _dd_ingested_at")
     .write.mode("overwrite").parquet(str(path)))


def phase_server_warm_up(pipeline, url: str, workdir: Path, commits: int) -> dict:
    """A server that lives on has committed many full-size batches; one just started is still compiling
    (bench/server_warmth/README.md). `commits` batches of the drain's
    size, shaped like its rows, committed as the drain commits them (`commit.commit_batch`: insert-only
    MERGE on the id within the batch's id range and the dedup window, the batch number as the app
    transaction) into a table of their own, each from a session of its own as drain runs open them."""
    from datetime import UTC, datetime
    from uuid import uuid4

    from deltadrain.lake.checkpoint import commit_metadata
    from deltadrain.run.commit import NewTable, commit_batch, dedup_window_start
    from deltadrain.runtime.session import connect_session

    work = workdir / "server-warm-up"
    shutil.rmtree(work, ignore_errors=True)
    table, rows, times = str(work / "target"), pipeline.batch_cap, []
    for batch in range(commits):
        session = connect_session(url, purpose="deltadrain bench warm-up")
        try:
            target_shaped_rows(session, work / "stage", batch, rows)
            first = batch * rows
            oldest = datetime.fromtimestamp((1790000000000 + first) / 1000, UTC)
            run_id = uuid4().hex
            started = time.monotonic()
            result = commit_batch(session, table, pipeline="warm-up", expected_batch=batch, run_id=run_id,
                                  rows=session.read.parquet(str(work / "stage")), id_field="event_id",
                                  window_start=dedup_window_start(oldest, pipeline.dedup_window),
                                  metadata=commit_metadata("warm-up", batch + 1, run_id, {}),
                                  id_range=(f"evt-7-{first:09d}", f"evt-7-{first + rows - 1:09d}"),
                                  create=None if batch else NewTable())
            times.append(round(time.monotonic() - started, 3))
        finally:
            session.stop()
        if result.outcome.value != "committed":
            raise RuntimeError(f"server warm-up commit {batch + 1}: {result}")
    shutil.rmtree(work, ignore_errors=True)
    tail = sorted(times[-5:])
    return {"commits": commits, "rows": rows, "commit_s": times,
            "last_5_median_s": tail[len(tail) // 2] if tail else None}


def single_process_batch(client, pipeline, group: str, consumer: str, cap: int) -> tuple[dict[str, list], list]:
    """XREADGROUP > of every stream until `cap` entries or none are left: ({stream: ids}, payloads)."""
    from deltadrain.sources.valkey.claim import READ_CHUNK
    from deltadrain.sources.valkey.client import VALKEY_FIELD

    ids: dict[str, list] = {}
    payloads: list[bytes] = []
    open_streams = list(pipeline.source.streams)
    while open_streams and len(payloads) < cap:
        for stream in list(open_streams):
            want = min(READ_CHUNK, cap - len(payloads))
            if want <= 0:
                break
            reply = client.xreadgroup(group, consumer, {stream: ">"}, count=want)
            entries = reply[0][1] if reply else []
            if len(entries) < want:
                open_streams.remove(stream)
            for entry_id, fields in entries:
                ids.setdefault(stream, []).append(entry_id)
                payloads.append(fields[VALKEY_FIELD])
    return ids, payloads


def phase_single_process(cfg, pipeline, workdir: Path, group: str) -> dict:
    """The consumer a user could write instead, in one Python process on one core: valkey-py
    XREADGROUP, pyarrow's JSON decoder, a delta-rs insert-only MERGE on the id with the batch number
    as a Delta app transaction and the streams' last positions as the commit's metadata (one commit),
    XACK after the commit. No dedup window, no quarantine, no gap check: less work than the drain."""
    import io

    import pyarrow as pa
    import pyarrow.json as pj
    from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
    from deltalake.exceptions import TableNotFoundError

    from deltadrain.sources.valkey.client import valkey_client

    types = {"string": pa.string(), "double": pa.float64(), "long": pa.int64(), "int": pa.int32(),
             "timestamp": pa.timestamp("us", tz="UTC"), "boolean": pa.bool_()}
    schema = pa.schema([(n, types[t]) for n, t in pipeline.payload_schema.fields.items()])
    parse = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    id_field = pipeline.payload_schema.id_field
    target = str(workdir / "single-process-target")
    client = valkey_client(cfg, pipeline)
    for stream in pipeline.source.streams:
        try:
            client.xgroup_create(stream, group, id="0")
        except Exception as exc:
            if "BUSYGROUP" not in str(exc):
                raise
    try:
        table = DeltaTable(target)
        version = table.transaction_version(SINGLE_APP) or 0
    except TableNotFoundError:
        table, version = None, 0
    # The decoder's first call loads what it needs (3 s in a cold process): outside the timing, as a
    # Spark driver's JVM start is.
    pj.read_json(io.BytesIO(b'{"%s": "x", "event_time": "2026-01-01T00:00:00Z"}' % id_field.encode()),
                 parse_options=parse)
    runs: list[dict[str, Any]] = []
    cpu_before = cpu_by_role()
    started = time.monotonic()
    while True:
        t0 = time.monotonic()
        ids, payloads = single_process_batch(client, pipeline, group, "single", pipeline.batch_cap)
        if not payloads:
            break
        t1 = time.monotonic()
        rows = pj.read_json(io.BytesIO(b"\n".join(payloads)), parse_options=parse)
        streams = [s for s, got in ids.items() for _ in got]
        positions = [i.decode() for got in ids.values() for i in got]
        rows = rows.append_column("_dd_partition", pa.array(streams, pa.string()))
        rows = rows.append_column("_dd_position", pa.array(positions, pa.string()))
        t2 = time.monotonic()
        version += 1
        props = CommitProperties(app_transactions=[Transaction(SINGLE_APP, version)],
                                 custom_metadata={"positions": json.dumps({s: got[-1].decode() for s, got in ids.items()})})
        if table is None:
            write_deltalake(target, rows.schema.empty_table(), mode="append")
            table = DeltaTable(target)
        (table.merge(rows, f"t.{id_field} = s.{id_field}", source_alias="s", target_alias="t",
                     commit_properties=props).when_not_matched_insert_all().execute())
        t3 = time.monotonic()
        pipe = client.pipeline(transaction=False)
        for stream, got in ids.items():
            pipe.xack(stream, group, *got)
        pipe.execute()
        t4 = time.monotonic()
        runs.append({"claimed": len(payloads), "seconds": round(t4 - t0, 3),
                     "timings": {"read": round(t1 - t0, 3), "decode": round(t2 - t1, 3),
                                 "merge": round(t3 - t2, 3), "ack": round(t4 - t3, 3)}})
    seconds = time.monotonic() - started
    n = sum(r["claimed"] for r in runs)
    return {"messages": n, "seconds": round(seconds, 2), "rate": round(n / seconds) if seconds else 0,
            "batches": len(runs), "runs": runs, "cpu": cpu_report(cpu_before, cpu_by_role(), n, seconds)}


def run_phase(phase: str, config: str, pipeline_name: str, workdir: str, arg: int) -> dict:
    from deltadrain.config import load_config
    from deltadrain.dev import services
    from deltadrain.runtime.session import get_spark

    cfg = load_config(config)
    pipeline = cfg.pipeline(pipeline_name)
    server = services.valkey_service(cfg) if pipeline.source.kind == "valkey" else services.kafka_service(cfg)
    group = server.pid()  # services start in a session of their own: the pid is the process group
    if phase == "single_process":  # no Spark at all
        out = phase_single_process(cfg, pipeline, Path(workdir), pipeline.source.group)
        out.update(memory_report())
        return out
    if phase == "server_warm_up":
        from deltadrain.config.embedded import spark_connect_url

        return phase_server_warm_up(pipeline, spark_connect_url(cfg), Path(workdir), arg)
    if phase in ("drain_connect", "structured_streaming_connect"):  # clients of the embedded server
        from deltadrain.config.embedded import spark_connect_url
        from deltadrain.runtime.session import connect_session

        connect_pid = services.spark_connect_service(cfg).pid()
        session = connect_session(spark_connect_url(cfg), purpose="deltadrain bench")
        if phase == "drain_connect":
            out = phase_drain(cfg, pipeline, session, group, connect_pid=connect_pid)
        else:
            out = phase_structured_streaming(cfg, pipeline, session, Path(workdir), group, connect_pid=connect_pid)
        out["connect_server_rss_mib"] = round(_rss_kib(connect_pid) / 1024, 1) if connect_pid else None
        session.stop()
        out.update(memory_report())
        return out
    spark = get_spark(f"deltadrain-bench-{phase}", cfg=cfg)
    spark.sparkContext.setLogLevel("ERROR")
    if phase == "raw_read":
        out = phase_raw_read(cfg, pipeline, spark, group)
    elif phase == "drain":
        out = phase_drain(cfg, pipeline, spark, group)
        out["driver_jvm_live_heap_mib"] = jvm_live_heap_mib(spark)  # after the timing: it runs a full GC
    elif phase == "append":
        out = phase_delta_append(cfg, pipeline, spark, Path(workdir))
    elif phase == "window":
        out = phase_window(cfg, pipeline, spark, arg)
    elif phase == "structured_streaming":
        out = phase_structured_streaming(cfg, pipeline, spark, Path(workdir), group)
    else:
        raise ValueError(phase)
    out.update(memory_report())
    return out


def _subphase(phase: str, config: Path, name: str, workdir: Path, arg: int = 0) -> dict:
    cmd = [sys.executable, "-m", "deltadrain.dev.bench", phase, str(config), name, str(workdir), str(arg)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"bench phase {phase} failed:\n{done.stderr[-4000:]}")
    # The JVM may print after the phase's report (py4j, hadoop-aws at shutdown): the report is the last JSON line.
    return json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])
