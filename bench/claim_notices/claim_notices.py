"""What the Kafka claim notices cost (bench/claim_notices/README.md), on the same broker and data.

1. Status: the source counts with and without reading the group offsets' notices, alternating.
2. A drain: two pipelines on two topics of the same size, drained batch by batch in one Spark
   session, alternating which goes first, one with the notices and one with `KafkaDrain.announce`
   turned off. Reports each side's claim step and batch time (medians of the warm batches).

    DELTADRAIN_HOME=/tmp/ddkafka DELTADRAIN_KAFKA_PORT=27392 DELTADRAIN_KAFKA_CONTROLLER_PORT=27393 \\
        .venv/bin/python bench/claim_notices/claim_notices.py WORKDIR [MESSAGES_PER_SIDE] [BATCH]

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
from deltadrain.sources.kafka.client import kafka_client_conf
from deltadrain.sources.kafka.drain import KafkaDrain
from deltadrain.sources.kafka.status import kafka_counts


def main(workdir: Path, count: int, batch: int) -> dict:
    cfg, (with_notices, without) = pipelines(workdir, batch, ("notices", "none"), "cn", count)

    conf = kafka_client_conf(cfg, with_notices)
    times: dict[bool, list] = {True: [], False: []}
    for i in range(20):
        for with_group in (True, False) if i % 2 else (False, True):
            started = time.perf_counter()
            kafka_counts(conf, with_notices.source, {}, {}, {}, with_group=with_group)
            times[with_group].append(time.perf_counter() - started)

    spark = get_spark("claim-notices")
    announce = KafkaDrain.announce
    runs: dict[str, list] = {"notices": [], "none": []}
    try:
        for i in range(-(-count // batch)):
            for side in ("notices", "none") if i % 2 else ("none", "notices"):
                KafkaDrain.announce = announce if side == "notices" else (lambda self, ranges, lake: None)
                s = drain(cfg, with_notices if side == "notices" else without, spark=spark)
                runs[side].append({"claim": s.timings.get("claim"), "seconds": s.seconds, "claimed": s.claimed,
                                   "timings": s.timings})
    finally:
        KafkaDrain.announce = announce
    # A table's first batch creates it and its second is its first MERGE; the JVM's first MERGE is
    # cold (bench/claim_notices/README.md), so the first two batches of each side are left out of the medians.
    warm = {side: r[2:] for side, r in runs.items()}
    return {
        "status_source_counts_ms": {"with_notices": median_ms(times[True]), "without": median_ms(times[False]),
                                    "calls": 20},
        "drain": {side: {"claim_median_s": round(statistics.median(x["claim"] for x in w), 3),
                         "batch_median_s": round(statistics.median(x["seconds"] for x in w), 3),
                         "warm_batches": len(w), "runs": runs[side]} for side, w in warm.items()},
        "messages_per_side": count, "batch_cap": batch,
    }


if __name__ == "__main__":
    args = sys.argv[1:]
    print(json.dumps(main(Path(args[0]), int(args[1]) if len(args) > 1 else 2_000_000,
                          int(args[2]) if len(args) > 2 else 200_000), indent=1))
