"""`deltadrain bench`: the Valkey drain measured against the raw limits, side by side, in one run;
`--source kafka`: the Kafka drain against Structured Streaming (run_kafka_bench).

Phases (each in a process of its own where peak memory matters, so peaks do not mix):
1. produce N ~200-byte JSON messages over P stream partitions;
2. raw read limit: XREADGROUP-only over the same entries with a separate group, same Spark task plan;
3. the drain: batches of `--batch` until the backlog is gone (JVM start excluded);
4. raw write limit: plain Delta append of the same rows (read back from the drained table);
5. fixed overhead: a one-message batch;
6. driver memory as the backlog grows 10x: peak RSS of the driver (Python) and of its JVM, and the
   JVM's live heap after the last batch (used heap after a full GC: what it retains, not what G1 grew to);
7. batch time into a target holding 1x and 100x rows (the MERGE's window keeps the scan bounded).

The drain phases also report where the CPU went (`cpu_by_role`): on a small machine the drain's rate
is set by the cores it shares with the source's server, not by any one step's latency.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from deltadrain.dev.services.process import all_pids, proc_stat
from deltadrain.paths import PROJECT_ROOT


def _bench_config(workdir: Path, partitions: int, batch: int, window: str = "PT1H",
                  kind: str = "valkey") -> tuple[Path, str]:
    base = yaml.safe_load((PROJECT_ROOT / "config" / "pipelines.yaml").read_text())
    pipe = next(p for p in base["pipelines"] if p["source"]["kind"] == kind)
    name = f"bench_{int(time.time())}"
    pipe.update(name=name, batch_cap=batch, transform="deltadrain.transforms.identity", dedup_window=window)
    if kind == "valkey":
        pipe["source"]["streams"] = [f"{name}:{{{i}}}" for i in range(partitions)]
    else:
        pipe["source"].update(topic=name, partitions=partitions, group=f"{name}-group")
    pipe["target"] = {"path": name}
    pipe.pop("quality", None)
    base["pipelines"] = [pipe]
    base["data_dir"] = str(workdir / "lake")
    path = workdir / "bench.yaml"
    path.write_text(yaml.safe_dump(base, sort_keys=False))
    return path, name


@contextlib.contextmanager
def bench_source(cfg, pipeline):
    """The pipeline's source server up for the block, and stopped after it if the bench started it
    (`services.running`); the bench's own source data deleted after it, whatever happened in it.
    Otherwise both stay: after Valkey run 12's 2.2 million entries, a server of 687 MiB resident."""
    from deltadrain.dev import services

    with services.running(cfg, [pipeline.source.kind]):
        try:
            yield
        finally:
            _drop_source(cfg, pipeline)


def _drop_source(cfg, pipeline) -> None:
    """Delete the bench pipeline's Valkey streams, failure counts and gap records, or its Kafka topic."""
    from deltadrain.config import ValkeySource
    from deltadrain.sources.kafka.client import kafka_client_conf
    from deltadrain.sources.valkey.client import valkey_client
    from deltadrain.sources.valkey.drain import failures_key
    from deltadrain.sources.valkey.gaps import gaps_key

    if isinstance(pipeline.source, ValkeySource):
        client = valkey_client(cfg, pipeline)
        for key in (*pipeline.source.streams, failures_key(pipeline.name), gaps_key(pipeline.name)):
            client.delete(key)  # one key a DEL: a cluster refuses keys of several slots in one
        return
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(kafka_client_conf(cfg, pipeline))
    for fut in admin.delete_topics([pipeline.source.topic]).values():
        with contextlib.suppress(Exception):  # never created (the run failed before producing)
            fut.result(30)


def _config_copy(config: Path, tag: str) -> Path:
    """A copy of a bench config beside it with a consumer group and a lake of its own (`TAG.yaml`), so
    that several runs drain the same Valkey entries."""
    doc = yaml.safe_load(config.read_text())
    doc["pipelines"][0]["source"]["group"] = f"bench-{tag}"
    doc["data_dir"] = str(config.parent / f"lake_{tag}")
    copy = config.parent / f"{tag}.yaml"
    copy.write_text(yaml.safe_dump(doc, sort_keys=False))
    return copy


def _status_kib(pid: int, field: str) -> int:
    """A field of /proc/PID/status in KiB (VmHWM: peak resident, VmRSS: resident); 0 once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
    except FileNotFoundError:
        pass
    return 0


def _peak_rss_kib(pid: int) -> int:
    return _status_kib(pid, "VmHWM")


def _rss_kib(pid: int) -> int:
    return _status_kib(pid, "VmRSS")


def reset_peak_rss() -> None:
    """Start this process's peak resident (VmHWM) over from its current resident, so that the next
    `_peak_rss_kib` reading is the peak of what runs in between (Linux's clear_refs, value 5)."""
    Path("/proc/self/clear_refs").write_text("5")


HZ = os.sysconf("SC_CLK_TCK")


def own_cpu_seconds(stat: list[str]) -> float:
    """utime + stime of a `proc_stat` row (fields 11 and 12 after the command name)."""
    return (int(stat[11]) + int(stat[12])) / HZ


ROLES = ("driver_python", "driver_jvm", "python_workers", "source_server")


def _processes() -> dict[int, tuple[int, int, float, float, bytes]]:
    """pid -> (parent, process group, own CPU seconds, reaped children's CPU seconds, argv[0])."""
    out = {}
    for pid in all_pids():
        stat = proc_stat(pid)
        try:
            argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
        except (FileNotFoundError, ProcessLookupError):
            stat = None
        if stat is None:  # gone meanwhile
            continue
        # After the command name: state, ppid, pgrp, ... utime (11), stime, cutime, cstime (14).
        out[pid] = (int(stat[1]), int(stat[2]), own_cpu_seconds(stat), (int(stat[13]) + int(stat[14])) / HZ, argv0)
    return out


def _jvm_pids(parent: int, procs: dict | None = None) -> list[int]:
    """The Spark JVMs a driver process started (spark-submit execs java in place)."""
    procs = _processes() if procs is None else procs
    return [pid for pid, (ppid, *_, argv0) in procs.items() if ppid == parent and argv0.endswith(b"java")]


def memory_report() -> dict:
    me = os.getpid()
    jvm = _jvm_pids(me)
    return {"driver_python_peak_mib": round(_peak_rss_kib(me) / 1024, 1),
            "driver_jvm_peak_mib": round(sum(_peak_rss_kib(p) for p in jvm) / 1024, 1)}


def cpu_by_role(server_group: int | None = None, spark=None) -> dict[str, float]:
    """CPU seconds used so far by the processes a drain runs on, by role: this driver process, its
    Spark JVM (driver and, in local mode, the executors), the JVM's Python workers (counting those
    that have exited: their parents reaped them), and the source's server (its process group). Also
    `machine_busy`: all cores' non-idle seconds, and with `spark`, `driver_jvm_jit`: the seconds
    HotSpot's compiler threads spent compiling (part of the JVM's CPU). Differences of two readings
    say where a phase's CPU went. Linux only (/proc)."""
    procs = _processes()
    children: dict[int, list[int]] = {}
    for pid, (parent, *_rest) in procs.items():
        children.setdefault(parent, []).append(pid)
    me = os.getpid()
    jvms = _jvm_pids(me, procs)
    workers, stack = 0.0, [c for j in jvms for c in children.get(j, [])]
    while stack:  # the pyspark daemon, its forked workers and anything they started
        pid = stack.pop()
        workers += procs[pid][2] + procs[pid][3]
        stack += children.get(pid, [])
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    jit = {}
    if spark is not None:  # from the JVM itself: compiler threads come and go, /proc forgets the gone ones
        bean = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getCompilationMXBean()
        jit["driver_jvm_jit"] = bean.getTotalCompilationTime() / 1000
    return {**jit, "driver_python": procs[me][2] if me in procs else 0.0,
            "driver_jvm": sum(procs[j][2] for j in jvms),
            "python_workers": workers + sum(procs[j][3] for j in jvms),
            "source_server": sum(own + reaped for _, group, own, reaped, _ in procs.values() if group == server_group)
            if server_group else 0.0,
            "machine_busy": (sum(fields) - fields[3] - fields[4]) / HZ}  # all but idle and iowait


def cpu_report(before: dict, after: dict, messages: int, seconds: float) -> dict:
    """Where a phase's CPU went: core-seconds per 100 000 messages by role, and the cores the whole
    machine kept busy on average (anything else running on it shows there, not under a role)."""
    used = {k: after[k] - before[k] for k in after}
    per = 100_000 / messages if messages else 0.0
    return {"core_seconds_per_100k": {k: round(used[k] * per, 3)
                                      for k in (*ROLES, "connect_server", "driver_jvm_jit", "machine_busy")
                                      if k in used},
            "cores_busy": round(used["machine_busy"] / seconds, 2) if seconds else 0.0}


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds of `root` and every process under it, counting children they reaped: a Spark
    Connect server's JVM and its Python workers."""
    procs = _processes()
    children: dict[int, list[int]] = {}
    for pid, (parent, *_rest) in procs.items():
        children.setdefault(parent, []).append(pid)
    total, stack = 0.0, [root] if root in procs else []
    while stack:
        pid = stack.pop()
        total += procs[pid][2] + procs[pid][3]
        stack += children.get(pid, [])
    return total


def jvm_live_heap_mib(spark, settle_rounds: int = 6) -> float:
    """Used heap of the driver JVM right after a full GC: the live set. Its peak RSS only says how far
    the collector let the heap grow, up to spark.driver.memory; this says what the driver holds on to."""
    # One GC is not enough: it clears the weak references through which Spark's ContextCleaner
    # learns that a broadcast or shuffle is gone, and the cleaner frees those blocks only afterwards,
    # on its own thread. So collect until two readings agree.
    jvm = spark.sparkContext._jvm
    bean = jvm.java.lang.management.ManagementFactory.getMemoryMXBean()
    last = None
    for _ in range(settle_rounds):
        jvm.java.lang.System.gc()
        used = bean.getHeapMemoryUsage().getUsed() / 2**20
        if last is not None and abs(used - last) < 1:
            break
        last = used
        time.sleep(0.2)
    return round(used, 1)


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

    runs = []
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

    from deltadrain.commit import commit_batch

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
    from pyspark.sql.types import _parse_datatype_string

    from deltadrain.sources.kafka.client import kafka_spark_options

    schema = pipeline.payload_schema
    payload = _parse_datatype_string(", ".join(f"`{n}` {t}" for n, t in schema.fields.items()))
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

        from deltadrain.commit import TXN_APP, TXN_VERSION
        from deltadrain.lake import ensure_table, merge_into

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

    from deltadrain.checkpoint import commit_metadata
    from deltadrain.commit import NewTable, commit_batch, dedup_window_start
    from deltadrain.spark import connect_session

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
    runs = []
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
    from deltadrain.spark import get_spark

    cfg = load_config(config)
    pipeline = cfg.pipeline(pipeline_name)
    server = services.valkey_service(cfg) if pipeline.source.kind == "valkey" else services.kafka_service(cfg)
    group = server.pid()  # services start in a session of their own: the pid is the process group
    if phase == "single_process":  # no Spark at all
        out = phase_single_process(cfg, pipeline, Path(workdir), pipeline.source.group)
        out.update(memory_report())
        return out
    if phase == "server_warm_up":
        from deltadrain.embedded import spark_connect_url

        return phase_server_warm_up(pipeline, spark_connect_url(cfg), Path(workdir), arg)
    if phase in ("drain_connect", "structured_streaming_connect"):  # clients of the embedded server
        from deltadrain.embedded import spark_connect_url
        from deltadrain.spark import connect_session

        connect_pid = services.FACTORIES["spark_connect"](cfg).pid()
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


def _machine() -> str:
    return (f"{platform.node()} {platform.machine()}, {os.cpu_count()} cores, "
            f"{round(os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30)} GiB")


def _step(label: str, fn):
    print(f"[bench] {label} ...", file=sys.stderr, flush=True)
    started = time.monotonic()
    out = fn()
    print(f"[bench] {label}: {json.dumps(out)[:300]} ({time.monotonic() - started:.0f}s)", file=sys.stderr, flush=True)
    return out


def combine_rounds(rounds: list[dict]) -> dict:
    """Per-round results of both sides -> each side's rate over all rounds and their ratio (pure).

    The ratio of the summed rates weighs every message alike; the per-round ratios show the spread.
    """
    def overall(side: str) -> dict:
        messages = sum(r[side]["messages"] for r in rounds)
        seconds = round(sum(r[side]["seconds"] for r in rounds), 2)
        return {"messages": messages, "seconds": seconds, "rate": round(messages / seconds) if seconds else 0}

    ss, dr = overall("structured_streaming"), overall("drain")
    per_round = [round(r["drain"]["rate"] / r["structured_streaming"]["rate"], 3) for r in rounds]
    return {"structured_streaming": ss, "drain": dr,
            "ratios": {"drain_to_structured_streaming": round(dr["rate"] / ss["rate"], 3) if ss["rate"] else None,
                       "per_round": per_round}}


def run_kafka_bench(count: int, partitions: int, batch: int, workdir: Path | None = None, rounds: int = 1,
                    executor: str = "local") -> dict:
    """deltadrain's Kafka drain against Structured Streaming (AvailableNow + foreachBatch MERGE with
    txnAppId/txnVersion) on the same topic, same target columns, same batch size, one after the other.
    `executor="local"`: each side in a fresh driver process (JVM start excluded from both);
    `executor="connect"`: each side a client of the embedded Spark Connect server, which a warm-up
    round of both sides (not counted) has warmed as a server that lives on is warm.

    With `rounds` > 1 both sides drain the topic again into fresh tables, in alternating order, so
    that neither side always runs first; a single run of each moves by ±10 % on a small machine,
    mostly in its cold first batch."""
    from deltadrain.config import load_config
    from deltadrain.dev import services

    workdir = workdir or Path(tempfile.mkdtemp(prefix="deltadrain-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    config, name = _bench_config(workdir, partitions, batch, kind="kafka")
    cfg = load_config(config)
    with bench_source(cfg, cfg.pipeline(name)):
        if executor == "local":
            return _kafka_rounds(cfg, config, name, workdir, count, partitions, batch, rounds)
        with services.running(cfg, ["spark_connect"]):
            return _kafka_rounds(cfg, config, name, workdir, count, partitions, batch, rounds, connect=True)


def _kafka_rounds(cfg, config: Path, name: str, workdir: Path, count: int, partitions: int, batch: int,
                  rounds: int, connect: bool = False) -> dict:
    from deltadrain.dev.produce import produce

    pipeline = cfg.pipeline(name)
    report: dict = {"machine": _machine(), "source": "kafka", "executor": "connect" if connect else "local",
                    "count": count, "partitions": partitions, "batch_cap": batch}

    def produced() -> dict:
        started = time.monotonic()
        r = produce(cfg, pipeline, count, seed=7, progress=True)
        return {"messages": r.count, "rate": round(r.count / (time.monotonic() - started)),
                "per_partition": dict(r.per_partition)}

    def phase(side: str, label: str) -> dict:
        out = _step(label, lambda: _subphase(side + ("_connect" if connect else ""), config, name, workdir))
        # The machine may be shared: the 1-minute load average after each phase says how fair it was.
        out["load_avg_1m_after"] = os.getloadavg()[0]
        return out

    labels = {"structured_streaming": "Structured Streaming AvailableNow + foreachBatch MERGE",
              "drain": "deltadrain drain"}

    def fresh() -> None:  # the drain starts from its (empty) lake, the alternative from a new checkpoint
        for left in ("lake", "ss-target", "ss-checkpoint"):
            shutil.rmtree(workdir / left, ignore_errors=True)

    report["produce"] = _step("produce", produced)
    if connect:
        report["warm_up"] = {side: phase(side, f"warm-up: {labels[side]}") for side in labels}
        fresh()
    results = []
    for i in range(rounds):
        if i:
            fresh()
        # The alternative first in round 1: the topic was just written, so both read it from the page cache.
        order = ["structured_streaming", "drain"] if i % 2 == 0 else ["drain", "structured_streaming"]
        results.append({side: phase(side, f"round {i + 1}/{rounds}: {labels[side]}") for side in order})
    if rounds == 1:
        report.update(results[0])
        report["ratios"] = {"drain_to_structured_streaming": round(
            report["drain"]["rate"] / report["structured_streaming"]["rate"], 3)}
    else:
        report.update(combine_rounds(results))
        report["rounds"] = results
    return report


def run_lake_bench(source: str, count: int, partitions: int, batch: int, workdir: Path | None = None) -> dict:
    """One backlog drained twice, each in a fresh local driver (JVM start excluded) with a consumer group
    of its own: into a lake on the local disk, then into one on the embedded S3 server (docs/object-store.md).
    Each side's timings per step say where the time goes."""
    from deltadrain.config import load_config
    from deltadrain.dev import services
    from deltadrain.dev.produce import produce
    from deltadrain.embedded import S3_BUCKET

    workdir = workdir or Path(tempfile.mkdtemp(prefix="deltadrain-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    config, name = _bench_config(workdir, partitions, batch, kind=source)
    local = _config_copy(config, "disk")
    on_s3 = _config_copy(config, "s3")
    doc = yaml.safe_load(on_s3.read_text())
    doc["data_dir"] = f"s3a://{S3_BUCKET}/bench/{name}"
    on_s3.write_text(yaml.safe_dump(doc, sort_keys=False))
    cfg = load_config(config)
    pipeline = cfg.pipeline(name)
    report: dict = {"machine": _machine(), "source": source, "count": count, "partitions": partitions,
                    "batch_cap": batch}

    def phase(label: str, conf: Path) -> dict:
        out = _step(label, lambda: _subphase("drain", conf, name, workdir))
        out["load_avg_1m_after"] = os.getloadavg()[0]  # a shared machine: how fair the phase was
        return out

    with bench_source(cfg, pipeline), services.running(cfg, ["s3"]):
        if source == "kafka":
            from deltadrain.dev.produce import ensure_topic
            from deltadrain.sources.kafka.client import kafka_client_conf

            ensure_topic(kafka_client_conf(cfg, pipeline), pipeline.source.topic, partitions)
        report["produce"] = _step("produce", lambda: produce(cfg, pipeline, count, seed=7, progress=True).count)
        report["disk"] = phase("drain into a lake on the local disk", local)
        report["s3"] = phase("drain into a lake on the local S3 server", on_s3)
    report["ratios"] = {"s3_to_disk": round(report["s3"]["rate"] / report["disk"]["rate"], 3)
                        if report["disk"]["rate"] else None}
    report["load_avg"] = os.getloadavg()
    return report


def run_bench(count: int, partitions: int, batch: int, workdir: Path | None = None, executor: str = "local",
              rounds: int = 1, server_warm_up: int = 0) -> dict:
    """`executor="connect"`: the raw read, the drain in a local driver, the drain on the embedded Spark
    Connect server and a single-process delta-rs consumer, on the same entries (`_executor_phases`)."""
    from deltadrain.config import load_config
    from deltadrain.dev import services

    workdir = workdir or Path(tempfile.mkdtemp(prefix="deltadrain-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    config, name = _bench_config(workdir, partitions, batch)
    cfg = load_config(config)
    with bench_source(cfg, cfg.pipeline(name)):
        if executor == "local":
            return _valkey_phases(cfg, config, name, workdir, count, partitions, batch)
        with services.running(cfg, ["spark_connect"]):
            return _executor_phases(cfg, config, name, workdir, count, partitions, batch, rounds, server_warm_up)


def _executor_phases(cfg, config: Path, name: str, workdir: Path, count: int, partitions: int,
                     batch: int, rounds: int = 1, server_warm_up: int = 0) -> dict:
    """One backlog drained three ways, each with a consumer group and a lake of its own: the drain in a
    local driver (a process of its own, JVM start excluded), the drain as a client of the Spark Connect
    server, and the single-process delta-rs consumer; against the raw XREADGROUP rate. Each side first
    drains a small backlog (1/10) that creates its tables and, for the Connect server, warms it; a fresh
    driver and a fresh Python process start cold, as tasks do.

    With `rounds` > 1 the producer adds the backlog again before each round and every side drains it
    again: the server then runs batches of the full size it has run before, as a server that lives on
    does. The headline ratios (`warm`) leave the first round out; every round's are kept.

    `server_warm_up` full-size commits on the server before the rounds (`phase_server_warm_up`) stand
    for a server that has run for a while: the Connect drain's rounds then meet its steady state."""
    from deltadrain.dev.produce import produce

    pipeline = cfg.pipeline(name)
    report: dict = {"machine": _machine(), "executor": "connect", "count": count, "partitions": partitions,
                    "batch_cap": batch, "rounds": rounds, "server_warm_up_commits": server_warm_up}
    copies = {side: _config_copy(config, side) for side in ("connect", "single")}
    confs = {"drain": config, "drain_connect": copies["connect"], "single_process": copies["single"]}

    def produced(n: int, start: int) -> dict:
        started = time.monotonic()
        r = produce(cfg, pipeline, n, seed=7, start=start, progress=False)
        return {"messages": r.count, "rate": round(r.count / (time.monotonic() - started))}

    def phase(label: str, kind: str, conf: Path) -> dict:
        out = _step(label, lambda: _subphase(kind, conf, name, workdir))
        out["load_avg_1m_after"] = os.getloadavg()[0]  # a shared machine: how fair the phase was
        return out

    labels = {"drain": "drain, local driver", "drain_connect": "drain, Connect server",
              "single_process": "single-process consumer"}
    small = max(count // 10, 1)
    report["produce_small"] = _step("produce small backlog", lambda: produced(small, 0))
    report["warm_up"] = {kind: phase(f"warm-up: {label}", kind, confs[kind]) for kind, label in labels.items()}
    if server_warm_up:
        report["server_warm_up"] = _step(f"server warm-up: {server_warm_up} commits", lambda: _subphase(
            "server_warm_up", confs["drain_connect"], name, workdir, server_warm_up))
    results = []
    for i in range(rounds):
        tag = f"round {i + 1}/{rounds}: "
        one = {"produce": _step(tag + "produce", lambda i=i: produced(count, small + i * count)),
               "raw_read": phase(tag + "raw XREADGROUP", "raw_read", config)}
        one.update({kind: phase(tag + label, kind, confs[kind]) for kind, label in labels.items()})
        one["ratios"] = executor_ratios([one])
        results.append(one)
    if rounds == 1:
        report.update(results[0])
    else:
        report["rounds_detail"] = results
        report["ratios"] = {"all_rounds": executor_ratios(results), "warm": executor_ratios(results[1:])}
    report["load_avg"] = os.getloadavg()
    return report


def executor_ratios(rounds: list[dict]) -> dict:
    """The Valkey executor bench's ratios over `rounds` (pure): each side's rate over all their messages
    (every message weighs alike) against the raw read's, and the Connect drain against the others."""
    def rate(side: str) -> float:
        seconds = sum(r[side]["seconds"] for r in rounds)
        return sum(r[side]["messages"] for r in rounds) / seconds if seconds else 0.0

    raw, local, connect, single = (rate(s) for s in ("raw_read", "drain", "drain_connect", "single_process"))
    return {"drain_to_raw_read": round(local / raw, 3), "drain_connect_to_raw_read": round(connect / raw, 3),
            "single_process_to_raw_read": round(single / raw, 3),
            "drain_connect_to_single_process": round(connect / single, 3),
            "drain_connect_to_drain": round(connect / local, 3)}


def _valkey_phases(cfg, config: Path, name: str, workdir: Path, count: int, partitions: int,
                   batch: int) -> dict:
    from deltadrain.dev.produce import produce

    pipeline = cfg.pipeline(name)
    report: dict = {"machine": _machine(), "count": count, "partitions": partitions, "batch_cap": batch}
    step = _step

    def produced(n: int, start: int) -> dict:
        started = time.monotonic()
        r = produce(cfg, pipeline, n, seed=7, start=start, progress=True)
        return {"messages": r.count, "rate": round(r.count / (time.monotonic() - started))}

    # Small backlog first (memory at 1/10 of the backlog), then the full one; same batch cap for both,
    # so that the driver's peaks compare backlogs, not batch sizes.
    small = max(count // 10, 1)
    report["produce_small"] = step("produce small backlog", lambda: produced(small, 0))
    report["drain_small"] = step("drain small backlog", lambda: _subphase("drain", config, name, workdir))
    report["produce"] = step("produce full backlog", lambda: produced(count, small))
    report["raw_read"] = step("raw XREADGROUP", lambda: _subphase("raw_read", config, name, workdir))
    report["drain"] = step("drain full backlog", lambda: _subphase("drain", config, name, workdir))
    report["delta_append"] = step("plain Delta append", lambda: _subphase("append", config, name, workdir))

    def one_message() -> dict:
        produce(cfg, pipeline, 1, seed=8, start=0)
        return _subphase("drain", config, name, workdir)

    report["one_message"] = step("one-message batch", one_message)
    report["window"] = step("1x vs 100x target", lambda: _subphase("window", config, name, workdir, 10_000))
    slower_raw = min(report["raw_read"]["rate"], report["delta_append"]["rate"])
    report["ratios"] = {
        "drain_to_slower_raw_limit": round(report["drain"]["rate"] / slower_raw, 3),
        "driver_python_memory_10x_backlog": round(
            report["drain"]["driver_python_peak_mib"] / report["drain_small"]["driver_python_peak_mib"], 3),
        "driver_jvm_memory_10x_backlog": round(
            report["drain"]["driver_jvm_peak_mib"] / report["drain_small"]["driver_jvm_peak_mib"], 3),
        "driver_jvm_live_heap_10x_backlog": round(
            report["drain"]["driver_jvm_live_heap_mib"] / report["drain_small"]["driver_jvm_live_heap_mib"], 3),
        "batch_time_100x_to_1x": report["window"]["ratio_100x_to_1x"],
    }
    return report


if __name__ == "__main__":
    print(json.dumps(run_phase(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))))
