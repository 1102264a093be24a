"""Upsert drains of one Kafka topic of entity states, side by side in one Spark driver, in rounds that
rotate which side goes first: deltadrain's `target.mode: upsert`, the hand-written Structured Streaming
alternative (foreachBatch: the newest change per key by offset, then one MERGE that deletes, updates and
inserts), and deltadrain's `insert` mode on the same events. Each side of each round drains the whole
topic from its start into a fresh table; round 0 warms the driver and is not counted. Prints JSON.

    python bench/upsert_drain/upsert_drain.py WORKDIR COUNT KEYS BATCH ROUNDS
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.keyed_topic import FIELDS, changes, produce_changes, write_config

PARTITIONS = 3
SIDES = ("deltadrain_upsert", "foreach_batch", "deltadrain_insert")


def drain_side(cfg, pipeline, spark) -> dict:
    from deltadrain.catchup import drain

    batches, steps = [], {}
    started = time.monotonic()
    while True:
        s = drain(cfg, pipeline, spark=spark)
        if s.outcome == "empty":
            break
        assert s.outcome == "committed", s
        batches.append(round(s.seconds, 2))
        for step, seconds in s.timings.items():  # each drain step's time, summed over the batches
            steps[step] = round(steps.get(step, 0) + seconds, 3)
    return {"seconds": time.monotonic() - started, "batches": batches, "steps": steps}


def foreach_batch_side(cfg, pipeline, spark, workdir: Path, batch: int) -> dict:
    """What a Spark user writes for a topic of entity states: AvailableNow in batches of `batch` offsets,
    the newest change per key (row_number over the key by offset), one MERGE made idempotent by
    txnAppId/txnVersion."""
    from delta.tables import DeltaTable
    from pyspark.sql import Window
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType, _parse_datatype_string

    from deltadrain.run.commit import TXN_APP, TXN_VERSION
    from deltadrain.sources.kafka.client import kafka_spark_options

    payload = _parse_datatype_string(", ".join(f"`{n}` {t}" for n, t in FIELDS.items()))
    assert isinstance(payload, StructType)
    target = str(workdir / "target")
    app_id = f"fb-{uuid.uuid4().hex[:6]}"
    stream = (spark.readStream.format("kafka").options(**kafka_spark_options(cfg, pipeline))
              .option("subscribe", pipeline.source.topic).option("startingOffsets", "earliest")
              .option("maxOffsetsPerTrigger", str(batch)).load())
    rows = stream.select(F.from_json(F.col("value").cast("string"), payload).alias("j"), "partition", "offset") \
        .select("j.*", F.col("partition").alias("_partition"), F.col("offset").alias("_offset"))
    batches: list[float] = []

    def upsert(df, batch_id: int) -> None:
        began = time.monotonic()
        session = df.sparkSession
        newest = (df.withColumn("_n", F.row_number().over(Window.partitionBy("id").orderBy(F.col("_offset").desc())))
                  .where("_n = 1").drop("_n"))
        DeltaTable.createIfNotExists(session).location(target).addColumns(newest.schema).execute()
        session.conf.set(TXN_APP, app_id)
        session.conf.set(TXN_VERSION, str(batch_id))
        try:
            (DeltaTable.forPath(session, target).alias("t").merge(newest.alias("s"), "t.id = s.id")
             .whenMatchedDelete("s.gone").whenMatchedUpdateAll().whenNotMatchedInsertAll("NOT s.gone").execute())
        finally:
            session.conf.unset(TXN_APP)
            session.conf.unset(TXN_VERSION)
        batches.append(round(time.monotonic() - began, 2))

    started = time.monotonic()
    query = (rows.writeStream.foreachBatch(upsert).trigger(availableNow=True)
             .option("checkpointLocation", str(workdir / "checkpoint")).start())
    query.awaitTermination()
    return {"seconds": time.monotonic() - started, "batches": batches, "target": target}


def states(spark, path: str) -> set[tuple]:
    return {(r.id, r.version) for r in spark.read.format("delta").load(path).select("id", "version").collect()}


def main(workdir: Path, count: int, keys: int, batch: int, rounds: int) -> dict:
    from deltadrain.config import load_config
    from deltadrain.dev import services
    from deltadrain.runtime.session import get_spark

    topic = f"states_{uuid.uuid4().hex[:6]}"
    names = {f"{side}_r{r}": ("insert" if side == "deltadrain_insert" else "upsert")
             for r in range(rounds) for side in SIDES if side != "foreach_batch"}
    cfg = load_config(write_config(workdir, topic, PARTITIONS, batch, names))
    services.up(cfg, ["kafka"])
    first = cfg.pipelines[0]
    produce_changes(cfg, first, changes(count, keys), PARTITIONS)
    spark = get_spark("upsert-drain-bench", cfg=cfg)
    spark.sparkContext.setLogLevel("ERROR")
    out: dict = {"count": count, "keys": keys, "batch": batch, "partitions": PARTITIONS, "rounds": []}
    for r in range(rounds):
        order = SIDES[r % len(SIDES):] + SIDES[:r % len(SIDES)]
        got: dict = {"order": list(order)}
        for side in order:
            if side == "foreach_batch":
                got[side] = foreach_batch_side(cfg, first, spark, workdir / f"fb_r{r}", batch)
            else:
                p = next(p for p in cfg.pipelines if p.name == f"{side}_r{r}")
                got[side] = {**drain_side(cfg, p, spark), "target": str(cfg.target_path(p))}
            got[side]["rate"] = round(count / got[side]["seconds"])
            got[side]["seconds"] = round(got[side]["seconds"], 2)
        # Fair only if both upsert sides end in the same table: the newest state of each live key.
        assert states(spark, got["deltadrain_upsert"]["target"]) == states(spark, got["foreach_batch"]["target"])
        got["upsert_over_foreach_batch"] = round(got["foreach_batch"]["seconds"] / got["deltadrain_upsert"]["seconds"], 3)
        got["upsert_over_insert_time"] = round(got["deltadrain_upsert"]["seconds"] / got["deltadrain_insert"]["seconds"], 3)
        out["rounds"].append(got)
        print(json.dumps(got), file=sys.stderr, flush=True)
    # Round 0 warms the driver (its first side pays the JVM's cold start): it is reported, not counted.
    counted = out["rounds"][1:] or out["rounds"]
    total = {s: sum(r[s]["seconds"] for r in counted) for s in SIDES}
    out["counted_rounds"] = {
        **{f"{s}_rate": round(count * len(counted) / total[s]) for s in SIDES},
        "throughput_ratio_upsert_over_foreach_batch": round(total["foreach_batch"] / total["deltadrain_upsert"], 3),
        "time_ratio_upsert_over_insert": round(total["deltadrain_upsert"] / total["deltadrain_insert"], 3),
    }
    return out


if __name__ == "__main__":
    w, n, k, b, rounds = sys.argv[1:6]
    print(json.dumps(main(Path(w), int(n), int(k), int(b), int(rounds)), indent=1))
