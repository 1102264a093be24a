"""What counting dead Kafka runs costs a run (bench/dead_runs/README.md), on one broker.

A Kafka run now reads the group offsets (its claim notices) before it fixes its ranges, to count the
runs that died (`kafka.crashes`); before, only the notice thread read them, during the read.

1. The read itself: `KafkaDrain.count_dead_runs` (group offsets + the decisions) against the broker
   request every run already made there (`watermarks`), alternating, on a 6-partition topic.
2. A drain: two pipelines on two topics of the same size, drained batch by batch in one Spark
   session, alternating which goes first, one as it is and one with `count_dead_runs` turned off
   (then the notice thread reads the group offsets, as before). Reports each side's checkpoint step
   (where the count runs) and batch time, medians of the warm batches.

    DELTADRAIN_HOME=/tmp/ddkafka DELTADRAIN_KAFKA_PORT=27392 DELTADRAIN_KAFKA_CONTROLLER_PORT=27393 \\
        .venv/bin/python bench/dead_runs/dead_runs.py WORKDIR [MESSAGES_PER_SIDE] [BATCH]

The Kafka service of that DELTADRAIN_HOME is started if it is not running.
"""

import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))  # bench/common: shared helpers

from kafka_sides import pipelines
from timing import median_ms

from deltadrain.catchup import drain
from deltadrain.runtime.session import get_spark
from deltadrain.sources.kafka.drain import KafkaDrain
from deltadrain.sources.kafka.offsets import plan_ranges, watermarks


def main(workdir: Path, count: int, batch: int) -> dict:
    cfg, (counted, off) = pipelines(workdir, batch, ("counted", "off"), "dr", count)

    spark = get_spark("dead-runs")
    probe = KafkaDrain(cfg, counted, spark)
    marks = watermarks(probe.conf, counted.source.topic)
    plan = plan_ranges({}, marks, batch)
    times: dict[str, list] = {"count_dead_runs": [], "watermarks": []}
    for i in range(30):
        for what in ("count_dead_runs", "watermarks") if i % 2 else ("watermarks", "count_dead_runs"):
            started = time.perf_counter()
            if what == "watermarks":
                watermarks(probe.conf, counted.source.topic)
            else:
                probe.count_dead_runs(plan, {})
            times[what].append(time.perf_counter() - started)

    count_dead_runs = KafkaDrain.count_dead_runs
    runs: dict[str, list] = {"counted": [], "off": []}
    try:
        for i in range(-(-count // batch)):
            for side in ("counted", "off") if i % 2 else ("off", "counted"):
                KafkaDrain.count_dead_runs = count_dead_runs if side == "counted" else (lambda self, plan, lake: plan)
                s = drain(cfg, counted if side == "counted" else off, spark=spark)
                runs[side].append({"checkpoint": s.timings.get("checkpoint"), "claim": s.timings.get("claim"),
                                   "seconds": s.seconds, "claimed": s.claimed})
    finally:
        KafkaDrain.count_dead_runs = count_dead_runs
    # A table's first batch creates it and its second is its first MERGE: left out of the medians.
    warm = {side: r[2:] for side, r in runs.items()}
    return {
        "read_ms": {what: median_ms(xs) for what, xs in times.items()} | {"calls": 30},
        "drain": {side: {"checkpoint_median_s": round(statistics.median(x["checkpoint"] for x in w), 3),
                         "claim_median_s": round(statistics.median(x["claim"] for x in w), 3),
                         "batch_median_s": round(statistics.median(x["seconds"] for x in w), 3),
                         "warm_batches": len(w), "runs": runs[side]} for side, w in warm.items()},
        "messages_per_side": count, "batch_cap": batch,
    }


if __name__ == "__main__":
    args = sys.argv[1:]
    print(json.dumps(main(Path(args[0]), int(args[1]) if len(args) > 1 else 1_000_000,
                          int(args[2]) if len(args) > 2 else 100_000), indent=1))
