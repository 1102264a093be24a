"""The Kafka drain against a real KRaft broker, Spark and Delta, judged by reading the tables back: what
only Kafka has (offsets from the lake, claim notices, ids from keys and headers, retention gaps,
recreated topics, added partitions, transactions, compaction, the bisection of what dead runs read).
What every source must keep is in the contract suite, tests/integration/test_contract.py.

Each test has a pipeline of its own (topic, group, tables), so they can share the broker.
"""

from __future__ import annotations

import json
import time
from datetime import UTC

import pytest
import yaml

from deltadrain.catchup import drain
from deltadrain.config import load_config
from deltadrain.dev.produce import ensure_topic, generate, produce
from deltadrain.failpoints import fired
from deltadrain.observe.probe import probe
from deltadrain.observe.status import mark_stale, pipeline_status
from deltadrain.run.drain import DrainError
from deltadrain.sources import source_of
from deltadrain.sources.kafka.client import kafka_client_conf
from deltadrain.sources.kafka.offsets import (
    announce_claims,
    commit_group_offsets,
    committed,
    read_notice,
    watermarks,
    withdraw_claims,
)
from deltadrain.sources.kafka.status import kafka_counts
from tests.support.kafka import (
    assert_exactly_once,
    assert_group_never_leads,
    drain_until_done,
    end_offsets,
    expected_counts,
    group_of,
    lake_checkpoint,
    make_kafka_pipeline,
    send_marked,
)
from tests.support.lake import clean_up_delta_log, dlq_rows, target_ids
from tests.support.pipelines import BOTH_TRANSFORMS, set_source
from tests.support.processes import SPAWNED, cli_drain, held_at, running, summary_of, wait_held

pytestmark = pytest.mark.usefixtures("kafka_broker")

# With a topic-partition-offset fallback, a payload without an id is published under that id.
@BOTH_TRANSFORMS
def test_null_keys_missing_headers_tombstones_and_ids_from_a_header(transform, tmp_path, cfg, spark):
    from confluent_kafka import Producer

    _, c, p = make_kafka_pipeline(tmp_path, partitions=2, source={"id_from": "header", "id_header": "msg-id"},
                                  transform=transform)
    producer = Producer(kafka_client_conf(c, p))
    msgs = list(generate(p, 6, seed=5))
    topic = p.source.topic
    producer.produce(topic, msgs[0].value, key=None, partition=0, headers=[("msg-id", b"h-0")])  # null key
    producer.produce(topic, msgs[1].value, key=b"k1", partition=0)  # no headers: the id is topic-0-1
    producer.produce(topic, msgs[2].value, key=b"k2", partition=1, headers=[("other", b"x")])  # header missing
    producer.produce(topic, None, key=b"k3", partition=1, headers=[("msg-id", b"h-3")])  # tombstone
    producer.produce(topic, msgs[4].value, key=None, partition=1, headers=[("msg-id", b"h-0")])  # same id again
    producer.produce(topic, b"not json", key=None, partition=0, headers=[("msg-id", b"h-5")])
    producer.flush(30)
    s = drain(c, p, spark=spark)
    assert s.outcome == "committed" and s.claimed == 6 and s.written == 3 and s.duplicates_skipped == 1
    assert sorted(target_ids(spark, c, p)) == sorted(["h-0", f"{topic}-0-1", f"{topic}-1-0"])
    dead = {r.error_type: r for r in dlq_rows(spark, c, p)}
    assert set(dead) == {"tombstone", "invalid_json"}
    assert dead["tombstone"].message_id == "h-3" or dead["tombstone"].message_id == f"{topic}-1-1"
    assert "null value" in dead["tombstone"].error and dead["tombstone"].original is None
    assert dead["invalid_json"].message_id == "h-5" and bytes(dead["invalid_json"].original) == b"not json"
    assert lake_checkpoint(spark, c, p).positions == end_offsets(c, p) == {"0": "3", "1": "3"}


def test_a_range_read_in_the_drains_process_stages_the_same_rows_as_spark_tasks(tmp_path, cfg, spark, monkeypatch):
    """Both places `read_ranges` reads (the drain's process up to READ_HERE_MAX offsets, Spark tasks
    beyond) stage the same rows and schema from the same range: ids from a header, replay ids, null keys,
    records without headers, a tombstone, bad payloads, attempts, a dead run's conviction, an aborted
    transaction's hole mid-range and at the end of a partition, and a range end short of the log's."""
    import pyarrow.parquet as pq
    from confluent_kafka import Producer

    from deltadrain.sources.kafka import consume
    from deltadrain.sources.kafka import drain as kafka_drain
    from deltadrain.sources.kafka.crashes import DeadRuns

    _, c, p = make_kafka_pipeline(tmp_path, partitions=2, source={"id_from": "header", "id_header": "msg-id"})
    topic, replayed = p.source.topic, kafka_drain.REPLAY_ID_HEADER
    producer = Producer({**kafka_client_conf(c, p), "transactional.id": f"{p.name}-tx"})
    producer.init_transactions(30)
    msgs = list(generate(p, 40, seed=9, malformed_ratio=0.2))
    plain = [msg.value for msg in msgs]

    def send(value, partition, key=None, headers=None):
        producer.begin_transaction()
        producer.produce(topic, value, key=key, partition=partition, headers=headers)
        producer.commit_transaction(30)

    for i in range(20):  # partition 0: every kind of record, one transaction each (a marker after each)
        send(plain[i], 0, key=None if i % 3 else b"k", headers=[
            None, [("msg-id", f"h-{i}".encode())], [(replayed, f"copy-{i}".encode())],
            [("other", b"x"), (replayed, b"\xff")], [("msg-id", b"\xfe")]][i % 5])
    send(None, 0, headers=[("msg-id", b"gone")])  # tombstone
    in_transaction(producer, p, msgs[20:24], commit=False)  # aborted: a hole in both partitions
    for i in range(24, 40):
        send(plain[i], 1, headers=[("msg-id", f"h-{i}".encode())] if i % 2 else None)
    in_transaction(producer, p, msgs[:2], commit=False)  # aborted at the end of both partitions
    ends = {q: high for q, (_, high) in watermarks(kafka_client_conf(c, p), topic).items()}
    ranges = {0: (1, ends[0]), 1: (0, ends[1] - 5)}  # partition 1 stops short of its log's end
    attempts = {(0, 4): 2, (1, 3): 1}
    dead = {0: DeadRuns(((6, 9, 2, 1_700_000_000_000),), ("r1",), ((6, 10),))}  # offset 6 died alone: convicted

    staged = {}
    # "bytes": the drain's process with its byte bound low enough that the records reach the decoder a
    # few at a time, as large messages would.
    for side, limit, batch_bytes in (("here", 10**9, consume.BATCH_BYTES), ("bytes", 10**9, 300), ("spark", 0, 0)):
        monkeypatch.setattr(kafka_drain, "READ_HERE_MAX", limit)
        monkeypatch.setattr(consume, "BATCH_BYTES", batch_bytes)
        got = kafka_drain.read_ranges(spark, c, p, ranges, attempts, str(tmp_path / side), dead_runs=dead)
        staged[side] = (got, pq.read_table(got.files).sort_by([("_dd_partition", "ascending"),
                                                              ("_dd_pos_hi", "ascending")]))
    (here_staged, here), (spark_staged, there) = staged["here"], staged["spark"]
    assert len(here_staged.files) == 1 and here.schema == there.schema
    assert here.to_pylist() == there.to_pylist() == staged["bytes"][1].to_pylist()
    assert pq.ParquetFile(staged["bytes"][0].files[0]).metadata.num_row_groups > 4  # it did read in pieces
    a, b = here_staged.total, spark_staged.total
    assert (a.rows, a.good, a.bad, a.again, a.pos) == (b.rows, b.good, b.bad, b.again, b.pos)
    assert a.oldest.astimezone(UTC) == b.oldest.astimezone(UTC)  # Spark's rows give naive local times
    assert here_staged.stats() == spark_staged.stats()
    # What the comparison covered.
    rows = here.to_pylist()
    assert {r["_dd_pos_hi"] for r in rows if r["_dd_partition"] == "0"} == set(range(2, 42, 2))  # 1: a marker
    assert max(r["_dd_pos_hi"] for r in rows if r["_dd_partition"] == "1") < ends[1] - 5
    kinds = {r["_dd_error_type"] for r in rows}
    assert {"tombstone", "max_retries", "invalid_utf8", None} <= kinds and len(kinds) > 4
    ids = {r[p.payload_schema.id_field] for r in rows}
    assert "copy-2" in ids and "h-1" in ids and f"{topic}-0-0" not in ids
    assert {r["_dd_attempts"] for r in rows} >= {1, 3}
    # A start that retention deleted since the plan: an error naming the pipeline, never a jump ahead.
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(kafka_client_conf(c, p))  # held: the futures fail once their client is freed
    for fut in admin.delete_records([TopicPartition(topic, 1, 5)]).values():
        fut.result(30)
    monkeypatch.setattr(kafka_drain, "READ_HERE_MAX", 10**9)
    with pytest.raises(DrainError, match=rf"pipeline '{p.name}': could not read its offset ranges: topic "
                                         rf"'{topic}' partition 1: .*(?i:out of range)"):
        kafka_drain.read_ranges(spark, c, p, {1: (3, 9)}, {}, str(tmp_path / "deleted"))


def test_six_partitions_one_much_busier_are_all_drained_under_a_batch_cap(tmp_path, cfg, spark):
    from confluent_kafka import Producer

    _, c, p = make_kafka_pipeline(tmp_path, partitions=6, batch_cap=1200)
    producer = Producer({**kafka_client_conf(c, p), "linger.ms": 20})
    msgs = list(generate(p, 3250, seed=33))
    # Partition 0 gets 3000 messages, the five others 50 each.
    placement = [0] * 3000 + [1 + i % 5 for i in range(250)]
    for m, part in zip(msgs, placement, strict=True):
        producer.produce(p.source.topic, m.value, key=m.partition_key, partition=part)
    producer.flush(30)
    first = drain(c, p, spark=spark)
    # The quiet partitions are read whole in the first batch; the busy one takes the rest of the cap.
    assert first.claimed == 1200
    assert {k: int(v) for k, v in first.positions.items()} == {"0": 950, "1": 50, "2": 50, "3": 50, "4": 50, "5": 50}
    summaries = [first, *drain_until_done(c, p, spark)]
    assert [x.claimed for x in summaries] == [1200, 1200, 850, 0]
    assert_exactly_once(spark, c, p, [m.key for m in msgs], 0, 0)


def test_a_partition_added_mid_stream_is_picked_up_from_its_beginning(tmp_path, cfg, spark):
    from confluent_kafka.admin import AdminClient, NewPartitions

    _, c, p = make_kafka_pipeline(tmp_path, partitions=2)
    one = produce(c, p, 400, seed=44)
    assert drain(c, p, spark=spark).positions.keys() == {"0", "1"}
    admin = AdminClient(kafka_client_conf(c, p))
    admin.create_partitions([NewPartitions(p.source.topic, 4)])[p.source.topic].result(30)
    deadline = time.time() + 30
    while len(watermarks(kafka_client_conf(c, p), p.source.topic)) < 4 and time.time() < deadline:
        time.sleep(0.5)
    two = produce(c, p, 800, seed=44, start=400)  # spread over four partitions now
    assert two.per_partition[2] > 0 and two.per_partition[3] > 0
    s = drain(c, p, spark=spark)
    assert s.claimed == 800 and set(s.positions) == {"0", "1", "2", "3"}
    drain_until_done(c, p, spark)
    assert_exactly_once(spark, c, p, one.valid_ids + two.valid_ids, 0, 0)


def test_latest_starts_at_the_end_offsets_once_and_then_reads_everything_after_them(tmp_path, cfg, spark):
    _, c, p = make_kafka_pipeline(tmp_path, partitions=2, source={"starting_offsets": "latest"})
    produce(c, p, 40, seed=61)  # before the pipeline's first run: never ingested
    first_probe = probe(c, p)
    assert first_probe.unstarted and first_probe.has_work, "the sensor must let the first run start the pipeline"
    first = drain(c, p, spark=spark)
    assert (first.outcome, first.batch, first.claimed, first.written) == ("committed", 1, 0, 0), first.line()
    start = end_offsets(c, p)
    checkpoint = lake_checkpoint(spark, c, p)
    assert (checkpoint.batch, checkpoint.positions) == (1, start)
    assert checkpoint.meta["started_at"] == "latest"
    assert group_of(c, p) == {k: int(v) for k, v in start.items()}
    assert not probe(c, p).has_work
    # Runs after the first start where it left off, not at the then-current end.
    after = produce(c, p, 60, seed=61, start=40)
    assert probe(c, p).new == 60
    s = drain(c, p, spark=spark)
    assert (s.outcome, s.batch, s.claimed, s.written) == ("committed", 2, 60, 60), s.line()
    assert drain(c, p, spark=spark).outcome == "empty"
    ids = target_ids(spark, c, p)
    assert sorted(ids) == sorted(after.valid_ids)
    assert lake_checkpoint(spark, c, p).positions == end_offsets(c, p)
    status = pipeline_status(c, p)
    assert (status["PENDING"], status["PUBLISHED"]) == (0, 60)


def in_transaction(producer, p, messages, *, commit: bool) -> list[str]:
    """Send `messages` in one Kafka transaction, spread over partitions 0 and 1, then commit or abort it."""
    producer.begin_transaction()
    for m in messages:
        producer.produce(p.source.topic, m.value, key=m.partition_key, partition=m.index % 2)
    producer.flush(30)  # an abort purges what was not sent yet: these records must reach the log
    (producer.commit_transaction if commit else producer.abort_transaction)(30)
    return [m.key for m in messages]


def test_a_transactional_producers_aborted_and_open_records_never_land(tmp_path, cfg, spark):
    """Read committed: aborted records are not data, an open transaction's records wait for its end,
    and a range that holds nothing readable (aborted records, markers) still moves the checkpoint."""
    from confluent_kafka import Producer

    _, c, p = make_kafka_pipeline(tmp_path, partitions=2)
    producer = Producer({**kafka_client_conf(c, p), "transactional.id": f"{p.name}-tx"})
    producer.init_transactions(60)
    kept = in_transaction(producer, p, list(generate(p, 50, seed=71)), commit=True)
    in_transaction(producer, p, list(generate(p, 30, seed=71, start=50)), commit=False)
    kept += in_transaction(producer, p, list(generate(p, 20, seed=71, start=80)), commit=True)
    kept += produce(c, p, 10, seed=71, start=100).valid_ids  # and records outside any transaction
    # 110 records and a commit or abort marker per transaction and partition are in the log.
    assert sum(int(end) for end in end_offsets(c, p).values()) == 110 + 3 * 2
    drain_until_done(c, p, spark)
    assert sorted(target_ids(spark, c, p)) == sorted(kept), "an aborted transaction's records landed"
    assert lake_checkpoint(spark, c, p).positions == end_offsets(c, p)
    assert not probe(c, p).has_work

    # An open transaction: nothing of it is read until it ends, and then only if it commits.
    producer.begin_transaction()
    for m in generate(p, 15, seed=71, start=110):
        producer.produce(p.source.topic, m.value, key=m.partition_key, partition=m.index % 2)
    producer.flush(30)
    during = drain(c, p, spark=spark)
    assert (during.outcome, during.claimed) == ("empty", 0), during.line()
    producer.abort_transaction(30)
    assert probe(c, p).has_work  # the aborted records and the marker lie past the checkpoint
    after = drain(c, p, spark=spark)
    # Nothing readable in the range, yet the checkpoint moves past it: no run finds it again.
    assert (after.outcome, after.claimed, after.written) == ("committed", 0, 0), after.line()
    assert lake_checkpoint(spark, c, p).positions == end_offsets(c, p)
    assert not probe(c, p).has_work
    assert drain(c, p, spark=spark).outcome == "empty"
    kept += in_transaction(producer, p, list(generate(p, 10, seed=71, start=125)), commit=True)
    drain_until_done(c, p, spark)
    assert sorted(target_ids(spark, c, p)) == sorted(kept)
    assert lake_checkpoint(spark, c, p).positions == end_offsets(c, p)
    assert pipeline_status(c, p)["PENDING"] == 0
    producer.flush(30)


def visible_offsets(c, p, partition: int = 0) -> list[int]:
    """The offsets a consumer reads on `partition` now, from the start of its log."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer({**kafka_client_conf(c, p), "group.id": f"{p.name}-peek", "enable.auto.commit": False,
                         "enable.partition.eof": True, "isolation.level": "read_committed"})
    try:
        consumer.assign([TopicPartition(p.source.topic, partition, 0)])
        offsets: list[int] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            msg = consumer.poll(1)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    return offsets
                raise AssertionError(msg.error())
            offsets.append(msg.offset())
        raise AssertionError("the partition's end was not reached in 30 s")
    finally:
        consumer.close()


def test_a_compacted_topic_lands_what_compaction_kept_once_and_its_checkpoint_passes_the_holes(tmp_path, cfg,
                                                                                                  spark):
    """Compaction removes a key's older records from closed segments: the offsets of a range the
    pipeline has not read yet have holes, some ranges none but holes. The drain lands what the log
    still holds, each once, and its checkpoint moves past the holes; they are not a retention gap
    (the log still starts at 0), and no run reads them again."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )

    _, c, p = make_kafka_pipeline(tmp_path, partitions=1, batch_cap=20)
    settings = {"cleanup.policy": "compact", "segment.ms": "300", "min.cleanable.dirty.ratio": "0.01",
                "min.compaction.lag.ms": "0"}
    admin = AdminClient(kafka_client_conf(c, p))
    topic = ConfigResource(ResourceType.TOPIC, p.source.topic, incremental_configs=[
        ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in settings.items()])
    for fut in admin.incremental_alter_configs([topic]).values():
        fut.result(30)
    producer = Producer(kafka_client_conf(c, p))
    messages = list(generate(p, 101, seed=83))
    for m in messages[:100]:  # offsets 0..99: ten versions of each of ten keys, the last at 90..99
        producer.produce(p.source.topic, m.value, key=f"k{m.index % 10}".encode(), partition=0)
    producer.flush(30)
    for _ in range(3):
        drain(c, p, spark=spark)
    assert lake_checkpoint(spark, c, p).positions == {"0": "60"}
    # A record after segment.ms rolls the segment: offsets 0..99 can now be compacted.
    time.sleep(1)
    producer.produce(p.source.topic, messages[100].value, key=b"roll", partition=0)
    producer.flush(30)
    deadline = time.monotonic() + 120  # the log cleaner looks every 15 s by default
    while (kept := visible_offsets(c, p)) != list(range(90, 101)):
        assert time.monotonic() < deadline, f"not compacted in 120 s: {len(kept)} records visible"
        time.sleep(2)
    found = probe(c, p)
    assert (found.gaps, found.has_work) == (0, True)

    runs = drain_until_done(c, p, spark)
    # [60, 80) holds nothing any more: its batch commits the positions alone. Then [80, 100) holds
    # 90..99, and [100, 101) the last record.
    assert [(s.outcome, s.claimed, s.written, s.gaps) for s in runs[:3]] == [
        ("committed", 0, 0, 0), ("committed", 10, 10, 0), ("committed", 1, 1, 0)], [s.line() for s in runs]
    assert [s.positions for s in runs[:3]] == [{"0": "80"}, {"0": "100"}, {"0": "101"}]
    ids = target_ids(spark, c, p)
    assert len(ids) == len(set(ids)) == 71
    assert set(ids) == {m.key for m in messages[:60] + messages[90:]}  # read before compaction, or kept by it
    assert dlq_rows(spark, c, p) == []
    assert lake_checkpoint(spark, c, p).positions == end_offsets(c, p) == {"0": "101"}
    assert group_of(c, p) == {"0": 101}
    assert not probe(c, p).has_work
    st = pipeline_status(c, p)
    assert (st["PENDING"], st["gaps"]) == (0, [])


def test_a_retention_gap_is_reported_with_its_range_and_stops_or_continues_per_policy(tmp_path, cfg, spark):
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    path, c, p = make_kafka_pipeline(tmp_path, partitions=1, batch_cap=100)
    first = produce(c, p, 100, seed=55)
    drain(c, p, spark=spark)
    later = produce(c, p, 300, seed=55, start=100)  # offsets 100..399
    # Retention takes offsets 100..249 before any run read them.
    admin = AdminClient(kafka_client_conf(c, p))
    for fut in admin.delete_records([TopicPartition(p.source.topic, 0, 250)]).values():
        fut.result(30)
    found = probe(c, p)  # the sensor wakes a run, which stops on the gap: the failure shows in Airflow
    assert (found.new, found.gaps, found.has_work) == (150, 150, True)
    with pytest.raises(DrainError, match=r"partition 0 offsets \[100, 250\) \(150 messages\)"):
        drain(c, p, spark=spark)
    st = pipeline_status(c, p)
    assert st["gaps"] == [{"partition": 0, "start": 100, "end": 250, "missing": 150}]
    assert st["partitions"]["0"]["pending"] == 150  # what is left to read: 250..399
    assert lake_checkpoint(spark, c, p).batch == 1  # on_gap: fail committed nothing
    from deltadrain.orchestration.view.data import pipeline_view

    view = pipeline_view(c, p)  # the Airflow view shows the gap that stops the runs
    assert [(g["partition"], g["range"], g["missing"]) for g in view["open_gaps"]] == [("0", "offsets 100 to 249", 150)]
    # The operator accepts the loss: the next runs go on after the gap and say so.
    c, p = set_source(path, on_gap="continue")
    s = drain(c, p, spark=spark)
    assert s.outcome == "committed" and s.gaps == 150
    assert s.gap_ranges == [{"partition": 0, "start": 100, "end": 250, "missing": 150}]
    assert s.positions == {"0": "350"}
    drain_until_done(c, p, spark)
    kept = later.valid_ids[150:]
    assert sorted(target_ids(spark, c, p)) == sorted(first.valid_ids + kept)
    assert lake_checkpoint(spark, c, p).positions == {"0": "400"}
    assert pipeline_status(c, p)["gaps"] == []
    view = pipeline_view(c, p)  # read past: no longer open, recorded by the commit that went on after it
    assert view["open_gaps"] == []
    assert [(g["batch"], g["range"], g["missing"]) for g in view["gaps"]] == [(s.batch, "offsets 100 to 249", 150)]


def test_a_gap_with_nothing_readable_after_it_is_committed_past_once_under_continue(tmp_path, cfg, spark):
    """Retention took every unread offset: under on_gap: continue the run commits the positions past
    the gap with the gap in its metadata, so that later runs neither report it again nor see work."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    from deltadrain.orchestration.view.data import pipeline_view

    _, c, p = make_kafka_pipeline(tmp_path, partitions=2, source={"on_gap": "continue"})
    first = produce(c, p, 100, seed=57)
    drain_until_done(c, p, spark)
    produce(c, p, 100, seed=57, start=100)
    ends = {int(k): int(v) for k, v in end_offsets(c, p).items()}
    admin = AdminClient(kafka_client_conf(c, p))
    for fut in admin.delete_records([TopicPartition(p.source.topic, q, end) for q, end in ends.items()]).values():
        fut.result(30)
    found = probe(c, p)  # nothing new, but a run must go past the gap: the sensor does not wait for more
    assert (found.new, found.gaps, found.has_work) == (0, 100, True)
    s = drain(c, p, spark=spark)
    assert (s.outcome, s.claimed, s.written, s.gaps) == ("committed", 0, 0, 100), s.line()
    assert s.positions == {str(q): str(end) for q, end in ends.items()}
    assert lake_checkpoint(spark, c, p).positions == s.positions
    assert not probe(c, p).has_work
    again = drain(c, p, spark=spark)
    assert (again.outcome, again.gaps) == ("empty", 0), again.line()
    assert pipeline_status(c, p)["gaps"] == []
    view = pipeline_view(c, p)
    assert view["open_gaps"] == [] and sum(g["missing"] for g in view["gaps"]) == 100
    assert {g["batch"] for g in view["gaps"]} == {s.batch}
    assert sorted(target_ids(spark, c, p)) == sorted(first.valid_ids)


@pytest.mark.slow
def test_a_message_that_kills_every_run_is_isolated_by_bisection_and_dead_alone(tmp_path, cfg, spark):
    """Kafka has no delivery count: a run killed by a message (stopped from inside its transform as a
    SIGKILL stops it, failpoints.ABANDON: the real SIGKILLs are the kill tests') leaves only its claim
    notice. The next runs count it and read
    half of the dead run's range at a time; a run that read the one message alone and died counts a
    death alone. The message is dead after max_retries of those, read by at most
    isolation.crash_loop_runs runs; every other message is published."""
    from deltadrain.run.isolation import crash_loop_runs
    from tests.integration.crash_transform import CRASH_MARKER
    from tests.support.processes import run_or_killed

    _, c, p = make_kafka_pipeline(tmp_path, partitions=1, batch_cap=8, max_retries=2, min_idle_ms=0,
                                  transform="tests.integration.crash_transform.abandon_on_marker")
    messages = [m for m in generate(p, 40, seed=91) if m.kind == "valid"][:20]
    crasher = 11
    payloads = send_marked(c, p, messages, crasher, CRASH_MARKER)
    assert end_offsets(c, p) == {"0": "20"}

    runs, seen = [], []
    while lake_checkpoint(spark, c, p).positions != end_offsets(c, p):
        assert len(runs) < 14, runs
        s = run_or_killed(c, p, spark)
        runs.append(s)
        if s == "killed":
            seen.append(pipeline_status(c, p)["dead_runs"])  # what status shows after the kill
        else:
            assert s["outcome"] == "committed", s
    # [0, 8) commits; [8, 16) dies; its first half [8, 12) dies; [8, 10) commits; the rest [10, 12) dies;
    # [10, 11) commits; [11, 12) alone dies twice (max_retries 2); then it is a dead letter unread by the
    # transform; [12, 16), the piece no run died on since, half at a time; the last 4.
    assert [r if r == "killed" else (r["claimed"], r["dead_lettered"]) for r in runs] == [
        (8, 0), "killed", "killed", (2, 0), "killed", (1, 0), "killed", "killed", (1, 1), (2, 0), (2, 0), (4, 0)], runs
    assert runs.count("killed") + 1 == crash_loop_runs(p.batch_cap, p.max_retries)
    # Status names the ranges under suspicion once a run has counted them (a notice's own run only once
    # it is stale and older than min_idle_ms: it may be a long batch still running).
    assert seen[:2] == [[], [{"partition": 0, "offsets": [8, 16], "runs": 1, "alone": 0}]]
    assert seen[4] == [{"partition": 0, "offsets": [11, 12], "runs": 4, "alone": 1},
                       {"partition": 0, "offsets": [12, 16], "runs": 1, "alone": 0}]
    assert runs[8]["dead_runs"] == [{"partition": 0, "offsets": [11, 12], "runs": 5, "alone": 2},
                                    {"partition": 0, "offsets": [12, 16], "runs": 1, "alone": 0}]
    # It alone is a dead letter, with its bytes and why; every other message is published once.
    dead = dlq_rows(spark, c, p)
    assert [int(r.position) for r in dead] == [crasher] and dead[0].error_type == "max_retries"
    assert "every run that read this message alone died before committing: 2 runs" in dead[0].error
    assert bytes(dead[0].original) == payloads[crasher]
    ids = target_ids(spark, c, p)
    assert sorted(ids) == sorted(m.key for o, m in enumerate(messages) if o != crasher)
    # Nothing is left in the record once the lake has passed it.
    checkpoint = lake_checkpoint(spark, c, p)
    assert checkpoint.meta.get("crashes") is None and checkpoint.positions == {"0": "20"}
    assert pipeline_status(c, p)["dead_runs"] == []
    assert drain(c, p, spark=spark).outcome == "empty"


@pytest.mark.slow
def test_a_message_that_killed_a_run_and_then_failed_a_transform_still_gets_its_last_attempt(
        tmp_path, cfg, spark, monkeypatch):
    """Dead runs and transform failures are one count (invariant 6), each attempt counted once: a
    message that kills the first run and fails the second one's transform is held with a retry
    record while the dead run's segment is carried next to the checkpoint. Its third read is its
    third attempt, allowed by max_retries=2, and it is published, not a dead letter counted at four."""
    from tests.integration.crash_transform import CRASH_MARKER, RUNS_ENV, TURN_ENV

    path, c, p = make_kafka_pipeline(tmp_path, partitions=1, batch_cap=8, max_retries=2, min_idle_ms=0,
                                     transform="tests.integration.crash_transform.crash_then_fail_on_marker")
    messages = [m for m in generate(p, 20, seed=97) if m.kind == "valid"][:8]
    send_marked(c, p, messages, 0, CRASH_MARKER)
    monkeypatch.setenv(RUNS_ENV, str(tmp_path / "runs"))
    # The first run, a process of its own with its Spark driver: the marker kills both, mid-batch.
    killed = cli_drain(path, p.name, env={TURN_ENV: "0"})
    _, err = killed.communicate(timeout=600)
    assert killed.returncode == -9, err[-3000:]
    runs = []
    while lake_checkpoint(spark, c, p).positions != end_offsets(c, p):
        assert len(runs) < 5, runs
        monkeypatch.setenv(TURN_ENV, str(len(runs) + 1))
        runs.append(drain(c, p, spark=spark))
    # The second run read half the dead run's range and held the partition at the culprit; the third
    # read that half again and its transform passed the message; the fourth read the rest.
    assert [(r.claimed, r.written, r.dead_lettered) for r in runs] == [(4, 0, 0), (4, 4, 0), (4, 4, 0)], runs
    assert dlq_rows(spark, c, p) == []
    ids = target_ids(spark, c, p)
    assert sorted(ids) == sorted(m.key for m in messages)
    assert set((tmp_path / "runs").read_text().split()) == {"0", "1", "2"}  # the marker met three runs, no more


@pytest.mark.slow
def test_a_run_airflow_kills_in_a_hanging_transform_is_counted_and_the_message_dead_after_max_retries(
        tmp_path, cfg, spark):
    """What Airflow does at a drain task's execution_timeout: SparkSubmitHook.on_kill SIGKILLs
    spark-submit. The Python driver outlives that JVM for a moment and fails like any run; had it
    taken its claim notice off then, no run could count it, and a message that hangs the transform
    would hang every run after it."""
    import os
    import subprocess

    from deltadrain.paths import PROJECT_ROOT
    from deltadrain.runtime.session import spark_submit_command
    from tests.integration.hang_transform import FLAG_ENV, HANG_MARKER

    # Batches of 2 with the second message hanging: each killed run is a spark-submit driver of its own,
    # so as few die as show the protocol (the first batch, then the hanging message alone).
    path, c, p = make_kafka_pipeline(tmp_path, partitions=1, batch_cap=2, max_retries=1, min_idle_ms=0,
                                     transform="tests.integration.hang_transform.hang_on_marker")
    messages = [m for m in generate(p, 30, seed=93) if m.kind == "valid"][:4]
    hangs = 1
    payloads = send_marked(c, p, messages, hangs, HANG_MARKER)
    conf, group, topic = kafka_client_conf(c, p), p.source.group, p.source.topic
    job = str(PROJECT_ROOT / "spark_jobs" / "drain.py")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")]))}

    def killed_while_hanging(run_id: str) -> dict:
        flag = tmp_path / run_id
        proc = subprocess.Popen(spark_submit_command(job, [p.name, "--config", str(path), "--run-id", run_id]),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env={**env, FLAG_ENV: str(flag)}, cwd=PROJECT_ROOT)
        SPAWNED.append(proc)  # killed at the test's end if an assertion stops it first
        deadline = time.time() + 300
        while not flag.exists():
            assert proc.poll() is None and time.time() < deadline, proc.communicate()[0][-3000:]
            time.sleep(0.2)
        proc.kill()  # SparkSubmitHook.on_kill
        proc.communicate(timeout=60)
        deadline = time.time() + 120  # the Python driver fails on its lost JVM, then exits
        while running("spark_jobs/drain.py", run_id):
            assert time.time() < deadline, "the drain's Python driver did not exit after its JVM was killed"
            time.sleep(0.2)
        notice = read_notice(committed(conf, group, topic, [0])[0][1])
        assert notice is not None and notice["run"] == run_id, "the killed run took its claim notice off"
        return notice

    first = killed_while_hanging("hang-1")
    assert first["range"] == [0, 2] and first["crashes"] == {} and first["width"] == 2
    s = drain(c, p, spark=spark)  # it counts the first and reads its first half only, which does not hang
    assert (s.outcome, s.claimed, s.written) == ("committed", 1, 1), s.line()
    assert s.dead_runs == [{"partition": 0, "offsets": [0, 2], "runs": 1, "alone": 0}]
    second = killed_while_hanging("hang-2")  # the rest of [0, 2): the hanging message alone
    assert second["range"] == [1, 2] and second["width"] == 1
    # Its notice carries the count the commit before it kept, for the run that counts this one.
    assert second["crashes"]["seg"] == [[0, 2, 1, first["since_ms"]]] and second["crashes"]["counted"] == ["hang-1"]
    # max_retries 1: one death alone and it is a dead letter, not run through the transform again.
    s = drain(c, p, spark=spark)
    assert (s.outcome, s.claimed, s.dead_lettered, s.written) == ("committed", 1, 1, 0), s.line()
    assert s.dead_runs == [{"partition": 0, "offsets": [1, 2], "runs": 2, "alone": 1}]
    rest = [drain(c, p, spark=spark) for _ in range(2)]
    assert [(r.outcome, r.claimed) for r in rest] == [("committed", 2), ("empty", 0)]
    dead = {int(r.position): r for r in dlq_rows(spark, c, p)}
    assert sorted(dead) == [hangs] and dead[hangs].error_type == "max_retries"
    assert bytes(dead[hangs].original) == payloads[hangs]
    ids = target_ids(spark, c, p)
    assert sorted(ids) == sorted(m.key for i, m in enumerate(messages) if i != hangs)
    assert lake_checkpoint(spark, c, p).positions == {"0": "4"} and not running("spark_jobs/drain.py", "hang-")


def test_rows_recovery_ignores_dead_letters_of_a_batch_that_never_committed(tmp_path, cfg, spark, monkeypatch):
    """Dead letters are written before their batch's commit. A run that dies in between leaves them
    with a batch number the table never reached; were they counted when the positions must be read
    back from the rows (log cleanup took the commit file), the next run would start after them and
    skip the valid messages of that batch that lay before them."""
    import deltadrain.run.drain as drain_module

    _, c, p = make_kafka_pipeline(tmp_path, partitions=1)
    one = produce(c, p, 50, seed=71)
    assert drain(c, p, spark=spark).batch == 1
    two = produce(c, p, 100, seed=71, start=50, malformed_ratio=0.2)
    _, _, bad = expected_counts(two)
    assert bad

    def died_before_the_commit(*args, **kwargs):
        raise RuntimeError("the run died between its dead letters and its commit")

    with monkeypatch.context() as m:
        m.setattr(drain_module, "commit_batch", died_before_the_commit)
        with pytest.raises(RuntimeError, match="died between"):
            drain(c, p, spark=spark)
    assert {r.batch for r in dlq_rows(spark, c, p)} == {2}  # the dead letters of the batch that never was
    before = lake_checkpoint(spark, c, p)
    clean_up_delta_log(spark, str(c.target_path(p)), before.table_version)
    after = lake_checkpoint(spark, c, p)
    assert (after.batch, after.found_in) == (1, "rows")
    assert {k: str(int(v) + 1) for k, v in after.positions.items()} == before.positions == {"0": "50"}
    # A run that reads less commits batch 2 ([50, 70)). The dead run's dead letters carry batch 2 as
    # well, some beyond 70: counted once that commit's file is gone too, they would move the next
    # run past valid messages of [70, 150) that nobody published.
    narrow = drain(c, p.model_copy(update={"batch_cap": 20}), spark=spark)
    assert (narrow.outcome, narrow.batch, narrow.positions) == ("committed", 2, {"0": "70"})
    assert max(int(r.position) for r in dlq_rows(spark, c, p)) >= 70
    clean_up_delta_log(spark, str(c.target_path(p)), lake_checkpoint(spark, c, p).table_version)
    rebuilt = lake_checkpoint(spark, c, p)
    assert (rebuilt.batch, rebuilt.found_in) == (2, "rows")
    assert 50 < int(rebuilt.positions["0"]) + 1 <= 70  # never past what batch 2 read
    drain_until_done(c, p, spark)
    valid, fallback, bad = expected_counts(one, two)
    assert_exactly_once(spark, c, p, valid, fallback, bad)


def test_a_held_partition_commits_nothing_past_its_culprit_so_rows_recovery_cannot_skip_it(tmp_path, cfg, spark):
    """A message left for another attempt holds its partition's checkpoint at its offset. Were the
    rows after it committed, a checkpoint rebuilt from rows (the commit's file cleaned up) would
    start after them, and the held message would be in neither table, with no gap reported."""
    from confluent_kafka import Producer

    _, c, p = make_kafka_pipeline(tmp_path, partitions=1, max_retries=1)
    one = produce(c, p, 100, seed=13)
    poison = next(m for m in generate(p, 50, seed=99, poison_ratio=1.0) if m.kind == "poison")
    producer = Producer(kafka_client_conf(c, p))
    producer.produce(p.source.topic, poison.value, key=poison.partition_key, partition=0)
    producer.flush(30)
    two = produce(c, p, 50, seed=13, start=100)
    first = drain(c, p, spark=spark)
    # left pending: the culprit and the 50 records after it, all read again by the next run
    assert (first.outcome, first.left_pending, first.written, first.positions) == ("committed", 51, 100, {"0": "100"})
    clean_up_delta_log(spark, str(c.target_path(p)), lake_checkpoint(spark, c, p).table_version)
    rebuilt = lake_checkpoint(spark, c, p)
    assert (rebuilt.batch, rebuilt.found_in, rebuilt.positions) == (1, "rows", {"0": "99"})  # next: 100
    summaries = drain_until_done(c, p, spark)
    assert sum(s.written for s in summaries) == 50
    dead = dlq_rows(spark, c, p)
    assert [(r.position, r.error_type) for r in dead] == [("100", "transform")]
    assert_exactly_once(spark, c, p, one.valid_ids + two.valid_ids, 0, {("0", "100")})


@pytest.mark.slow
def test_broker_restart_between_read_and_commit(tmp_path, cfg, spark, kafka_broker, spark_connect_server):
    path, c, p = make_kafka_pipeline(tmp_path, partitions=3)
    result = produce(c, p, 2000, seed=61, malformed_ratio=0.05)
    release = tmp_path / "release"
    run = cli_drain(path, p.name, held_at("before_commit", release), remote=True)
    wait_held(run, (c.dlq_path(p) / "_delta_log").exists, 180, "the held run did not read its range")
    kafka_broker.down()  # the range is read and staged; the commit has not happened
    kafka_broker.up()
    # What the ingest DAG's sensor asks at once, while the restarted broker still loads its groups.
    assert probe(c, p).new == 2000
    assert run.poll() is None, "the broker restart took longer than the pause"
    release.touch()
    out, err = run.communicate(timeout=600)
    assert run.returncode == 0, err[-3000:]
    s = summary_of(out)
    assert s["outcome"] == "committed" and s["acked"] == 2000 and s["error"] is None
    assert group_of(c, p) == {k: int(v) for k, v in end_offsets(c, p).items()}
    drain_until_done(c, p, spark)
    valid, fallback, bad = expected_counts(result)
    assert_exactly_once(spark, c, p, valid, fallback, bad)


def test_claim_notices_move_no_offset_and_a_run_withdraws_only_its_own(tmp_path, cfg):
    path, c, p = make_kafka_pipeline(tmp_path, partitions=2)
    produce(c, p, 200, seed=81)
    conf, group, topic = kafka_client_conf(c, p), p.source.group, p.source.topic
    ends = {part: high for part, (_, high) in watermarks(conf, topic).items()}
    assert min(ends.values()) >= 40
    commit_group_offsets(conf, group, topic, {0: 10})
    announce_claims(conf, group, topic, {0: (20, 40)}, {0: 20}, "run-a")
    announce_claims(conf, group, topic, {1: (0, 30)}, {}, "run-b")  # never committed: the range's start
    got = committed(conf, group, topic, [0, 1])
    assert got[0][0] == 10 and read_notice(got[0][1])["run"] == "run-a" and read_notice(got[0][1])["range"] == [20, 40]
    assert got[1][0] == 0 and read_notice(got[1][1])["range"] == [0, 30]

    st = kafka_counts(conf, p.source, {"0": "20", "1": "0"}, {}, {})
    assert st["partitions"]["0"]["claimed"] == 20 and st["partitions"]["0"]["pending"] == ends[0] - 40
    assert st["partitions"]["1"]["claimed"] == 30 and st["partitions"]["1"]["pending"] == ends[1] - 30
    assert st["CLAIMED"] == 50 and set(st["claimed_by"]) == {"run-a", "run-b"}
    assert st["claimed_by"]["run-a"]["ranges"] == {"0": [20, 40]} and st["claimed_by"]["run-a"]["idle_ms"] >= 0
    assert st["PENDING"] + st["CLAIMED"] == ends[0] - 20 + ends[1]

    withdraw_claims(conf, group, topic, [0, 1], "run-a")
    got = committed(conf, group, topic, [0, 1])
    assert got[0] == (10, None) and read_notice(got[1][1])["run"] == "run-b"
    # The group commit after a batch takes every notice off.
    commit_group_offsets(conf, group, topic, {0: 40, 1: 30})
    assert committed(conf, group, topic, [0, 1]) == {0: (40, None), 1: (30, None)}


@pytest.mark.slow
def test_status_shows_a_running_batchs_ranges_as_claimed_and_a_killed_runs_notices_block_nothing(
        tmp_path, cfg, spark, spark_connect_server):
    # A short execution_timeout: a notice older than that is from a run Airflow would have killed.
    # min_idle_ms above the test's length: the killed run is not counted as dead here (that halves
    # the next run's ranges: test_a_message_that_kills_every_run_...), only shown as stale.
    path, c, p = make_kafka_pipeline(tmp_path, partitions=3, batch_cap=5000, min_idle_ms=600_000,
                                     airflow={"execution_timeout": 15, "max_drain_time": 5})
    result = produce(c, p, 3000, seed=71, malformed_ratio=0.02)
    conf = kafka_client_conf(c, p)
    ends = end_offsets(c, p)
    run = cli_drain(path, p.name, {"DELTADRAIN_PAUSE_AFTER_CLAIM_MS": "120000"}, remote=True)
    st, deadline = None, time.time() + 180
    while time.time() < deadline and run.poll() is None:
        st = kafka_counts(conf, p.source, {}, {}, {})
        if st["CLAIMED"]:
            break
        time.sleep(0.5)
    assert run.poll() is None, run.communicate()[1][-3000:]
    # The running batch: everything is claimed, nothing pending, one run holds every partition's range.
    assert (st["CLAIMED"], st["PENDING"]) == (3000, 0)
    assert {k: v["claimed_range"] for k, v in st["partitions"].items()} == {k: [0, int(v)] for k, v in ends.items()}
    ((run_id, held),) = st["claimed_by"].items()
    assert held["claimed"] == 3000 and held["ranges"] == {k: [0, int(v)] for k, v in ends.items()}
    assert_group_never_leads(spark, c, p)

    run.kill()
    run.communicate(timeout=60)
    # Killed: its notices stay and show their age; a notice is only known stale once it is older
    # than the drain task's execution_timeout ...
    # (First the source's counts alone, read at once: pipeline_status starts Spark jobs, and on a
    # slow machine the notice could be stale before they end.)
    st = mark_stale(kafka_counts(conf, p.source, {}, {}, {}), source_of(p).stale_after_ms(p))
    assert st["claimed_by"][run_id]["idle_ms"] <= 15_000, st
    assert (st["claimed_by"][run_id]["stale"], st["STALE_CLAIMED"]) == (False, 0)
    st = pipeline_status(c, p)
    assert st["CLAIMED"] == 3000 and set(st["claimed_by"]) == {run_id}
    assert st["stale_after_ms"] == 15_000
    time.sleep(max(0.2, (15_000 - st["claimed_by"][run_id]["idle_ms"]) / 1000 + 0.5))
    later = pipeline_status(c, p)
    assert later["claimed_by"][run_id]["idle_ms"] > max(st["claimed_by"][run_id]["idle_ms"], 15_000)
    assert later["claimed_by"][run_id]["stale"] and later["STALE_CLAIMED"] == 3000 and later["CLAIMED"] == 3000
    assert later["dead_runs"] == []  # stale, but younger than min_idle_ms: no drain would count it yet
    # ... and block nothing: the next run reads the same ranges, commits them and takes them off.
    s = drain(c, p, spark=spark)
    assert s.outcome == "committed" and s.claimed == 3000 and s.run_id != run_id
    st = pipeline_status(c, p)
    assert (st["CLAIMED"], st["PENDING"], st["claimed_by"], st["STALE_CLAIMED"]) == (0, 0, {}, 0)
    assert all(v["claimed_range"] is None for v in st["partitions"].values())
    assert group_of(c, p) == {k: int(v) for k, v in ends.items()}
    valid, fallback, bad = expected_counts(result)
    assert_exactly_once(spark, c, p, valid, fallback, bad)


def test_a_run_that_fails_in_its_read_takes_its_claim_notices_off(tmp_path, cfg, spark, monkeypatch):
    import deltadrain.sources.kafka.drain

    path, c, p = make_kafka_pipeline(tmp_path, partitions=2)
    produce(c, p, 100, seed=83)
    conf, group, topic = kafka_client_conf(c, p), p.source.group, p.source.topic
    seen = {}

    def broken(*args, **kwargs):
        deadline = time.monotonic() + 30
        while len(seen) < 2 or any(meta is None for _, meta in seen.values()):  # the notices landed
            assert time.monotonic() < deadline, seen
            seen.update(committed(conf, group, topic, [0, 1]))
        raise RuntimeError("broker lost mid-read")

    monkeypatch.setattr(deltadrain.sources.kafka.drain, "read_ranges", broken)
    with pytest.raises(RuntimeError, match="broker lost mid-read"):
        drain(c, p, spark=spark)
    # During the run both partitions carried its notice; after the failure neither does, and the
    # offsets did not move: everything is PENDING again.
    runs = {read_notice(meta)["run"] for _, meta in seen.values()}
    assert set(seen) == {0, 1} and len(runs) == 1
    assert committed(conf, group, topic, [0, 1]) == {0: (0, None), 1: (0, None)}
    st = kafka_counts(conf, p.source, {}, {}, {})
    assert (st["CLAIMED"], st["PENDING"]) == (0, 100)


@pytest.mark.parametrize("counted", [True, False], ids=["batch_failure", "executor_lost"])
def test_a_run_whose_transform_fails_its_batch_leaves_its_claim_notices_to_be_counted(counted, tmp_path, cfg, spark,
                                                                                      monkeypatch):
    from deltadrain.run.drain import BatchFailure
    from deltadrain.sources.kafka.drain import KafkaDrain

    path, c, p = make_kafka_pipeline(tmp_path, partitions=2)
    produce(c, p, 100, seed=83)
    conf, group, topic = kafka_client_conf(c, p), p.source.group, p.source.topic
    error = BatchFailure("batch 1 failed and no single message explains it") if counted else RuntimeError("lost")

    def broken(self, *args, **kwargs):
        raise error

    monkeypatch.setattr(KafkaDrain, "publish", broken)
    with pytest.raises(type(error)):
        drain(c, p, spark=spark)
    kept = committed(conf, group, topic, [0, 1])
    assert {part: offset for part, (offset, _) in kept.items()} == {0: 0, 1: 0}
    st = kafka_counts(conf, p.source, {}, {}, {})
    if counted:
        # An attempt at its messages, as a redelivery is on Valkey: its notices stay for a later run to count.
        assert all(read_notice(meta) is not None for _, meta in kept.values())
        assert (st["CLAIMED"], st["PENDING"]) == (100, 0)
    else:  # a failure that says nothing about the messages (an executor, storage): withdrawn
        assert all(read_notice(meta) is None for _, meta in kept.values())
        assert (st["CLAIMED"], st["PENDING"]) == (0, 100)


@pytest.mark.slow
def test_a_drain_killed_between_its_refused_dead_letters_and_its_commit_loses_and_duplicates_nothing(
        tmp_path, cfg, spark, spark_connect_server):
    """The refused message's dead letter is written before the commit (the commit moves the checkpoint
    past it), and the run is SIGKILLed there. The next runs read the range again, the constraint
    refuses the same message, and its dead letter stays single: all else lands once."""
    point = "after_refused_dead_letters"
    path, c, p = make_kafka_pipeline(tmp_path, partitions=1, min_idle_ms=0, batch_cap=1000)
    first = produce(c, p, 10, seed=93)
    assert drain(c, p, spark=spark).written == 10
    refused = "evt-93-000000025"
    spark.sql(f"ALTER TABLE delta.`{c.target_path(p)}` ADD CONSTRAINT no_25 CHECK (event_id <> '{refused}')")
    more = produce(c, p, 40, seed=93, start=10)
    proc = cli_drain(path, p.name, {"DELTADRAIN_FAILPOINT": point}, remote=True)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == -9 and fired(point) in err, err[-3000:]
    assert [json.loads(bytes(r.original))["event_id"] for r in dlq_rows(spark, c, p)] == [refused]
    assert len(target_ids(spark, c, p)) == 10
    runs = drain_until_done(c, p, spark)
    assert runs[0].dead_runs, runs[0]  # the killed run counts as an attempt at what it read
    assert_exactly_once(spark, c, p, [i for i in [*first.valid_ids, *more.valid_ids] if i != refused], 0, [("0", "25")])


def test_a_topic_deleted_and_recreated_past_the_checkpoint_stops_the_drain(tmp_path, cfg, spark):
    """The recreated topic's offsets restart at 0 and grow past the lake checkpoint (10). The end
    offset check cannot see that; before, the run read on from offset 10 and skipped the new topic's
    first 10 records in silence. The topic id each commit records tells the two topics apart."""
    from confluent_kafka.admin import AdminClient

    _, c, p = make_kafka_pipeline(tmp_path, partitions=1)
    produce(c, p, 10, seed=91)
    assert drain(c, p, spark=spark).written == 10
    conf, topic = kafka_client_conf(c, p), p.source.topic
    admin = AdminClient(conf)
    admin.delete_topics([topic])[topic].result(30)
    deadline = time.monotonic() + 60
    while True:  # the broker finishes a deletion in the background
        try:
            if topic not in admin.list_topics(timeout=10).topics:
                ensure_topic(conf, topic, 1)
                break
        except Exception as exc:
            if "MARKED_FOR_DELETION" not in str(exc).upper() and "marked for deletion" not in str(exc):
                raise
        assert time.monotonic() < deadline, "the topic was not recreated"
        time.sleep(0.5)
    produce(c, p, 30, seed=91, start=10)
    with pytest.raises(DrainError, match=f"topic '{topic}' was deleted and recreated since the lake checkpoint"):
        drain(c, p, spark=spark)
    assert len(target_ids(spark, c, p)) == 10


def test_a_batch_that_fails_on_no_single_message_is_halved_until_it_commits(tmp_path, cfg, spark):
    """Before, every run read the same range, failed the same way, and took its notices off: the
    pipeline was stuck for good. Now each failed run counts, and the range is halved past the pair."""
    path, c, p = make_kafka_pipeline(tmp_path, partitions=1, min_idle_ms=1000,
                                     transform="tests.integration.pair_transform.fails_on_a_pair")
    result = produce(c, p, 100, seed=87)
    with pytest.raises(DrainError, match="no single message explains it"):
        drain(c, p, spark=spark)
    time.sleep(1.5)  # the failed run's notice is older than min_idle_ms: the next run counts it
    halved = drain(c, p, spark=spark)
    assert (halved.outcome, halved.claimed, halved.written) == ("committed", 50, 50)
    rest = drain(c, p, spark=spark)
    assert (rest.outcome, rest.claimed, rest.written) == ("committed", 50, 50)
    assert_exactly_once(spark, c, p, result.valid_ids, 0, 0)
    assert group_of(c, p) == {"0": 100}


def test_a_field_added_mid_stream_becomes_a_column_in_its_batchs_commit(tmp_path, cfg, spark):
    """schema.evolution add_columns: batch 1 without the new fields; batch 2 adds them (and widens a
    declared int to long) in its own commit, refusing the messages whose new fields cannot be columns
    or lose their batch's vote; batch 3's wrong types are dead letters, the rest lands. Read back once."""
    from confluent_kafka import Producer
    from deltalake import DeltaTable

    fields = {"event_id": "string", "customer": "string", "quantity": "int", "event_time": "timestamp"}
    schema = {"id_field": "event_id", "fields": fields, "required": ["event_id"], "evolution": "add_columns"}
    path, c, p = make_kafka_pipeline(tmp_path, partitions=1, schema=schema, transform=None)
    target = str(c.target_path(p))
    producer = Producer(kafka_client_conf(c, p))

    def send(batch: int, extra: dict[int, dict]) -> list[str]:
        ids = [f"evt-{batch}-{i}" for i in range(10)]
        for i, message_id in enumerate(ids):
            body = {"event_id": message_id, "customer": f"c{i}", "quantity": i, "event_time": "2026-05-01T00:00:00Z",
                    **extra.get(i, {})}
            producer.produce(p.source.topic, json.dumps(body).encode(), partition=0)
        producer.flush(30)
        return ids

    one = send(1, {})
    assert drain(c, p, spark=spark).written == 10
    # The operator widens quantity to long; the producer adds coupon, score, tags and flag.
    data = yaml.safe_load(path.read_text())
    data["pipelines"][0]["schema"]["fields"]["quantity"] = "long"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    c = load_config(path)
    p = c.pipeline(p.name)
    new = {i: {"coupon": f"X{i}", "score": 1.5 if i == 0 else i, "tags": ["a", {"b": 1.10}], "flag": i % 2 == 0}
           for i in range(10)}
    new[1]["quantity"] = 2**40
    new[2]["flag"] = "yes"  # booleans outvote it
    new[3]["_dd_batch"] = 7  # deltadrain's own name
    new[4]["Customer"] = "x"  # differs from a declared name only in case
    two = send(2, new)
    s2 = drain(c, p, spark=spark)
    assert (s2.written, s2.dead_lettered) == (7, 3), s2.line()
    three = send(3, {0: {"coupon": 5}, 1: {"score": 7}, 2: {"flag": None, "tags": "plain"}})
    s3 = drain(c, p, spark=spark)
    assert (s3.written, s3.dead_lettered) == (9, 1), s3.line()
    assert lake_checkpoint(spark, c, p).positions == end_offsets(c, p)  # all 30 read, in three batches

    # The table gained the columns in batch 2's commit, typed as the batch's values were; batch 1's rows are null.
    table = DeltaTable(target)
    rows = {r.event_id: r for r in spark.read.format("delta").load(target).collect()}
    assert sorted(rows) == sorted(one + [two[i] for i in (0, 1, 5, 6, 7, 8, 9)] + three[1:])
    assert {f.name: f.type.type for f in table.schema().fields if not f.name.startswith("_dd_")} == {
        "event_id": "string", "customer": "string", "quantity": "long", "event_time": "timestamp",
        "coupon": "string", "score": "double", "tags": "string", "flag": "boolean"}
    assert all((r.coupon, r.score, r.tags, r.flag) == (None,) * 4 for i, r in rows.items() if i in one)
    assert (rows[two[0]].score, rows[two[1]].quantity, rows[two[0]].tags) == (1.5, 2**40, '["a",{"b":1.1}]')
    assert (rows[three[1]].score, rows[three[2]].flag, rows[three[2]].tags) == (7.0, None, "plain")
    dead = {r.message_id: (r.error_type, r.error) for r in dlq_rows(spark, c, p)}
    assert set(dead) == {two[2], two[3], two[4], three[0]} and {t for t, _ in dead.values()} == {"schema"}
    assert dead[two[2]][1] == "new field 'flag' is boolean in this batch (most of its values are), this message has a string"
    assert "_dd_" in dead[two[3]][1] and "case" in dead[two[4]][1]
    assert dead[three[0]][1] == "field 'coupon' is a string column of the table, got a long (5)"
    assert all(json.loads(r.original)["event_id"] == r.message_id for r in dlq_rows(spark, c, p))

    # The history names the commit that changed the schema: batch 2's, and status says so.
    history = {h["version"]: h for h in table.history()}
    changed = [v for v, h in history.items() if "added_columns" in (h.get("userMetadata") or "")]
    assert len(changed) == 1
    meta = json.loads(history[changed[0]]["userMetadata"])
    assert meta["batch"] == 2 and meta["added_columns"] == {"coupon": "string", "score": "double", "tags": "string",
                                                            "flag": "boolean"}
    assert meta["widened_columns"] == {"quantity": "int -> long"}
    # Strings lost flag's vote, so the batch put its new columns in first, in a commit of their own
    # before its dead letters (a run killed after them leaves the vote's outcome in the table).
    assert history[changed[0] - 1]["operation"] == "ADD COLUMNS"
    before = DeltaTable(target, version=changed[0] - 2).schema()
    assert "coupon" not in {f.name for f in before.fields}
    # The widening's table feature is gone again: delta-rs (the view, status) reads the table.
    assert not (table.protocol().reader_features or [])
    assert [(ch["batch"], ch["table_version"]) for ch in pipeline_status(c, p)["schema_changes"]] == [(2, changed[0])]


@pytest.mark.slow
def test_a_run_killed_after_a_new_fields_vote_leaves_its_losers_dead_and_publishes_no_one_twice(
        tmp_path, cfg, spark, spark_connect_server):
    """A new field has booleans in six messages and strings in four: the strings lose the batch's vote
    and are dead-lettered, and the run is SIGKILLed right after those dead letters. The next run reads
    only the first half of the range (a dead run halves it), where the strings are the majority: it
    must type the field as the killed run did, since the column went into the table before the dead
    letters, so the four stay dead and are never published."""
    from confluent_kafka import Producer

    point = "after_dead_letters"
    schema = {"id_field": "event_id", "fields": {"event_id": "string", "customer": "string"}, "evolution": "add_columns"}
    path, c, p = make_kafka_pipeline(tmp_path, partitions=1, schema=schema, transform=None, min_idle_ms=0)
    producer = Producer(kafka_client_conf(c, p))
    ids = [f"vote-{i}" for i in range(10)]
    for i, message_id in enumerate(ids):
        flag = f"s{i}" if i < 4 else i % 2 == 0
        producer.produce(p.source.topic, json.dumps({"event_id": message_id, "customer": "c", "flag": flag}).encode(),
                         partition=0)
    producer.flush(30)

    proc = cli_drain(path, p.name, {"DELTADRAIN_FAILPOINT": point}, remote=True)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == -9 and fired(point) in err, err[-3000:]
    assert sorted(r.message_id for r in dlq_rows(spark, c, p)) == ids[:4]
    runs = drain_until_done(c, p, spark)
    assert runs[0].dead_runs and runs[0].claimed < 10, runs[0].line()  # the half where strings are the majority

    rows = {r.event_id: r.flag for r in spark.read.format("delta").load(str(c.target_path(p))).collect()}
    assert rows == {i: int(i.split("-")[1]) % 2 == 0 for i in ids[4:]}
    dead = {r.message_id: r.error for r in dlq_rows(spark, c, p)}
    assert sorted(dead) == ids[:4], dead
    assert all("'flag'" in reason and "boolean" in reason for reason in dead.values()), dead
