"""What a Kafka reprocess of a few records far apart costs: read as separate ranges around them
(`kafka.history.pick_rounds`) against one range from the first to the last (what it did before)
(bench/reprocess_picks/README.md).

Produces COUNT messages to the sample `clicks` topic (4 partitions) on its own broker, picks the
first and the last record of partition 0 and of partition 1, and reads them with
`kafka_offset_rows` both ways, alternating which goes first, ROUNDS times (one Spark session;
DELTADRAIN_HOME and the Kafka ports private to it).

Usage: DELTADRAIN_HOME=/tmp/ddpicks DELTADRAIN_KAFKA_PORT=29194 DELTADRAIN_KAFKA_CONTROLLER_PORT=29195 \
    .venv/bin/python bench/reprocess_picks/reprocess_picks.py [COUNT] [ROUNDS]
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))  # bench/common: shared helpers

from kafka_sample import clicks_topic

from deltadrain.runtime.session import get_spark
from deltadrain.sources.kafka import history as kafka_history
from deltadrain.sources.kafka.client import kafka_consumer_conf
from deltadrain.sources.kafka.offsets import watermarks

ONE_RANGE = 10**15  # a span no two picks reach: one range per partition, as before


def main(count: int = 400_000, rounds: int = 3) -> dict:
    spark = get_spark("bench-reprocess-picks")
    spark.sparkContext.setLogLevel("ERROR")
    times: dict[str, list[float]] = {"around_picks": [], "one_range": []}
    found: dict[str, set[int]] = {k: set() for k in times}
    with clicks_topic(count, seed=3) as (cfg, p), tempfile.TemporaryDirectory() as scratch:
        marks = watermarks(kafka_consumer_conf(cfg, p), p.source.topic)
        picks = [(str(part), off) for part in (0, 1) for off in (marks[part][0], marks[part][1] - 1)]
        order = [("around_picks", kafka_history.PICK_SPAN), ("one_range", ONE_RANGE)]
        for r in range(rounds):
            for name, span in order if r % 2 == 0 else order[::-1]:
                kafka_history.PICK_SPAN = span
                began = time.perf_counter()
                rows = kafka_history.kafka_offset_rows(spark, cfg, p, picks, f"{scratch}/{name}-{r}")
                found[name].add(rows.count())
                times[name].append(time.perf_counter() - began)
    spark.stop()
    med = {k: round(statistics.median(v), 2) for k, v in times.items()}
    return {"count": count, "partition_ends": {str(k): list(v) for k, v in marks.items()}, "picks": picks,
            "seconds": {k: [round(t, 2) for t in v] for k, v in times.items()}, "median_s": med,
            "rows_found": {k: sorted(v) for k, v in found.items()},
            "median_ratio_around_to_one_range": round(med["around_picks"] / med["one_range"], 3)}


if __name__ == "__main__":
    print(json.dumps(main(*map(int, sys.argv[1:3]))))
