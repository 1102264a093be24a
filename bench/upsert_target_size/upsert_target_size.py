"""One upsert batch into a large target against the same batch into a small one: two upsert pipelines
(`order_by: version`), each on a topic of its own. Each target is made by one drained change (so that the
drain made its table, tombstone table and checkpoint), then SMALL or LARGE rows of the same columns appended
by Spark (spark.range, version 1, not through Kafka) in the layout named (`load_rows`). Each round produces a fresh batch of BATCH changes to each topic (45 % updates of
existing keys drawn over the whole key range, 45 % new keys, 10 % deletes of existing keys) and drains it,
the two sides alternating which goes first. Prints JSON.

    python bench/upsert_target_size/upsert_target_size.py WORKDIR SMALL LARGE BATCH ROUNDS [cluster|sorted-dv [spread|recent]]
"""

from __future__ import annotations

import json
import random
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.keyed_topic import produce_changes, write_config

PARTITIONS = 3
ROWS_PER_FILE = 250_000


def load_rows(spark, target: str, rows: int, layout: str) -> None:
    """`rows` live rows of ids 0..rows-1 at version 1, in the drain's columns, appended and then laid out:
    `cluster`: OPTIMIZE (liquid clustering on the key, Delta's default file size); `sorted-dv`: files of
    ROWS_PER_FILE rows in disjoint key ranges (what Z-order on one column gives) and deletion vectors on."""
    from pyspark.sql import functions as F

    schema = spark.read.format("delta").load(target).schema
    computed = {
        "change_id": F.concat(F.lit("load-"), F.col("id").cast("string")), "id": F.col("id"),
        "name": F.concat(F.lit("n"), F.col("id").cast("string")), "amount": (F.col("id") % 1000).cast("double"),
        "version": F.lit(1).cast("long"), "gone": F.lit(False),
        "_dd_key": F.concat(F.lit('{"id":'), F.col("id").cast("string"), F.lit("}")),
        "_dd_partition": (F.col("id") % PARTITIONS).cast("string"), "_dd_pos_hi": F.lit(0).cast("long"),
        "_dd_pos_lo": F.lit(0).cast("long"), "_dd_order": F.lit(1).cast("long"), "_dd_batch": F.lit(0).cast("long"),
        "_dd_run_id": F.lit("load"), "_dd_ingested_at": F.current_timestamp(), "_dd_attempts": F.lit(1),
    }
    cols = [(computed[f.name] if f.name in computed else F.lit(None)).cast(f.dataType).alias(f.name)
            for f in schema.fields]
    files = max(1, rows // ROWS_PER_FILE)
    df = spark.range(rows).select(*cols)
    if layout == "cluster":
        df.repartition(files).write.format("delta").mode("append").save(target)
        spark.sql(f"OPTIMIZE delta.`{target}`")
        return
    spark.sql(f"ALTER TABLE delta.`{target}` SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')")
    (df.repartitionByRange(files, "_dd_key").sortWithinPartitions("_dd_key")
     .write.format("delta").mode("append").save(target))


def batch_changes(rows: int, batch: int, round_no: int, rounds: int, seed: int, recent: bool = False) -> list[dict]:
    """Round `round_no`'s changes; no existing key is picked by two rounds, so the row count is known. `recent`:
    the updates and deletes of all rounds are drawn from the newest (highest) keys only, as many as they need."""
    rng = random.Random(seed)
    version = 2 + round_no
    updates = int(batch * 0.45)
    deletes = batch // 10
    each = updates + deletes
    pool = range(rows - rounds * each, rows) if recent else range(rows)
    picked = rng.sample(pool, rounds * each)[round_no * each:(round_no + 1) * each]
    rng = random.Random(seed * 1000 + round_no)
    fresh = range(rows + round_no * batch, rows + round_no * batch + batch - updates - deletes)
    out = [{"change_id": f"u{round_no}-{k}", "id": k, "name": f"n{k}-{version}", "amount": 1.0, "version": version,
            "gone": i >= updates} for i, k in enumerate(picked)]
    out += [{"change_id": f"i{round_no}-{k}", "id": k, "name": f"n{k}", "amount": 2.0, "version": version,
             "gone": False} for k in fresh]
    rng.shuffle(out)
    return out


def main(workdir: Path, small: int, large: int, batch: int, rounds: int, layout: str = "cluster",
         keys: str = "spread") -> dict:
    import yaml

    from deltadrain.catchup import drain
    from deltadrain.config import load_config
    from deltadrain.dev import services
    from deltadrain.runtime.session import get_spark

    sizes = {"small": small, "large": large}
    tag = uuid.uuid4().hex[:6]
    path = write_config(workdir, "unused", PARTITIONS, batch, {f"{s}_{tag}": "upsert" for s in sizes})
    data = yaml.safe_load(path.read_text())
    for p in data["pipelines"]:
        p["source"]["topic"] = p["name"]
        p["target"].update(order_by="version", **({"cluster_by": ["_dd_key"]} if layout == "cluster" else {}))
    path.write_text(yaml.safe_dump(data))
    cfg = load_config(path)
    pipes = {s: next(p for p in cfg.pipelines if p.name == f"{s}_{tag}") for s in sizes}
    services.up(cfg, ["kafka"])
    spark = get_spark("upsert-size-bench", cfg=cfg)
    spark.sparkContext.setLogLevel("ERROR")
    out: dict = {"small": small, "large": large, "batch": batch, "layout": layout, "keys": keys,
                 "rows_per_file": ROWS_PER_FILE, "rounds": []}
    for side, p in pipes.items():
        produce_changes(cfg, p, [{"change_id": "seed", "id": -1, "name": "seed", "amount": 0.0, "version": 1,
                                  "gone": False}], PARTITIONS)
        assert drain(cfg, p, spark=spark).outcome == "committed"
        began = time.monotonic()
        load_rows(spark, str(cfg.target_path(p)), sizes[side], layout)
        out[f"{side}_load_seconds"] = round(time.monotonic() - began, 1)
        print(f"{side}: loaded in {out[f'{side}_load_seconds']} s", file=sys.stderr, flush=True)
    for r in range(rounds):
        order = ("small", "large") if r % 2 == 0 else ("large", "small")
        got: dict = {"order": list(order)}
        for side in order:
            p = pipes[side]
            produce_changes(cfg, p, batch_changes(sizes[side], batch, r, rounds, seed=3, recent=keys == "recent"),
                            PARTITIONS)
            began = time.monotonic()
            s = drain(cfg, p, spark=spark)
            assert s.outcome == "committed" and s.claimed == batch, s
            got[side] = {"seconds": round(time.monotonic() - began, 2), "timings": s.timings}
        got["ratio"] = round(got["large"]["seconds"] / got["small"]["seconds"], 3)
        out["rounds"].append(got)
        print(json.dumps(got), file=sys.stderr, flush=True)
    for side, p in pipes.items():  # every round added its inserts and took its deletes
        n = spark.read.format("delta").load(str(cfg.target_path(p))).count()
        expect = 1 + sizes[side] + rounds * (batch - int(batch * 0.45) - batch // 10) - rounds * (batch // 10)
        out[f"{side}_rows_after"] = n
        assert n == expect, (side, n, expect)
    # Round 0 warms the driver's MERGE path: reported, not counted.
    counted = out["rounds"][1:] or out["rounds"]
    out["counted"] = {s: round(sum(r[s]["seconds"] for r in counted) / len(counted), 2) for s in sizes}
    out["counted"]["ratio_large_over_small"] = round(out["counted"]["large"] / out["counted"]["small"], 3)
    return out


if __name__ == "__main__":
    w, s, lg, b, rounds = sys.argv[1:6]
    print(json.dumps(main(Path(w), int(s), int(lg), int(b), int(rounds), *sys.argv[6:8]), indent=1))
