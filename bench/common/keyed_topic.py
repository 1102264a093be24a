"""Shared by the upsert benchmarks (upsert_drain/, upsert_target_size/): a Kafka topic of entity states
keyed by their id (a key's states stay in one partition), some of them soft deletes, and a config whose
pipelines all read it, each with its own group and target."""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path

import yaml

from deltadrain.paths import PROJECT_ROOT

FIELDS = {"change_id": "string", "id": "long", "name": "string", "amount": "double", "version": "long", "gone": "boolean"}
DELETE_WHEN = {"field": "gone", "equals": True}


def changes(count: int, keys: int, seed: int = 7, delete_ratio: float = 0.05) -> list[dict]:
    """`count` entity states over `keys` ids, drawn at random: most ids change several times, a share of
    the changes are soft deletes (`gone`), a deleted id may come back later."""
    rng = random.Random(seed)
    version: dict[int, int] = {}
    out = []
    for i in range(count):
        key = rng.randrange(keys)
        version[key] = version.get(key, 0) + 1
        out.append({"change_id": f"c{seed}-{i}", "id": key, "name": f"n{key}-{version[key]}", "amount": round(rng.uniform(0, 1000), 2),
                    "version": version[key], "gone": rng.random() < delete_ratio})
    return out


def produce_changes(cfg, pipeline, rows: list[dict], partitions: int) -> None:
    from confluent_kafka import Producer

    from deltadrain.dev.produce import ensure_topic
    from deltadrain.sources.kafka.client import kafka_client_conf

    conf = kafka_client_conf(cfg, pipeline)
    ensure_topic(conf, pipeline.source.topic, partitions)
    producer = Producer({**conf, "linger.ms": 50, "batch.num.messages": 10000})
    for row in rows:
        producer.produce(pipeline.source.topic, json.dumps(row).encode(), key=str(row["id"]).encode(),
                         partition=row["id"] % partitions)
        producer.poll(0)
    producer.flush(60)


def write_config(workdir: Path, topic: str, partitions: int, batch: int, sides: dict[str, str]) -> Path:
    """A config with one pipeline per entry of `sides` (name -> mode: upsert | insert), all on `topic`."""
    workdir.mkdir(parents=True, exist_ok=True)
    data = yaml.safe_load((PROJECT_ROOT / "config" / "pipelines.yaml").read_text())
    base = next(p for p in data["pipelines"] if p["source"]["kind"] == "kafka")
    pipes = []
    for name, mode in sides.items():
        p = copy.deepcopy(base)
        # Insert keeps each change once by its id; upsert has no message id (its key is the row's identity).
        schema = {"fields": dict(FIELDS)} if mode == "upsert" else {"fields": dict(FIELDS), "id_field": "change_id"}
        p.update(name=name, batch_cap=batch, transform=None, schema=schema)
        p["source"].update(topic=topic, partitions=partitions, group=name, id_from="field_or_offset")
        p["target"] = ({"path": name, "mode": "upsert", "key": ["id"], "delete_when": dict(DELETE_WHEN)}
                       if mode == "upsert" else {"path": name})
        p.pop("quality", None)
        pipes.append(p)
    data.update(pipelines=pipes, data_dir=str(workdir / "lake"))
    path = workdir / "upsert_bench.yaml"
    path.write_text(yaml.safe_dump(data))
    return path
