"""One harness per source kind, behind one interface, for the contract suite
(tests/integration/test_contract.py): every test there runs once per kind in HARNESSES, as dlt runs
one test over every destination. A new kind gets the whole suite by adding its harness here.

A harness makes a pipeline of the test's own, produces into it (good, malformed and poison messages,
or payloads of the test's own at a partition), drains it (in the test's process with the session's
Spark, or as a CLI process that a failpoint kills), reads the target and the DLQ back, and asks the
source the one question every kind answers in its own terms: how many messages it has not been told
are done (Valkey: pending or undelivered entries of the group; Kafka: offsets past the group's)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from deltadrain.catchup import drain
from deltadrain.dev.produce import MALFORMED_KINDS, produce
from deltadrain.failpoints import DELAY_ENV, ENV, SKIP_ENV, fired
from deltadrain.lake.checkpoint import read_checkpoint
from tests.support.lake import assert_dead_letters, dlq_rows, target_ids
from tests.support.pipelines import set_source
from tests.support.processes import cli_drain

# The DLQ error type of each kind of malformed message `produce` writes: decoding is the same whatever
# the source.
DEAD_LETTER_TYPES = {"invalid_json": "invalid_json", "empty": "empty", "missing_id": "missing_id",
                     "null_id": "missing_id", "wrong_type": "schema", "invalid_utf8": "invalid_utf8",
                     "oversized": "oversized", "not_an_object": "not_an_object", "lone_surrogate": "invalid_json",
                     "too_deep": "invalid_json"}


@dataclass(frozen=True)
class Expected:
    """What a drain to the end must leave: these ids in the target once each, and a dead letter at each
    of these places (partition, position) once."""

    ids: frozenset[str]
    dead: frozenset[tuple[str, str]]

    def __add__(self, other: Expected) -> Expected:
        return Expected(self.ids | other.ids, self.dead | other.dead)


class Harness:
    kind: ClassVar[str]
    # The failpoints at the step boundaries of this kind's run (deltadrain.failpoints), in run order.
    step_points: ClassVar[tuple[str, ...]]
    server: ClassVar[str]  # the session fixture (tests/conftest.py) of the kind's embedded server
    partitions: ClassVar[int] = 4
    # How many messages the acknowledgement takes at a time, where a kill can land between its pieces.
    ack_chunk: ClassVar[int] = 0

    def __init__(self, tmp_path: Path, spark):
        self.tmp_path, self.spark = tmp_path, spark
        self.path: Path | None = None
        self.c = self.p = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.p.name if self.p else 'no pipeline'})"

    # -- the pipeline -----------------------------------------------------------------------------------

    def pipeline(self, partitions: int | None = None, *, place_ids: bool = True, **overrides) -> Harness:
        """Make the test's pipeline (the example's pipeline of this kind, with `overrides`). `place_ids`:
        where the kind can, a message without an id is published under its place (Kafka's
        topic-partition-offset) instead of dead-lettered as `missing_id`, every kind's default."""
        self.path, self.c, self.p = self._make(partitions or self.partitions, place_ids, **overrides)
        return self

    def _make(self, partitions: int, place_ids: bool, **overrides):
        raise NotImplementedError

    def set_source(self, **fields) -> None:
        """Edit the source settings in the config file, as an operator does."""
        self.c, self.p = set_source(self.path, **fields)

    @property
    def holds_claims(self) -> bool:
        """Claims sit at the source until acknowledged (a lease a reaper can take over)."""
        from deltadrain.sources import Reaps, source_of

        return isinstance(source_of(self.p), Reaps)

    def partition(self, index: int) -> str:
        """The name of partition `index`, as positions, dead letters and status name it."""
        raise NotImplementedError

    # -- producing --------------------------------------------------------------------------------------

    def produce(self, count: int, seed: int, **kwargs):
        """`deltadrain produce`'s deterministic messages, spread over the partitions by their key."""
        return produce(self.c, self.p, count, seed=seed, **kwargs)

    def send(self, payloads: list[bytes], partition: int = 0) -> list[tuple[str, str]]:
        """Append `payloads` in order to partition `partition`; their places (partition, position)."""
        raise NotImplementedError

    def expect(self, *results, bad_kinds=MALFORMED_KINDS) -> Expected:
        """What a drain to the end leaves of `produce` results: valid messages in the target, the
        `bad_kinds` in the DLQ."""
        ids = {i for r in results for i in r.valid_ids}
        dead = set().union(*(r.bad_places(bad_kinds) for r in results))
        return Expected(frozenset(ids), frozenset(dead))

    # -- draining ---------------------------------------------------------------------------------------

    def drain(self, pipeline=None):
        """One drain run in this process, on the session's Spark."""
        return drain(self.c, pipeline or self.p, spark=self.spark)

    def after_run(self) -> None:
        """What follows every run of a drain to the end (the reaper, a check of the source's books)."""

    def drain_until_done(self, max_runs: int = 12) -> list:
        """Drain until the source has nothing left that is not done; the run summaries."""
        summaries = []
        for _ in range(max_runs):
            summaries.append(self.drain())
            self.after_run()
            if self.unacked() == 0:
                return summaries
        raise AssertionError(f"not drained after {max_runs} runs: {[s.line() for s in summaries]}")

    def cli(self, env: dict | None = None, args: tuple[str, ...] = (), remote: bool = False):
        """`deltadrain drain` as a process of its own (tests.support.processes.cli_drain)."""
        return cli_drain(self.path, self.p.name, env, args=args, remote=remote)

    def kill_at(self, point: str, *, skip: int = 0, max_batches: int = 1, remote: bool = False) -> str:
        """A CLI drain SIGKILLed by the failpoint `point` (after `skip` passes of it); its stderr. A
        'during' point kills 300 ms into its step."""
        env = {ENV: point, DELAY_ENV: "300"}
        if skip:
            env[SKIP_ENV] = str(skip)
        proc = self.cli(env, args=("--max-batches", str(max_batches)) if max_batches > 1 else (), remote=remote)
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == -9, f"the drain was not killed at {point}: rc={proc.returncode}\n{err[-3000:]}"
        assert fired(point) in err, err[-3000:]  # this point's kill, not another's or the OOM killer's
        return err

    def read_in_spark_tasks(self, monkeypatch) -> None:
        """Make every batch read by Spark tasks, not in the drain's own process (small batches are)."""
        raise NotImplementedError

    # -- reading back -----------------------------------------------------------------------------------

    def target_ids(self) -> list[str]:
        return target_ids(self.spark, self.c, self.p)

    def dlq_rows(self) -> list:
        return dlq_rows(self.spark, self.c, self.p)

    def checkpoint(self):
        return read_checkpoint(self.spark, str(self.c.target_path(self.p)), self.p.name, str(self.c.dlq_path(self.p)))

    def status(self) -> dict:
        from deltadrain.observe.status import pipeline_status

        return pipeline_status(self.c, self.p)

    def claimed(self) -> int:
        """What status counts as CLAIMED: held by a run (and, with leases, not acknowledged yet)."""
        return self.status()["CLAIMED"]

    def probe(self):
        from deltadrain.observe.probe import probe

        return probe(self.c, self.p)

    def end_positions(self) -> dict[str, str]:
        """The checkpoint positions that cover everything the partitions hold now."""
        raise NotImplementedError

    def position_key(self, position: str):
        """A position as something that sorts in the partition's order."""
        raise NotImplementedError

    def resumes_at(self, from_rows: dict[str, str]) -> dict[str, str]:
        """The commit positions a checkpoint read back from the rows (their last positions) stands for."""
        return from_rows

    def unacked(self) -> int:
        """Messages the source has not been told are done (acknowledged): 0 once all are in the lake."""
        raise NotImplementedError

    def marks(self) -> dict:
        """The source's record of what the pipeline consumed (a backfill must leave it alone)."""
        raise NotImplementedError

    def remove_oldest(self, count: int, partition: int = 0) -> None:
        """The source drops the oldest `count` messages of a partition, as trimming or retention does."""
        raise NotImplementedError

    def check_status_partitions(self, st: dict) -> None:
        """The source's own per-partition lines of `deltadrain status --json`, against each other."""

    def assert_exactly_once(self, expected: Expected) -> None:
        """Each expected id once in the target, each expected dead letter once in the DLQ (and nothing
        both), nothing left unacknowledged, and the checkpoint at the end of every partition."""
        ids = self.target_ids()
        assert len(ids) == len(set(ids)), "a message id appears twice in the target"
        assert set(ids) == expected.ids, (f"missing {sorted(expected.ids - set(ids))[:5]}, "
                                          f"unexpected {sorted(set(ids) - expected.ids)[:5]}")
        assert_dead_letters(self.dlq_rows(), ids, expected.dead)
        assert self.unacked() == 0, f"{self.unacked()} messages not acknowledged"
        assert self.checkpoint().positions == self.end_positions()


class ValkeyHarness(Harness):
    kind = "valkey"
    step_points = ("after_claim", "during_merge", "after_commit", "during_ack")
    server = "valkey_server"

    @property
    def ack_chunk(self) -> int:
        from deltadrain.sources.valkey.acknowledge import ACK_IDS

        return ACK_IDS

    def _make(self, partitions: int, place_ids: bool, **overrides):
        from tests.support.valkey import make_pipeline

        return make_pipeline(self.tmp_path, partitions=partitions, **overrides)

    @property
    def client(self):
        from deltadrain.sources.valkey.client import valkey_client

        if getattr(self, "_client", None) is None:
            self._client = valkey_client(self.c, self.p)
        return self._client

    def partition(self, index: int) -> str:
        return self.p.source.streams[index]

    def send(self, payloads: list[bytes], partition: int = 0) -> list[tuple[str, str]]:
        from deltadrain.sources.valkey.client import VALKEY_FIELD

        stream = self.partition(partition)
        return [(stream, self.client.xadd(stream, {VALKEY_FIELD: value}).decode()) for value in payloads]

    def after_run(self) -> None:
        from deltadrain.sources.valkey.reap import reap

        reap(self.c, self.p, self.client)

    def read_in_spark_tasks(self, monkeypatch) -> None:
        from deltadrain.sources.valkey import drain as valkey_drain

        monkeypatch.setattr(valkey_drain, "CLAIM_HERE_MAX", 0)

    def end_positions(self) -> dict[str, str]:
        last = {stream: self.client.xrevrange(stream, count=1) for stream in self.p.source.streams}
        return {stream: entries[0][0].decode() for stream, entries in last.items() if entries}

    def position_key(self, position: str):
        from deltadrain.positions import StreamId

        return StreamId.parse(position)

    def unacked(self) -> int:
        from tests.support.valkey import lag, pending

        return pending(self.client, self.p) + lag(self.client, self.p)

    def marks(self) -> dict:
        from deltadrain.sources.valkey.client import as_text

        out = {}
        for stream in self.p.source.streams:
            for g in self.client.xinfo_groups(stream):
                if as_text(g["name"]) == self.p.source.group:
                    out[stream] = (as_text(g["last-delivered-id"]), int(g["pending"]), g.get("entries-read"))
        return out

    def remove_oldest(self, count: int, partition: int = 0) -> None:
        from tests.support.valkey import valkey_admin

        stream = self.partition(partition)
        length = self.client.xlen(stream)
        assert valkey_admin().xtrim(stream, maxlen=length - count, approximate=False) == count


class KafkaHarness(Harness):
    kind = "kafka"
    # Kafka's acknowledgement (the group offset commit) is one call: no point inside it.
    step_points = ("after_claim", "during_merge", "after_commit")
    server = "kafka_broker"

    def _make(self, partitions: int, place_ids: bool, **overrides):
        from tests.support.kafka import make_kafka_pipeline

        if not place_ids:
            overrides["source"] = {"id_from": "field", **overrides.get("source", {})}
        return make_kafka_pipeline(self.tmp_path, partitions=partitions, **overrides)

    @property
    def conf(self) -> dict:
        from deltadrain.sources.kafka.client import kafka_client_conf

        return kafka_client_conf(self.c, self.p)

    def partition(self, index: int) -> str:
        return str(index)

    def send(self, payloads: list[bytes], partition: int = 0) -> list[tuple[str, str]]:
        from confluent_kafka import Producer

        offsets: dict[int, int] = {}

        def delivered(err, msg, i):
            assert err is None, err
            offsets[i] = msg.offset()

        producer = Producer(self.conf)
        for i, value in enumerate(payloads):
            producer.produce(self.p.source.topic, value, partition=partition,
                             on_delivery=lambda err, msg, i=i: delivered(err, msg, i))
        assert producer.flush(30) == 0
        return [(str(partition), str(offsets[i])) for i in range(len(payloads))]

    def expect(self, *results, bad_kinds=MALFORMED_KINDS) -> Expected:
        """With `place_ids` (id_from: field_or_offset) the payloads without an id are published under
        their topic-partition-offset."""
        from tests.support.kafka import FALLBACK_KINDS

        if self.p.source.id_from == "field":
            return super().expect(*results, bad_kinds=bad_kinds)
        fallback = set().union(*(r.bad_places(set(bad_kinds) & set(FALLBACK_KINDS)) for r in results))
        dead = set().union(*(r.bad_places(set(bad_kinds) - set(FALLBACK_KINDS)) for r in results))
        ids = {i for r in results for i in r.valid_ids} | {f"{self.p.source.topic}-{q}-{o}" for q, o in fallback}
        return Expected(frozenset(ids), frozenset(dead))

    def after_run(self) -> None:
        from tests.support.kafka import assert_group_never_leads

        assert_group_never_leads(self.spark, self.c, self.p)

    def read_in_spark_tasks(self, monkeypatch) -> None:
        from deltadrain.sources.kafka import drain as kafka_drain

        monkeypatch.setattr(kafka_drain, "READ_HERE_MAX", 0)

    def end_positions(self) -> dict[str, str]:
        from tests.support.kafka import end_offsets

        return end_offsets(self.c, self.p)

    def position_key(self, position: str):
        return int(position)

    def resumes_at(self, from_rows: dict[str, str]) -> dict[str, str]:
        return {part: str(int(offset) + 1) for part, offset in from_rows.items()}  # rows hold the offset read

    def unacked(self) -> int:
        from deltadrain.sources.kafka.offsets import group_offsets, watermarks

        marks = watermarks(self.conf, self.p.source.topic)
        group = group_offsets(self.conf, self.p.source.group, self.p.source.topic, sorted(marks))
        return sum(high - max(low, group.get(q) or 0) for q, (low, high) in marks.items())

    def marks(self) -> dict:
        from tests.support.kafka import group_of

        return group_of(self.c, self.p)

    def remove_oldest(self, count: int, partition: int = 0) -> None:
        from confluent_kafka import TopicPartition
        from confluent_kafka.admin import AdminClient

        from deltadrain.sources.kafka.offsets import watermarks

        low, _ = watermarks(self.conf, self.p.source.topic)[partition]
        admin = AdminClient(self.conf)  # held: the futures fail once their client is freed
        for fut in admin.delete_records([TopicPartition(self.p.source.topic, partition, low + count)]).values():
            fut.result(30)

    def check_status_partitions(self, st: dict) -> None:
        for info in st["partitions"].values():
            assert info["end_offset"] - info["lake_checkpoint"] == info["pending"]
            assert info["group_offset"] == info["lake_checkpoint"] and info["gap"] is None
        assert sum(i["published"] for i in st["partitions"].values()) == st["PUBLISHED"]
        assert sum(i["dead"] for i in st["partitions"].values()) == st["DEAD"]


HARNESSES: dict[str, type[Harness]] = {h.kind: h for h in (ValkeyHarness, KafkaHarness)}
