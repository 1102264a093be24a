"""Kafka offsets: which range a run reads, which offsets retention took, and the group-offset commit.

The lake is the source of truth (docs/contract.md, "One drain run"): a partition's checkpoint is
the next offset to read (the exclusive end of the last committed range). The consumer-group
offsets are written after each commit for lag tools and are never read back as truth.

`plan_ranges` and `hold_positions` are pure: every decision about offsets is made there.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass

from deltadrain.errors import DeltadrainError
from deltadrain.sources.valkey.claim import allocate


@dataclass(frozen=True)
class Gap:
    """Offsets [start, end) of a partition that retention deleted before any run read them."""

    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start

    def as_dict(self) -> dict:
        return {**asdict(self), "missing": self.size}

    def __str__(self) -> str:
        return f"partition {self.partition} offsets [{self.start}, {self.end}) ({self.size} messages)"


@dataclass(frozen=True)
class Plan:
    ranges: dict[int, tuple[int, int]]  # partition -> [start, end): what this run reads
    gaps: list[Gap]
    positions: dict[str, str]  # the checkpoint after this run: every known partition's next offset

    @property
    def total(self) -> int:
        return sum(end - start for start, end in self.ranges.values())


class OffsetError(DeltadrainError):
    """The checkpoint and the topic disagree in a way no policy can settle (the topic was recreated)."""


class TopicMissing(OffsetError):
    """The broker answered that the topic does not exist (not created yet, or deleted)."""


def start_offsets(checkpoint: dict[str, str], watermarks: dict[int, tuple[int, int]],
                  starting: str = "earliest", first_run: bool | None = None,
                  complete: bool = True) -> tuple[dict[int, int], list[Gap]]:
    """Where the next run starts in each partition, and the offsets retention deleted before any run
    read them. A partition the checkpoint does not know starts at `starting` on the pipeline's first
    run only (no batch committed yet; without `first_run`, an empty checkpoint); one that appears
    later (added to the topic) starts at its earliest offset, and reports as a gap what retention
    deleted of it before (its offsets start at 0), when the checkpoint is `complete` (a commit's
    positions list every partition; a checkpoint rebuilt from rows only those with rows). A
    `latest` first run therefore reads nothing, and must commit where it started (`kafka.drain`),
    or the next run would be a first run too."""
    if first_run is None:
        first_run = not checkpoint
    starts: dict[int, int] = {}
    gaps: list[Gap] = []
    for part, (low, high) in sorted(watermarks.items()):
        if str(part) in checkpoint:
            start = int(checkpoint[str(part)])
            if start > high:
                raise OffsetError(f"partition {part}: the lake checkpoint {start} is past the topic's end offset "
                                  f"{high}; the topic was deleted and recreated? Stop and check")
            if low > start:
                gaps.append(Gap(part, start, low))
                start = low
        elif first_run:
            start = high if starting == "latest" else low
        else:
            # Added to the topic since the pipeline began: every offset from 0 is the pipeline's, so
            # what retention deleted before a run read it is a gap, as in any other partition.
            start = low
            if low > 0 and checkpoint and complete:
                gaps.append(Gap(part, 0, low))
        starts[part] = start
    return starts, gaps


def plan_ranges(checkpoint: dict[str, str], watermarks: dict[int, tuple[int, int]], cap: int,
                starting: str = "earliest", first_run: bool | None = None, complete: bool = True) -> Plan:
    """Fix the ranges of one run before reading anything.

    checkpoint: partition -> next offset, from the lake. watermarks: partition -> (earliest
    available, end) from the broker. Starts as start_offsets() says, so nothing produced into a new
    partition before the next run is skipped. The cap is split over partitions by backlog
    (water-filling), so a busy partition cannot starve the others.
    """
    starts, gaps = start_offsets(checkpoint, watermarks, starting, first_run, complete)
    missing = sorted(set(checkpoint) - {str(p) for p in watermarks})
    if missing:
        raise OffsetError(f"partitions {missing} are in the lake checkpoint but not in the topic any more")
    quotas = allocate(cap, {str(p): watermarks[p][1] - s for p, s in starts.items()})
    ranges = {p: (s, s + quotas[str(p)]) for p, s in starts.items() if quotas[str(p)] > 0}
    positions = {**checkpoint, **{str(p): str(s) for p, s in starts.items()}}
    positions.update({str(p): str(end) for p, (_, end) in ranges.items()})
    return Plan(ranges, gaps, positions)


def hold_positions(positions: dict[str, str], pending: list[tuple[str, str]]) -> dict[str, str]:
    """A message left for another attempt holds its partition's checkpoint at its offset, so that the
    next run reads it again (Kafka has no per-message pending list). Rows after it are read again
    too; the commit leaves them out (`KafkaDrain.before_held`)."""
    out = dict(positions)
    for part, offset in pending:
        out[part] = str(min(int(out[part]), int(offset))) if part in out else offset
    return out


def retry_record(old: dict, pending: dict[tuple[str, str], dict], positions: dict[str, str]) -> dict:
    """The attempts of messages that are held for another try, kept in the commit metadata.

    old: the previous commit's record ("partition:offset" -> {...}); pending: this run's culprits left
    for another attempt. Entries behind the new checkpoint are finished (published or dead) and drop out.
    """
    merged = {**old, **{f"{p}:{o}": v for (p, o), v in pending.items()}}
    return {k: v for k, v in merged.items()
            if int(k.rsplit(":", 1)[1]) >= int(positions.get(k.rsplit(":", 1)[0], "0"))}


def attempts_so_far(record: dict) -> dict[tuple[int, int], int]:
    return {(int(k.rsplit(":", 1)[0]), int(k.rsplit(":", 1)[1])): int(v["attempts"]) for k, v in record.items()}


# -- claim notices: the range of a running batch, for status ----------------------------------------

NOTICE = "deltadrain_claim"


def claim_notice(run_id: str, start: int, end: int, since_ms: int, crashes: dict | None = None,
                 earlier: list | None = None, width: int | None = None) -> str:
    """The group-offset metadata that tells status a run is reading [start, end) of a partition. It
    also carries how many offsets the whole run reads (`width`, over all its partitions: a run of one
    offset that dies died with that message alone) and what the run knew of dead runs on that
    partition (`kafka.crashes`), for the run after it should this one die too."""
    notice: dict = {"run": run_id, "range": [start, end], "since_ms": since_ms,
                    "width": end - start if width is None else width}
    if crashes:
        notice["crashes"] = crashes
    if earlier:
        notice["earlier"] = earlier
    return json.dumps({NOTICE: notice}, separators=(",", ":"))


def read_notice(metadata: str | None) -> dict | None:
    """The claim notice in a group offset's metadata; None for none (empty, or another tool's text)."""
    try:
        notice = json.loads(metadata or "").get(NOTICE)
        start, end = (int(x) for x in notice["range"])
        out = {"run": str(notice["run"]), "range": [start, end], "since_ms": int(notice["since_ms"]),
               "width": int(notice.get("width") or 0)}
    except (ValueError, TypeError, AttributeError, KeyError):
        return None
    out["crashes"] = notice.get("crashes") if isinstance(notice.get("crashes"), dict) else {}
    out["earlier"] = notice.get("earlier") if isinstance(notice.get("earlier"), list) else []
    return out


def claimed(notice: dict | None, start: int, end_offset: int) -> int:
    """How many offsets of a partition a notice still claims: those of its range the lake has not
    passed (`start`, the next offset to read) and the topic still holds. A notice left by a run that
    died, or whose batch landed before its group offsets did, claims nothing past the lake."""
    if notice is None:
        return 0
    lo, hi = notice["range"]
    return max(0, min(hi, end_offset) - max(lo, start))


# -- the broker ---------------------------------------------------------------------------------------

TIMEOUT = 30
# What a broker answers while it starts, restarts or moves a group or partition leader: the same
# request succeeds moments later. librdkafka does not flag these retriable on committed() and commit().
TRANSIENT = frozenset({"NOT_COORDINATOR", "COORDINATOR_LOAD_IN_PROGRESS", "COORDINATOR_NOT_AVAILABLE",
                       "NOT_LEADER_FOR_PARTITION", "LEADER_NOT_AVAILABLE", "_TRANSPORT"})


# What a partition's new leader answers ListOffsets until it has loaded the partition (a restarted
# broker): the consumer's watermark call asked again inside librdkafka; the admin call does not.
LEADER_MOVING = frozenset({"OFFSET_NOT_AVAILABLE", "UNKNOWN_LEADER_EPOCH", "FENCED_LEADER_EPOCH",
                           "REPLICA_NOT_AVAILABLE", "KAFKA_STORAGE_ERROR", "REQUEST_TIMED_OUT"})


def transient(error) -> bool:
    """A KafkaError worth asking again (until the deadline) rather than failing the caller."""
    return error.retriable() or error.name() in TRANSIENT


def patiently(call, deadline_s: float = TIMEOUT, pause: float = 0.2, also: frozenset[str] = frozenset()):
    """call(), asked again after a transient broker error (or one named in `also`) until `deadline_s`
    has passed; any other error, or a transient one past the deadline, is raised as it came."""
    from confluent_kafka import KafkaError, KafkaException

    deadline = time.monotonic() + deadline_s
    while True:
        try:
            return call()
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if (not isinstance(error, KafkaError) or not (transient(error) or error.name() in also)
                    or time.monotonic() + pause > deadline):
                raise
        time.sleep(pause)
        pause = min(pause * 2, 2.0)


def remaining(until: float | None) -> float:
    """How long a broker request may wait: TIMEOUT, or with `until` (time.monotonic(): a page that
    must answer) what is left of it, at least 0.5 s so that it is asked once."""
    return TIMEOUT if until is None else max(0.5, min(TIMEOUT, until - time.monotonic()))


def _checked(partitions):
    """Raise the first per-partition error of a committed()/commit() answer, so `patiently` sees it."""
    from confluent_kafka import KafkaException

    for tp in partitions or []:
        if tp.error is not None:
            raise KafkaException(tp.error)
    return partitions


def watermarks(conf: dict, topic: str, until: float | None = None) -> dict[int, tuple[int, int]]:
    """partition -> (earliest available offset, end offset) for every partition the topic has now.

    Asked with the admin ListOffsets (per kind, one request per partition leader), not the consumer's
    get_watermark_offsets: when the earliest answer is negative (a restarted broker that has not
    loaded the partition yet), librdkafka reports the end offset as the earliest, and a drain would
    take the whole partition for a retention gap. Here such an answer is asked again, for TIMEOUT
    (a drain on a restarting broker), or up to `until` (`remaining`)."""
    return topic_offsets(conf, topic, None, until)[0]


def topic_offsets(conf: dict, topic: str, group: str | None, until: float | None = None
                  ) -> tuple[dict[int, tuple[int, int]], dict[int, tuple[int | None, str | None]]]:
    """(watermarks, and with a `group` what `committed` answers for every partition), from one admin
    client: the topic's metadata, then the earliest and end offsets and the group's offsets asked
    together. Each round trip to a busy broker costs its wait; a second client (a consumer for the
    group) would add its own bootstrap and coordinator lookup (bench/cli_reads)."""
    from confluent_kafka import (
        ConsumerGroupTopicPartitions,
        IsolationLevel,
        KafkaError,
        KafkaException,
        TopicPartition,
    )
    from confluent_kafka.admin import AdminClient, OffsetSpec

    # The consumers' isolation level decides the end offset (under read_committed, the default of
    # pipelines and of librdkafka's consumers, the last stable offset, where Spark's reads stop); it
    # is a request setting here, not a client property.
    level = (IsolationLevel.READ_UNCOMMITTED if conf.get("isolation.level") == "read_uncommitted"
             else IsolationLevel.READ_COMMITTED)
    # An admin client is a producer to librdkafka, which may ask the broker to create a topic it
    # looks up: a deleted topic must stay gone. Kept referenced until the answer: a collected client
    # fails its futures.
    admin = AdminClient({**{k: v for k, v in conf.items() if k != "isolation.level"},
                         "allow.auto.create.topics": False})

    def ask_offsets(parts: list[int], spec, timeout: float) -> dict:
        return admin.list_offsets({TopicPartition(topic, p): spec for p in parts}, isolation_level=level,
                                  request_timeout=timeout)

    def answers(futures: dict) -> dict[int, int]:
        # No timeout of its own: request_timeout fails the future (a KafkaException, asked again).
        return {tp.partition: future.result().offset for tp, future in futures.items()}

    def read() -> tuple[dict[int, tuple[int, int]], dict[int, tuple[int | None, str | None]]]:
        meta = admin.list_topics(topic, timeout=remaining(until)).topics.get(topic)
        if meta is None or (meta.error is not None and meta.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
            raise TopicMissing(f"topic '{topic}' is not available: {meta.error if meta else 'unknown topic'}")
        if meta.error is not None:
            raise OffsetError(f"topic '{topic}' is not available: {meta.error}")
        parts = sorted(meta.partitions)
        if not parts:
            return {}, {}
        timeout = remaining(until)
        earliest, latest = ask_offsets(parts, OffsetSpec.earliest(), timeout), ask_offsets(parts, OffsetSpec.latest(), timeout)
        asked = (admin.list_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in parts])], request_timeout=timeout)
            if group else {})
        marks, unknown = answered_marks(answers(earliest), answers(latest))
        if unknown:
            raise KafkaException(KafkaError(KafkaError.OFFSET_NOT_AVAILABLE, reason=(
                f"topic '{topic}' partitions {unknown}: the broker does not know their offsets yet")))
        offsets = {}
        for future in asked.values():
            for tp in _checked(future.result().topic_partitions):
                offsets[tp.partition] = (tp.offset if tp.offset >= 0 else None, tp.metadata or None)
        return marks, offsets

    # One deadline for the whole answer, not one per partition.
    return patiently(read, remaining(until), also=LEADER_MOVING)


def answered_marks(earliest: dict[int, int], latest: dict[int, int]
                   ) -> tuple[dict[int, tuple[int, int]], list[int]]:
    """The broker's two answers as partition -> (earliest, end), and the partitions whose answer is
    not one yet: a negative offset (unknown), a missing one, or an earliest past the end."""
    marks, unknown = {}, []
    for part in sorted(set(earliest) | set(latest)):
        low, high = earliest.get(part, -1), latest.get(part, -1)
        if low < 0 or high < 0 or low > high:
            unknown.append(part)
        else:
            marks[part] = (low, high)
    return marks, unknown


def commit_group_offsets(conf: dict, group: str, topic: str, offsets: dict[int, int]) -> None:
    """Tell Kafka how far the lake is, for lag tools (kafka-consumer-groups, Burrow...). Never read back."""
    from confluent_kafka import TopicPartition

    # No metadata: this also takes off the run's claim notices.
    _commit(conf, group, [TopicPartition(topic, p, o) for p, o in sorted(offsets.items())])


def _commit(conf: dict, group: str, offsets: list, deadline_s: float = TIMEOUT) -> None:
    from confluent_kafka import Consumer

    consumer = Consumer({**conf, "group.id": group, "enable.auto.commit": False})
    try:
        patiently(lambda: _checked(consumer.commit(offsets=offsets, asynchronous=False)), deadline_s)
    finally:
        consumer.close()


def committed(conf: dict, group: str, topic: str, partitions: list[int],
              deadline_s: float = TIMEOUT) -> dict[int, tuple[int | None, str | None]]:
    """partition -> (the group's committed offset or None, its metadata)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({**conf, "group.id": group, "enable.auto.commit": False})
    try:
        got = patiently(lambda: _checked(consumer.committed([TopicPartition(topic, p) for p in partitions],
                                                            timeout=min(TIMEOUT, deadline_s))), deadline_s)
        return {tp.partition: (tp.offset if tp.offset >= 0 else None, tp.metadata or None) for tp in got}
    finally:
        consumer.close()


def group_offsets(conf: dict, group: str, topic: str, partitions: list[int]) -> dict[int, int | None]:
    """The group's committed offsets (for status and tests; the drain never reads them)."""
    return {p: offset for p, (offset, _) in committed(conf, group, topic, partitions).items()}


def announce_claims(conf: dict, group: str, topic: str, ranges: dict[int, tuple[int, int]], lake: dict[int, int],
                    run_id: str, deadline_s: float = 10, current: dict | None = None,
                    carried: dict[int, dict] | None = None) -> None:
    """Put a claim notice on the group offset of each partition a run reads, so that status can show
    the range of a running batch (Kafka has no pending list), and so that the next run can count this
    one as dead if it never commits (`kafka.crashes`: `carried` is what the notice carries for that).
    The offsets do not move; a partition the group never committed gets the lake's position (`lake`,
    else the range's start), so they never lead the lake checkpoint. `current`: the group's offsets
    as the run read them at its start (else read here). A neighbour's group commit landing between
    that read and this commit is set back until its next one: lag tools would show lag that is not
    there for a while."""
    from confluent_kafka import TopicPartition

    if current is None:
        current = committed(conf, group, topic, sorted(ranges), deadline_s)
    since = int(time.time() * 1000)
    width = sum(end - start for start, end in ranges.values())
    offsets = []
    for p, (start, end) in sorted(ranges.items()):
        offset = current.get(p, (None, None))[0]
        offset = offset if offset is not None else lake.get(p, start)
        meta = claim_notice(run_id, start, end, since, width=width, **(carried or {}).get(p, {}))
        offsets.append(TopicPartition(topic, p, offset, metadata=meta))
    _commit(conf, group, offsets, deadline_s)


def check_group(conf: dict, group: str, topic: str, partitions: list[int], lake: dict[int, int],
                deadline_s: float = 10) -> dict[int, tuple[int | None, str | None]]:
    """The group's offsets of `partitions` (as `committed` answers), after committing them as they are:
    a login whose ACL lacks READ on the group (which the claim notices and the commit after the lake's
    need) fails here, before the run reads anything, with GROUP_AUTHORIZATION_FAILED, instead of after
    a lake commit it cannot follow in the group. Through the admin API: a consumer's commit only times
    out waiting for a coordinator it may not use. The partitions in `lake` (those the run reads, with
    where the lake's checkpoint stands) are committed: each keeps its offset and claim notice, and one
    the group never committed gets the lake's position, as a claim notice would: never ahead of it."""
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({k: v for k, v in conf.items() if k != "isolation.level"})

    def one(futures):
        return next(iter(futures.values())).result().topic_partitions

    def listed():
        asked = [TopicPartition(topic, p) for p in sorted(set(partitions) | set(lake))]
        return one(admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group, asked)],
                                                     request_timeout=deadline_s))

    current = {tp.partition: (tp.offset if tp.offset >= 0 else None, tp.metadata or None)
               for tp in _checked(patiently(listed, deadline_s))}
    offsets = []
    for p, position in sorted(lake.items()):
        offset, meta = current.get(p, (None, None))
        offsets.append(TopicPartition(topic, p, offset if offset is not None else position,
                                      **({"metadata": meta} if meta else {})))
    if offsets:
        _checked(patiently(lambda: one(admin.alter_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(group, offsets)], request_timeout=deadline_s)), deadline_s))
    return current


def withdraw_claims(conf: dict, group: str, topic: str, partitions: list[int], run_id: str,
                    deadline_s: float = 10) -> None:
    """Take this run's claim notices off (a run that failed or lost the race); notices of other runs
    and the offsets stay as they are."""
    from confluent_kafka import TopicPartition

    current = committed(conf, group, topic, partitions, deadline_s)
    ours = [TopicPartition(topic, p, offset) for p, (offset, meta) in sorted(current.items())
            if offset is not None and (read_notice(meta) or {}).get("run") == run_id]
    if ours:
        _commit(conf, group, ours, deadline_s)


def same_topic(topic: str, recorded: str | None, current: str | None) -> None:
    """The lake checkpoint was taken on this topic, not on one deleted before it under the same name.
    The broker gives each topic an id (KIP-516) that a recreated topic does not keep; its offsets
    restart at 0, so a checkpoint from the old topic would skip as many of the new one's records.
    Unknown ids (a checkpoint from before ids were recorded, a broker that cannot say) pass."""
    if recorded and current and recorded != current:
        raise OffsetError(f"topic '{topic}' was deleted and recreated since the lake checkpoint (topic id {recorded}, "
                          f"now {current}): the checkpoint's offsets are the old topic's, and reading on from them "
                          "would skip the new topic's first records. Drain the new topic with a new pipeline (its "
                          "own name, group and target); this one's checkpoint cannot go on")


def topic_id(conf: dict, topic: str, known: bool = False) -> str | None:
    """The broker's id of `topic`, or None when it has none (an all-zero id). `known`: the topic had an
    id before, so a broker that does not know it yet is asked again until the deadline."""
    from confluent_kafka import TopicCollection
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(conf)  # kept referenced until the answer: a collected client fails its futures

    def describe():
        return admin.describe_topics(TopicCollection([topic]), request_timeout=TIMEOUT)[topic].result(TIMEOUT)

    # A broker that is starting answers a moment later, and may not know the topic until it has
    # loaded its metadata; a topic that is really gone still fails, after the deadline.
    unknown = frozenset({"UNKNOWN_TOPIC_OR_PART", "UNKNOWN_TOPIC_ID"}) if known else frozenset()
    uuid = patiently(describe, also=unknown).topic_id
    if uuid is None or (uuid.get_most_significant_bits(), uuid.get_least_significant_bits()) == (0, 0):
        return None
    return str(uuid)
