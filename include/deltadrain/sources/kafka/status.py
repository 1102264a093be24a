"""Lifecycle counts at a Kafka source: per partition, the offsets after the lake's checkpoint
(PENDING), those inside a running batch's range (CLAIMED, from the claim notices on the group
offsets), the gaps retention made, and the offsets runs that died read."""

from __future__ import annotations

from pathlib import Path

from deltadrain.config import KafkaSource, PipelineConfig
from deltadrain.paths import command_line
from deltadrain.sources import SourceNote
from deltadrain.sources.kafka.client import kafka_source

NO_TOPIC = "no_topic"


def stale_after_ms(pipeline: PipelineConfig) -> int:
    """The drain task's execution_timeout, which Airflow kills the task at; the next drain reads such
    a range again whatever the claim notice says."""
    return int(pipeline.airflow.execution_timeout.total_seconds() * 1000)


def dead_after_ms(pipeline: PipelineConfig) -> int:
    """When status shows a Kafka claim notice's own run as dead: once Airflow would have killed it
    (stale) and the next drain counts it (min_idle_ms)."""
    return max(stale_after_ms(pipeline), pipeline.min_idle_ms)


def kafka_counts(conf: dict, source: KafkaSource, positions: dict[str, str], published: dict[str, int],
                 dead: dict[str, int], with_group: bool = True, first_run: bool | None = None,
                 crashes: dict | None = None, min_idle_ms: int = 60_000, stale_ms: int | None = None,
                 committed_by: str | None = None, complete: bool = True, until: float | None = None) -> dict:
    """Per partition: end offset, lake checkpoint, PENDING (after the checkpoint, not claimed), CLAIMED
    (inside the range of a running batch, from the claim notice on the group offset: see
    kafka.offsets.announce_claims), offsets retention deleted unread (gap), the group's committed
    offset (informational), PUBLISHED and DEAD rows. Without the group (`with_group=False`) nothing
    is known to be claimed. `dead_runs`: the offsets that runs which died read (kafka.crashes; `crashes`
    is the lake's record): the runs the notices carry, and the notice's own run once it is older
    than `stale_ms` (stale: a younger one may be a long batch still running). `until`
    (time.monotonic()) bounds the broker calls together (default: each its own TIMEOUT)."""
    import time

    from deltadrain.sources.kafka.crashes import DeadRuns, settle, suspects
    from deltadrain.sources.kafka.offsets import claimed, read_notice, start_offsets, topic_offsets

    # The offsets and the group's claim notices in one client, asked together (topic_offsets).
    marks, group = topic_offsets(conf, source.topic, source.group if with_group else None, until)
    starts, gap_list = start_offsets(positions, marks, source.starting_offsets, first_run, complete)
    gaps = {g.partition: g.as_dict() for g in gap_list}
    now_ms = int(time.time() * 1000)
    partitions: dict[str, dict] = {}
    claimed_by: dict[str, dict] = {}
    dead_runs: list = []
    for part, (low, high) in sorted(marks.items()):
        key = str(part)
        offset, meta = group.get(part, (None, None))
        notice = read_notice(meta)
        kept = (crashes or {}).get(key) or {}
        record = settle(DeadRuns.from_json(kept), list(kept.get("earlier") or []), notice, starts[part], now_ms,
                        min_idle_ms, stale_ms, committed_by).record
        dead_runs += suspects({part: record})
        held = claimed(notice, starts[part], high)
        partitions[key] = {"earliest": low, "end_offset": high,
                           "lake_checkpoint": int(positions[key]) if key in positions else None,
                           "pending": high - starts[part] - held, "claimed": held,
                           "claimed_range": notice["range"] if held and notice else None, "group_offset": offset,
                           "gap": gaps.get(part), "published": published.get(key, 0), "dead": dead.get(key, 0)}
        if held and notice is not None:  # a claim is known only from a notice
            run = claimed_by.setdefault(notice["run"], {"claimed": 0, "idle_ms": now_ms - notice["since_ms"],
                                                        "ranges": {}})
            run["claimed"] += held
            run["ranges"][key] = notice["range"]
    return {"PENDING": sum(v["pending"] for v in partitions.values()),
            "CLAIMED": sum(v["claimed"] for v in partitions.values()), "claimed_by": claimed_by,
            "oldest_claim_idle_ms": max((v["idle_ms"] for v in claimed_by.values()), default=0),
            "gaps": list(gaps.values()), "dead_runs": dead_runs, "partitions": partitions}


def first_unpublished(counts: dict) -> dict[int, int]:
    """Per partition with messages not in the lake yet, the offset of the first of them (pure)."""
    return {int(part): info["end_offset"] - info["pending"] - info["claimed"]
            for part, info in (counts.get("partitions") or {}).items() if info["pending"] + info["claimed"] > 0}


def oldest_pending_ms(conf: dict, topic: str, counts: dict, timeout_s: float = 10.0) -> int | None:
    """The timestamp of the oldest record not in the lake yet (the record's own: CreateTime, or the
    broker's LogAppendTime), one fetch per partition that has any; None: none waits."""
    import time

    from confluent_kafka import Consumer, TopicPartition

    starts = first_unpublished(counts)
    if not starts:
        return None
    # A group id is required by the client; nothing is committed under it (no auto commit, no commit call).
    consumer = Consumer({**conf, "group.id": "deltadrain-alerts", "enable.auto.commit": False,
                         "enable.partition.eof": True, "auto.offset.reset": "earliest"})
    try:
        consumer.assign([TopicPartition(topic, part, offset) for part, offset in starts.items()])
        found: dict[int, int] = {}
        waiting = set(starts)
        deadline = time.monotonic() + timeout_s
        while waiting and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=len(waiting), timeout=0.5):
                part = msg.partition()
                if part not in waiting:
                    continue
                waiting.discard(part)  # its first record, or the end of the partition (an aborted tail)
                if msg.error() is None:
                    found[part] = msg.timestamp()[1]
    finally:
        consumer.close()
    return min(found.values()) if found else None


def missing_topic(pipeline: PipelineConfig, positions: dict[str, str], config: Path | None = None) -> dict:
    """The counts of a pipeline whose topic the broker does not know (pure): nothing to drain, and a
    note that says why and what to do. A topic the lake's checkpoint holds offsets of was there and
    is gone: that is no state to wait out, and is raised as a SourceNote."""
    topic = kafka_source(pipeline).topic
    if positions:
        raise SourceNote(f"topic '{topic}' does not exist on the broker, yet the lake's checkpoint holds offsets of "
                         f"it ({positions}): it was deleted after batches were drained from it; check the broker")
    text = (f"topic '{topic}' does not exist yet: nothing has been produced to it. It appears when a producer "
            f"first writes to it or it is created on the broker (`{command_line(f'produce {pipeline.name} --count N', config)}` "
            "writes sample events); until then there is nothing to drain")
    return {"PENDING": 0, "CLAIMED": 0, "claimed_by": {}, "oldest_claim_idle_ms": 0, "gaps": [], "dead_runs": [],
            "partitions": {}, "notes": [{"state": NO_TOPIC, "note": text}]}


def status_lines(st: dict) -> list[str]:
    """`deltadrain status`'s lines of the source's own: per partition, the gaps, the ranges under suspicion."""
    lines = []
    if st.get("partitions"):
        lines.append("partition  end offset  lake checkpoint  pending  claimed range  group offset  published  dead")
    for part, info in (st.get("partitions") or {}).items():
        held = "[{}, {})".format(*info["claimed_range"]) if info["claimed_range"] else "-"
        lines.append(f"{part:>9}  {info['end_offset']:>10}  {str(info['lake_checkpoint']):>15}  {info['pending']:>7}  "
                     f"{held:>13}  {str(info['group_offset']):>12}  {info['published']:>9}  {info['dead']:>4}")
    for gap in st.get("gaps") or []:
        lines.append(f"GAP: partition {gap['partition']} offsets [{gap['start']}, {gap['end']}) were deleted by "
                     f"retention before they were read ({gap['missing']} messages)")
    for dead in st.get("dead_runs") or []:
        lines.append("UNDER SUSPICION: partition {} offsets [{}, {}) ({} offsets) were read by {} runs that died "
                     "before committing, {} of them with one message alone; the next runs read it half at a time "
                     "(max_retries deaths alone: a dead letter)".format(
                         dead["partition"], *dead["offsets"], dead["offsets"][1] - dead["offsets"][0], dead["runs"],
                         dead.get("alone", 0)))
    return lines
