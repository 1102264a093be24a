"""The broker's part of `deltadrain status` of a Kafka pipeline, side by side in one process: the
topic's offsets and its group's offsets as status asked them at b6ce47e (an admin client for the
metadata and the two offset lists, one after the other, then a consumer of its own for the group's
offsets) against one admin client with the three offset requests asked together (topic_offsets).
Also times the imports a Kafka status adds. Run from the repository root with PYTHONPATH=include and
the DELTADRAIN_* variables naming the services; prints JSON.

Usage: python bench/cli_reads/kafka_reads.py PIPELINE [ROUNDS]
"""

from __future__ import annotations

import json
import sys
import time

began = time.perf_counter()
import confluent_kafka.admin  # noqa: E402,F401

imported = time.perf_counter() - began

from deltadrain.config import load_config  # noqa: E402
from deltadrain.sources.kafka.client import kafka_consumer_conf  # noqa: E402
from deltadrain.sources.kafka.offsets import committed, topic_offsets, watermarks  # noqa: E402


def two_clients(conf: dict, topic: str, group: str) -> None:
    marks = watermarks(conf, topic)
    committed(conf, group, topic, sorted(marks))


def one_client(conf: dict, topic: str, group: str) -> None:
    topic_offsets(conf, topic, group)


def main() -> None:
    cfg = load_config()
    p = cfg.pipeline(sys.argv[1])
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    conf = {**kafka_consumer_conf(cfg, p), "socket.timeout.ms": 3000, "log_level": 2}
    times: dict[str, list[float]] = {"two clients, one request at a time (b6ce47e)": [],
                                     "one admin client, offsets asked together": []}
    for _ in range(rounds):  # alternated, so that both meet the same load
        for (_name, seconds), way in zip(times.items(), (two_clients, one_client), strict=True):
            t = time.perf_counter()
            way(conf, p.source.topic, p.source.group)
            seconds.append(round(time.perf_counter() - t, 3))
    print(json.dumps({"import confluent_kafka.admin": round(imported, 3), **times}, indent=1))


if __name__ == "__main__":
    main()
