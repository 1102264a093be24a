"""What the Kafka drain's topic-id check costs a run (bench/kafka_offsets/README.md).

Before it plans its ranges, every Kafka drain asks the broker for the topic's id (`kafka.offsets.topic_id`,
an AdminClient describe) to tell a recreated topic from the one its checkpoint was taken on. Every run
already reads the topic's watermarks (`kafka.offsets.watermarks`); this times both, alternating, on
the sample `clicks` pipeline's topic, with its own broker (started and stopped here; DELTADRAIN_HOME
and the Kafka ports private to it).

Usage: DELTADRAIN_HOME=/tmp/ddtopicid DELTADRAIN_KAFKA_PORT=29192 DELTADRAIN_KAFKA_CONTROLLER_PORT=29193 \
    .venv/bin/python bench/kafka_offsets/topic_id_check.py [ROUNDS]
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))  # bench/common: shared helpers

from kafka_sample import clicks_topic, ms_stats

from deltadrain.sources.kafka.client import kafka_client_conf, kafka_consumer_conf
from deltadrain.sources.kafka.offsets import topic_id, watermarks


def main(rounds: int = 100) -> dict:
    with clicks_topic(1000) as (cfg, p):
        conf, consumer_conf = kafka_client_conf(cfg, p), kafka_consumer_conf(cfg, p)
        ids, marks = [], []
        for _ in range(rounds):
            began = time.perf_counter()
            got = topic_id(conf, p.source.topic)
            ids.append(time.perf_counter() - began)
            began = time.perf_counter()
            watermarks(consumer_conf, p.source.topic)
            marks.append(time.perf_counter() - began)
    tid, wm = ms_stats(ids), ms_stats(marks)
    return {"rounds": rounds, "topic_id": tid, "watermarks": wm, "id_known": got is not None,
            "median_ratio_topic_id_to_watermarks": round(tid["median_ms"] / wm["median_ms"], 2)}


if __name__ == "__main__":
    print(json.dumps(main(*map(int, sys.argv[1:2]))))
