"""What reading a topic's watermarks costs with the admin ListOffsets against the consumer's
get_watermark_offsets it replaced (bench/kafka_offsets/README.md).

Every Kafka drain, probe and status reads the watermarks (`kafka.offsets.watermarks`). The old way
(kept here only as the baseline) sent two requests per partition, one after the other; the admin way
sends one request per kind and partition leader. This times both, alternating, on the sample `clicks`
topic (4 partitions) with its own broker, and checks that both give the same answer.

Usage: DELTADRAIN_HOME=/tmp/ddmarks DELTADRAIN_KAFKA_PORT=29192 DELTADRAIN_KAFKA_CONTROLLER_PORT=29193 \
    .venv/bin/python bench/kafka_offsets/watermarks_read.py [ROUNDS]
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))  # bench/common: shared helpers

from kafka_sample import clicks_topic, ms_stats

from deltadrain.sources.kafka.client import kafka_consumer_conf
from deltadrain.sources.kafka.offsets import TIMEOUT, watermarks


def consumer_watermarks(conf: dict, topic: str) -> dict[int, tuple[int, int]]:
    """The baseline: what `watermarks` did before (a consumer, two requests per partition)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({**conf, "group.id": "deltadrain-watermarks", "enable.auto.commit": False})
    try:
        meta = consumer.list_topics(topic, timeout=TIMEOUT).topics[topic]
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=TIMEOUT, cached=False)
                for p in sorted(meta.partitions)}
    finally:
        consumer.close()


def main(rounds: int = 100) -> dict:
    with clicks_topic(1000) as (cfg, p):
        conf = kafka_consumer_conf(cfg, p)
        admin, consumer, same = [], [], 0
        for i in range(rounds):
            timed = [(admin, watermarks), (consumer, consumer_watermarks)]
            answers = []
            for times, read in (timed if i % 2 == 0 else timed[::-1]):
                began = time.perf_counter()
                answers.append(read(conf, p.source.topic))
                times.append(time.perf_counter() - began)
            same += answers[0] == {k: tuple(v) for k, v in answers[1].items()}
    new, old = ms_stats(admin), ms_stats(consumer)
    return {"rounds": rounds, "partitions": 4, "admin_list_offsets": new, "consumer_watermarks": old,
            "same_answer_rounds": same, "median_ratio_admin_to_consumer": round(new["median_ms"] / old["median_ms"], 2)}


if __name__ == "__main__":
    print(json.dumps(main(*map(int, sys.argv[1:2]))))
