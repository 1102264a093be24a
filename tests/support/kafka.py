"""The Kafka side of a test: a pipeline of its own, the topic's end offsets, the group's offsets, the
lake checkpoint they are judged against, draining to the end, and the exactly-once check."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from deltadrain.catchup import drain
from deltadrain.dev.produce import MALFORMED_KINDS
from deltadrain.lake.checkpoint import read_checkpoint
from deltadrain.sources.kafka.client import kafka_client_conf
from deltadrain.sources.kafka.offsets import group_offsets, watermarks
from tests.support.lake import assert_dead_letters, dlq_rows, target_ids
from tests.support.pipelines import example_config, write_config

# With a topic-partition-offset fallback, a payload without an id is published under that id.
FALLBACK_KINDS = ("missing_id", "null_id")


def make_kafka_pipeline(tmp_path: Path, partitions: int = 4, **overrides):
    """A config file with one Kafka pipeline of its own (own topic, created here, group, tables); returns
    (path, cfg, p). Ids fall back to the record's topic-partition-offset (field_or_offset)."""
    from deltadrain.dev.produce import ensure_topic

    data = example_config()
    name = f"k_{uuid.uuid4().hex[:8]}"
    pipe = next(p for p in data["pipelines"] if p["source"]["kind"] == "kafka")
    pipe["name"] = name
    # field_or_offset: these tests count the payloads without an id as published under their place
    # (kafka.FALLBACK_KINDS); the example's `field` dead-letters them (its own test).
    pipe["source"].update({"topic": name, "partitions": partitions, "group": f"{name}-group",
                           "id_from": "field_or_offset", **overrides.pop("source", {})})
    pipe["target"]["path"] = name
    pipe.pop("quality", None)
    pipe.update(overrides)
    path, cfg, p = write_config(tmp_path, data, pipe)
    ensure_topic(kafka_client_conf(cfg, p), name, partitions)
    return path, cfg, p


def send_marked(c, p, messages, at: int, marker: str) -> list[bytes]:
    """Produce `messages` in order to partition 0, the one at `at` with its `status` set to `marker`
    (a test transform acts on it): the payloads as sent."""
    from confluent_kafka import Producer

    payloads = [m.value for m in messages]
    payloads[at] = json.dumps({**json.loads(payloads[at]), "status": marker}).encode()
    producer = Producer(kafka_client_conf(c, p))
    for value in payloads:
        producer.produce(p.source.topic, value, partition=0)
    producer.flush(30)
    return payloads


def end_offsets(c, p) -> dict[str, str]:
    return {str(part): str(high) for part, (_, high) in watermarks(kafka_client_conf(c, p), p.source.topic).items()}


def lake_checkpoint(spark, c, p):
    return read_checkpoint(spark, str(c.target_path(p)), p.name, str(c.dlq_path(p)))


def group_of(c, p) -> dict[str, int | None]:
    parts = sorted(watermarks(kafka_client_conf(c, p), p.source.topic))
    return {str(k): v for k, v in group_offsets(kafka_client_conf(c, p), p.source.group, p.source.topic,
                                                parts).items()}


def assert_group_never_leads(spark, c, p) -> None:
    """A partition the lake does not know yet is read from its start, offset 0 in these topics (a
    claim notice puts that offset on the group before the first commit)."""
    lake = lake_checkpoint(spark, c, p).positions
    for part, offset in group_of(c, p).items():
        if offset is not None:
            assert offset <= int(lake.get(part, 0)), f"group offset {offset} leads the lake on {part}"


def drain_until_done(c, p, spark, max_runs: int = 12) -> list:
    """Drain until a run finds nothing, checking after each run that the group never leads the lake."""
    summaries = []
    for _ in range(max_runs):
        s = drain(c, p, spark=spark)
        summaries.append(s)
        assert_group_never_leads(spark, c, p)
        if s.outcome == "empty":
            return summaries
    raise AssertionError(f"not drained after {max_runs} runs: {[s.line() for s in summaries]}")


def expected_counts(*results) -> tuple[list[str], set[str], set[tuple[str, str]]]:
    """Of produce() results: the valid ids, the ids of the messages published under their
    topic-partition-offset, and the places (partition, offset) of the messages to dead-letter."""
    valid = [i for r in results for i in r.valid_ids]
    fallback = set().union(*(r.bad_places(FALLBACK_KINDS) for r in results))
    bad = set().union(*(r.bad_places(set(MALFORMED_KINDS) - set(FALLBACK_KINDS)) for r in results))
    return valid, fallback, bad


def assert_exactly_once(spark, c, p, valid_ids, fallback, bad) -> None:
    """`fallback`: how many messages are published under their topic-partition-offset, or their
    places; `bad`: how many dead letters, or their places."""
    ids = target_ids(spark, c, p)
    assert len(ids) == len(set(ids)), "a message id appears twice in the target"
    named = {i for i in ids if i.startswith("evt-")}
    assert named == set(valid_ids), (f"missing {sorted(set(valid_ids) - named)[:5]}, "
                                     f"unexpected {sorted(named - set(valid_ids))[:5]}")
    by_offset = {i for i in ids if not i.startswith("evt-")}
    if isinstance(fallback, int):
        assert len(by_offset) == fallback and all(i.startswith(f"{p.source.topic}-") for i in by_offset)
    else:
        assert by_offset == {f"{p.source.topic}-{part}-{offset}" for part, offset in fallback}
    assert_dead_letters(dlq_rows(spark, c, p), ids, bad)
    # Every offset of the topic is accounted for, and the lake checkpoint is the end of the topic.
    assert lake_checkpoint(spark, c, p).positions == end_offsets(c, p)
