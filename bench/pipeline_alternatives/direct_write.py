"""Would writing the target's files in the claim job, instead of MERGEing staged rows, pay?
(bench/pipeline_alternatives/README.md)

An experiment, not the drain's code path. Today a batch is written twice: the claim tasks stage it
to Parquet with pyarrow, then the MERGE reads that, anti-joins it with the target's window and
writes the target's files (Parquet encoding and Delta's statistics: most of a warm commit). Here
the "direct" runs open a Delta transaction first (it reads the whole table, so it conflicts like
the MERGE would), and the claim job itself is the transaction's write: the claim tasks hand their
good rows to Delta's writer, which writes the target's files with their statistics. The driver then
checks that no staged id is in the target already (the MERGE's job, here a semi-join of the new
files' ids with the window), and commits the files with the SetTransaction and the metadata. The
staging file is still written as today (the acknowledgement and the dead letters read it), so the
direct runs pay for it too.

In one Spark session it drains the same entries (`bench/ab_compare/ab_setup_valkey.py` makes the configs, each
with a consumer group and a lake of its own) with the drain as it is ("before" configs) and with
the direct write ("after" configs), batch after batch. The first batch of every run creates the
table the drain's way. Every run's table is read back: rows, distinct ids, nothing left pending.

    DELTADRAIN_HOME=/tmp/dddw DELTADRAIN_VALKEY_PORT=26983 .venv/bin/python bench/ab_compare/ab_setup_valkey.py WORKDIR 1600000
    DELTADRAIN_HOME=/tmp/dddw DELTADRAIN_VALKEY_PORT=26983 \\
        .venv/bin/python bench/pipeline_alternatives/direct_write.py WORKDIR 8 before1,after1,after2,before2 > out.json
"""

import json
import os
import sys
import time
import uuid
from datetime import UTC, datetime

from overlap_claim import run_order

from deltadrain.lake.checkpoint import commit_metadata
from deltadrain.run.commit import USER_METADATA, CommitResult, merge_condition
from deltadrain.run.outcome import Outcome
from deltadrain.run.rows import claim_schema
from deltadrain.run.stage import Staged, StagingFile, report_arrow_schema
from deltadrain.run.summary import new_run_id
from deltadrain.sources.valkey.claim import claim_arrow
from deltadrain.sources.valkey.claim import plan as task_plan
from deltadrain.sources.valkey.drain import ValkeyDrain


def scala_list(jvm, items):
    java = jvm.java.util.ArrayList()
    for item in items:
        java.add(item)
    return jvm.scala.jdk.javaapi.CollectionConverters.asScala(java).toList()


def claim_into_writer(ctx, claim_arrow_schema, target_arrow_schema, columns, id_field, stage_dir, report_dir,
                      batch_no, run_id):
    """mapInArrow body: claim and stage as the drain does, and also yield the good rows in the
    target's schema for Delta's writer; the staging report goes to a file of its own."""

    def body(batches):
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        now = datetime.now(UTC)
        with StagingFile(stage_dir, claim_arrow_schema, id_field) as staging:
            for batch in claim_arrow(batches, ctx, claim_arrow_schema):
                staging.write(batch)
                good = batch.filter(pc.is_null(batch.column("_dd_error_type")))
                n = good.num_rows
                if n:
                    extra = {"_dd_batch": pa.array([batch_no] * n, pa.int64()),
                             "_dd_run_id": pa.array([run_id] * n, pa.string()),
                             "_dd_ingested_at": pa.array([now] * n, pa.timestamp("us", tz="UTC"))}
                    arrays = [extra[c] if c in extra else good.column(c) for c in columns]
                    yield pa.RecordBatch.from_arrays(arrays, schema=target_arrow_schema)
        report = staging.report
        if report:
            os.makedirs(report_dir, exist_ok=True)
            pq.write_table(pa.Table.from_pylist(report, schema=report_arrow_schema()),
                           os.path.join(report_dir, f"{uuid.uuid4().hex}.parquet"))

    return body


class DirectDrain(ValkeyDrain):
    """The drain with its commit replaced by a transaction whose write is the claim job: `claim` opens
    the transaction and writes the target's files in the claim tasks, `publish` checks the new ids and
    commits them. The first batch creates the table the drain's way. Drain.run keeps the order (plan,
    claim, publish, acknowledge with XACK)."""

    txn = None

    def plan(self, checkpoint):
        self.expected = checkpoint.batch
        return super().plan(checkpoint)

    def claim(self, plan):
        from pyspark.sql.pandas.types import to_arrow_schema

        if self.expected == 0:
            return super().claim(plan)  # the first batch creates the table the drain's way
        p, spark = self.pipeline, self.spark
        jvm = spark._jvm
        log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, self.target)
        txn = log.startTransaction()
        txn.readWholeTable()  # any concurrent data change conflicts, as with the MERGE
        if txn.txnVersion(p.name) != self.expected:
            raise RuntimeError("another writer is ahead")

        target_schema = spark.read.format("delta").load(self.target).schema
        columns = target_schema.fieldNames()
        claim_spark_schema = claim_schema(p)
        body = claim_into_writer(self.ctx, to_arrow_schema(claim_spark_schema), to_arrow_schema(target_schema),
                                 columns, p.payload_schema.id_field, str(self.scratch / "claimed"),
                                 str(self.scratch / "reports"), self.expected + 1, self.run_id)
        tasks = [(t.stream, t.quota, t.reclaim) for t in task_plan(plan.detail)]
        task_df = spark.createDataFrame(spark.sparkContext.parallelize(tasks, len(tasks)),
                                        "stream string, quota long, reclaim boolean")
        adds = jvm.scala.jdk.javaapi.CollectionConverters.asJava(
            txn.writeFiles(task_df.mapInArrow(body, target_schema)._jdf))
        self.txn, self.adds = txn, [adds.get(i) for i in range(adds.size())]
        staged = Staged.of(spark.read.parquet(str(self.scratch / "reports")).collect())
        staged.schema = claim_spark_schema
        self.summary.reclaimed = staged.total.reclaimed
        return staged

    def publish(self, staged, expected):
        if self.txn is None:
            return super().publish(staged, expected)
        s, p, spark, jvm = self.summary, self.pipeline, self.spark, self.spark._jvm
        batch, stats = expected + 1, staged.stats()

        # The MERGE's question, asked of the new files only: is any of their ids in the window already?
        id_field = p.payload_schema.id_field
        window_start = staged.total.oldest - p.dedup_window
        new_ids = spark.read.parquet(*[f"{self.target}/{a.path()}" for a in self.adds]).select(id_field)
        cond = merge_condition(id_field, window_start, stats.id_range)
        # The table as it is now (the transaction's snapshot, cached): anything committed after the
        # transaction's read makes its commit conflict anyway.
        seen = (spark.read.format("delta").load(self.target).alias("t")
                .join(new_ids.alias("s"), cond, "leftsemi").limit(1).count())
        if seen or not stats.unique or staged.total.bad:
            raise RuntimeError("this experiment has no fallback: duplicates or dead letters in the batch")
        self._lap("check")

        meta = commit_metadata(p.name, batch, self.run_id, s.positions, claimed=s.claimed, dead_lettered=0)
        none = jvm.scala.Option.empty()
        txn_action = jvm.org.apache.spark.sql.delta.actions.SetTransaction(p.name, batch,
                                                                            jvm.scala.Some(int(time.time() * 1000)))
        op = jvm.org.apache.spark.sql.delta.DeltaOperations.Write(jvm.org.apache.spark.sql.SaveMode.Append,
                                                                   none, none, none, none, none, none, none, none)
        spark.conf.set(USER_METADATA, meta)
        try:
            self.txn.commit(scala_list(jvm, [*self.adds, txn_action]), op)
        finally:
            spark.conf.unset(USER_METADATA)
        s.outcome, s.written = Outcome.COMMITTED.value, stats.good
        self._lap("commit")
        return CommitResult(Outcome.COMMITTED, batch, None, stats.good), []


def drain_batches(cfg, pipeline, spark, batches: int, direct: bool) -> list[dict]:
    """The `direct` ("after") configs drain with DirectDrain, the others with the drain as it is."""
    base = new_run_id()
    kind = DirectDrain if direct else ValkeyDrain
    out = []
    for i in range(batches):
        s = kind(cfg, pipeline, spark, run_id=f"{base}-{i}").run()
        if s.outcome != "committed":
            raise RuntimeError(f"batch {s.batch} ended {s.outcome}: {s.error}")
        out.append({"seconds": s.seconds, "timings": s.timings, "written": s.written})
    return out


if __name__ == "__main__":
    report = run_order("direct-write", "bench/pipeline_alternatives/direct_write.py", sys.argv[1], int(sys.argv[2]), sys.argv[3].split(","),
                       drain_batches)
    print(json.dumps(report, indent=1))
