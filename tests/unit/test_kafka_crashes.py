"""Kafka runs that died reading a range: counting them, bisecting, and when a message is used up. Pure."""

import json
from datetime import UTC, datetime

import pyarrow as pa

from deltadrain.formats.decode import BatchDecoder
from deltadrain.run.isolation import convicted
from deltadrain.sources.kafka.crashes import DeadRuns, bisect, settle, transform_attempts
from deltadrain.sources.kafka.drain import DecodeContext, kafka_batch
from deltadrain.sources.kafka.offsets import claim_notice, read_notice
from tests.support.kafka_rows import CLAIM

MIN_IDLE = 60_000
NOW = 1_800_000_000_000


def notice(run, start, end, age_ms, **carried):
    return read_notice(claim_notice(run, start, end, NOW - age_ms, **carried))


def test_a_dead_runs_notice_counts_once_for_the_offsets_at_and_after_the_checkpoint():
    got = settle(DeadRuns(), [], notice("r1", 0, 16, MIN_IDLE), 0, NOW, MIN_IDLE)
    assert got.record.segments == ((0, 16, 1, NOW - MIN_IDLE),) and got.record.counted == ("r1",)
    assert got.earlier == []
    # The same notice seen again (the counting run died before its own notice landed, but its
    # commit or notice carries the count): not counted twice.
    again = settle(got.record, [], notice("r1", 0, 16, MIN_IDLE + 5), 0, NOW, MIN_IDLE)
    assert again.record.segments == got.record.segments
    # A run that read from an older checkpoint: only what the lake has not passed counts.
    late = settle(DeadRuns(), [], notice("r0", 0, 16, MIN_IDLE), 10, NOW, MIN_IDLE)
    assert late.record.segments == ((10, 16, 1, NOW - MIN_IDLE),)


def test_notices_behind_the_checkpoint_or_of_no_run_count_nothing():
    # Its batch landed (a run killed after its commit, before the group commit), or a newer one did.
    assert not settle(DeadRuns(), [], notice("r1", 0, 16, MIN_IDLE), 16, NOW, MIN_IDLE)
    assert not settle(DeadRuns(), [], notice("r1", 0, 16, MIN_IDLE), 40, NOW, MIN_IDLE)
    assert not settle(DeadRuns(), [], None, 0, NOW, MIN_IDLE)


def test_the_notice_of_the_run_that_committed_the_checkpoint_is_no_dead_run():
    # Killed after its commit with its partition held at a culprit (offset 5): its notice reaches past
    # the checkpoint, but its batch landed.
    assert settle(DeadRuns(), [], notice("r1", 0, 16, MIN_IDLE), 5, NOW, MIN_IDLE).record.counted == ("r1",)
    assert not settle(DeadRuns(), [], notice("r1", 0, 16, MIN_IDLE), 5, NOW, MIN_IDLE, committed_by="r1")


def test_a_young_notice_may_be_a_slow_run_it_is_carried_and_counted_once_old_enough():
    young = settle(DeadRuns(), [], notice("r1", 0, 16, 1_000), 0, NOW, MIN_IDLE)
    assert not young.record and young.earlier == [{"run": "r1", "range": [0, 16], "since_ms": NOW - 1_000, "width": 16}]
    # The next run's notice carried it; that run died too. Later both are old enough: two dead runs.
    later = NOW + MIN_IDLE
    carried = read_notice(claim_notice("r2", 0, 8, NOW, crashes=young.record.as_json(), earlier=young.earlier))
    got = settle(DeadRuns(), [], carried, 0, later, MIN_IDLE)
    assert got.record.segments == ((0, 8, 2, NOW - 1_000), (8, 16, 1, NOW - 1_000))
    assert set(got.record.counted) == {"r1", "r2"} and got.earlier == []
    # Or a run committed r1's range in between (r1 was a slow neighbour): nothing is counted.
    assert not settle(DeadRuns(), young.earlier, None, 16, later, MIN_IDLE)


def test_status_counts_the_notices_own_run_only_once_it_is_stale():
    """A notice older than min_idle_ms may be a long batch still running: the next run counts it (as
    the Valkey reaper takes such entries over), status only once Airflow would have killed that run."""
    carried = DeadRuns().with_dead_run("r1", 0, 16, NOW - 90_000)
    live = notice("r2", 0, 8, 70_000, crashes=carried.as_json())
    assert settle(DeadRuns(), [], live, 0, NOW, MIN_IDLE).record.runs_at(0) == 2
    shown = settle(DeadRuns(), [], live, 0, NOW, MIN_IDLE, notice_after_ms=1_800_000).record
    assert shown.segments == carried.segments
    assert settle(DeadRuns(), [], live, 0, NOW + 1_800_000, MIN_IDLE, notice_after_ms=1_800_000).record.runs_at(0) == 2


def test_the_lake_and_the_notice_merge_by_the_larger_count_per_offset():
    lake = DeadRuns(((0, 16, 1, 5),), ("r1",))
    mine = DeadRuns(((0, 8, 2, 5), (8, 16, 1, 5)), ("r1", "r2"))
    assert lake.merged(mine) == mine.merged(lake) == mine
    assert lake.merged(DeadRuns()).segments == lake.segments


def test_each_dead_run_splits_the_segments_it_read_and_adds_one():
    r = DeadRuns().with_dead_run("a", 16, 32, 100)
    r = r.with_dead_run("b", 16, 24, 200)
    assert r.segments == ((16, 24, 2, 100), (24, 32, 1, 100))
    r = r.with_dead_run("c", 20, 40, 300)
    assert r.segments == ((16, 20, 2, 100), (20, 24, 3, 100), (24, 32, 2, 100), (32, 40, 1, 300))
    assert [r.runs_at(o) for o in (15, 16, 21, 31, 39, 40)] == [0, 2, 3, 2, 1, 0]
    assert r.passed(20).segments == r.segments[1:] and r.passed(40) == DeadRuns()
    assert r.passed(22).segments[0] == (20, 24, 3, 100)  # kept whole: a run from 22 starts inside it
    assert DeadRuns.from_json(json.loads(json.dumps(r.as_json()))) == r


def test_damaged_records_are_no_records():
    for bad in (None, 3, "x", {"seg": [[1, 2]]}, {"seg": "x"}, {"seg": [["a", 2, 1, 0]]}):
        assert DeadRuns.from_json(bad) == DeadRuns(), bad
    # Empty and inverted segments are dropped, the rest kept.
    assert DeadRuns.from_json({"seg": [[5, 5, 1, 0], [9, 4, 1, 0], [1, 2, 0, 0], [2, 3, 1, 0]]}).segments == (
        (2, 3, 1, 0),)


def test_a_run_of_one_offset_that_dies_is_a_death_alone_and_a_commit_forgets_it():
    r = DeadRuns().with_dead_run("a", 16, 32, 100).with_dead_run("b", 16, 17, 200, alone=True)
    assert r.alone == ((16, 1),) and r.alone_at(16) == 1 and r.alone_at(17) == 0
    assert r.with_dead_run("c", 16, 18, 300, alone=True).alone == ((16, 1),)  # two offsets: not alone
    assert r.merged(DeadRuns()).alone == r.alone and DeadRuns().merged(r).alone == r.alone
    assert DeadRuns.from_json(json.loads(json.dumps(r.as_json()))) == r
    assert r.passed(17).alone == ()


def test_a_notice_counts_alone_only_when_its_whole_run_read_one_offset():
    one = settle(DeadRuns(), [], notice("r1", 7, 8, MIN_IDLE, width=1), 7, NOW, MIN_IDLE)
    assert one.record.alone == ((7, 1),)
    # The same range in a run that read other partitions too: no death alone.
    wide = settle(DeadRuns(), [], notice("r1", 7, 8, MIN_IDLE, width=9), 7, NOW, MIN_IDLE)
    assert wide.record.alone == () and wide.record.runs_at(7) == 1
    young = settle(DeadRuns(), [], notice("r1", 7, 8, 1_000, width=1), 7, NOW, MIN_IDLE)
    assert young.earlier[0]["width"] == 1
    later = settle(DeadRuns(), young.earlier, None, 7, NOW + MIN_IDLE, MIN_IDLE)
    assert later.record.alone == ((7, 1),)


def test_bisect_reads_one_partition_half_at_a_time_and_a_crash_unrelated_to_the_data_costs_two_runs():
    lake = DeadRuns().with_dead_run("r1", 0, 16, 0)
    # Partition 1 waits: a run that dies must be counted against the one range it read.
    assert bisect({0: (0, 16), 1: (5, 9)}, {0: lake}) == {0: (0, 8)}
    assert bisect({0: (8, 24)}, {0: lake.passed(8)}) == {0: (8, 16)}  # the rest of it, whole
    assert bisect({0: (16, 32), 1: (5, 9)}, {0: lake.passed(16)}) == {0: (16, 32), 1: (5, 9)}  # then all again
    assert bisect({0: (0, 16)}, {0: DeadRuns(((0, 1, 1, 0),))}) == {0: (0, 1)}  # one message alone
    assert bisect({0: (3, 9), 2: (0, 4)}, {2: DeadRuns(((0, 4, 1, 0),))}) == {2: (0, 2)}


def test_deaths_alone_and_failed_transform_runs_count_together():
    assert not convicted(0, 9, 3)  # no death alone: the transform path decides
    assert not convicted(2, 0, 3) and convicted(3, 0, 3)
    assert not convicted(1, 1, 3) and convicted(1, 2, 3)


def test_a_used_up_message_is_a_max_retries_dead_letter_and_is_not_decoded():
    lake = DeadRuns(((5, 6, 3, 1_700_000_000_000), (6, 7, 3, 1_700_000_000_000)), ("r",), ((5, 2), (6, 2)))
    c = DecodeContext(topic="clicks", fields={"event_id": "string", "amount": "double"}, id_field="event_id",
                      required=["event_id"], max_bytes=1000, id_from="field", id_header=None,
                      dead_runs={0: lake}, max_retries=2)
    decoder = BatchDecoder(fields=c.fields, id_field=c.id_field, required=c.required, max_bytes=c.max_bytes,
                           types={"event_id": pa.string(), "amount": pa.float64()})
    ts = datetime(2026, 1, 1, tzinfo=UTC)
    # Offset 6 is a replayed copy of a dead letter: its replay id header names the original.
    source = pa.RecordBatch.from_pylist(
        [{"partition": 0, "offset": o, "timestamp": ts, "value": b'{"event_id": "e%d", "amount": 1}' % o,
          "replay_id": b"clicks-0-2" if o == 6 else None} for o in (4, 5, 6, 7)],
        schema=pa.schema([("partition", pa.int32()), ("offset", pa.int64()),
                          ("timestamp", pa.timestamp("us", tz="UTC")), ("value", pa.binary()),
                          ("replay_id", pa.binary())]))
    rows = kafka_batch(c, decoder, CLAIM, source).to_pylist()
    assert [r["_dd_attempts"] for r in rows] == [1, 4, 4, 1]
    assert [r["_dd_error_type"] for r in rows] == [None, "max_retries", "max_retries", None]
    # Never decoded, a dead letter's id is unknown; a copy's is the one its replay sent along.
    assert [r["_dd_message_id"] for r in rows[1:3]] == [None, "clicks-0-2"]
    dead = rows[1]
    assert dead["event_id"] is None and dead["_dd_original"] == b'{"event_id": "e5", "amount": 1}'
    assert "every run that read this message alone died before committing: 2 runs" in dead["_dd_error"]
    assert "partition 0 offset 5" in dead["_dd_error"]
    assert dead["_dd_first_failure_at"] == datetime.fromtimestamp(1_700_000_000, UTC)
    assert rows[0]["event_id"] == "e4" and rows[3]["event_id"] == "e7"


def test_a_culprit_after_a_dead_run_gets_all_its_attempts_each_counted_once():
    """A message read by a run that died, then failing the transform of the next run, is held with a
    retry record while the dead run's segment is carried next to the checkpoint: its third read is
    its third attempt (max_retries=2 allows it), not a dead letter counted at four."""
    fields = {"event_id": "string", "amount": "double"}
    decoder = BatchDecoder(fields=fields, id_field="event_id", required=["event_id"], max_bytes=1000,
                           types={"event_id": pa.string(), "amount": pa.float64()})
    source = pa.RecordBatch.from_pylist(
        [{"partition": 0, "offset": 0, "timestamp": datetime(2026, 1, 1, tzinfo=UTC),
          "value": b'{"event_id": "e0", "amount": 1}'}],
        schema=pa.schema([("partition", pa.int32()), ("offset", pa.int64()),
                          ("timestamp", pa.timestamp("us", tz="UTC")), ("value", pa.binary())]))
    lake = DeadRuns(((0, 16, 1, NOW),), ("dead",))

    def read(stored: dict) -> dict:
        c = DecodeContext(topic="clicks", fields=fields, id_field="event_id", required=["event_id"],
                          max_bytes=1000, id_from="field", id_header=None, dead_runs={0: lake}, max_retries=2,
                          attempts=stored)
        return kafka_batch(c, decoder, CLAIM, source).to_pylist()[0]

    second = read({})
    assert second["_dd_attempts"] == 2 and second["_dd_error_type"] is None  # the dead run, then this read
    kept = transform_attempts(second["_dd_attempts"], lake.runs_at(0))  # its transform failed: held
    assert kept == 1
    third = read({(0, 0): kept})
    assert third["_dd_attempts"] == 3 and third["_dd_error_type"] is None and third["event_id"] == "e0"
    # (Should its transform fail again, that third attempt is its last: a `transform` dead letter.)


def test_a_notice_with_a_record_stays_under_the_brokers_metadata_limit():
    r = DeadRuns()
    for i in range(8):
        r = r.with_dead_run(f"worker-host-name-123-45678-{i:08x}", 1_000_000_000 + i, 1_000_200_000, 1_800_000_000_000)
    text = claim_notice("worker-host-name-123-45678-abcdef01", 1_000_000_000, 1_000_200_000, NOW,
                        crashes=r.as_json(), earlier=[{"run": "x" * 37, "range": [1, 2], "since_ms": NOW}] * 4)
    assert len(text) < 4096
    assert read_notice(text)["crashes"] == r.as_json()


def test_a_replayed_copy_carries_the_id_its_original_had_or_would_have_had():
    from deltadrain.config import KafkaSource
    from deltadrain.sources.kafka.drain import REPLAY_ID_HEADER
    from deltadrain.sources.kafka.replay import kafka_copy_identity

    def copy(entry, **source):
        key, headers = kafka_copy_identity(KafkaSource(kind="kafka", topic="clicks", **source), entry)
        return key, dict(headers)

    decoded = {"partition": "2", "position": "40", "message_id": "e1"}
    undecoded = {"partition": "2", "position": "41", "message_id": None}  # dead after max_retries
    key, headers = copy(decoded)
    assert key is None and headers == {"deltadrain-replay-of": b"2@40", REPLAY_ID_HEADER: b"e1"}
    # Sent twice, both copies of an id-less message get its original's place, not their own offsets.
    assert copy(undecoded)[1][REPLAY_ID_HEADER] == b"clicks-2-41"
    assert copy(decoded, id_from="key") == ("e1", {"deltadrain-replay-of": b"2@40", REPLAY_ID_HEADER: b"e1"})
    assert copy(decoded, id_from="header", id_header="x-id")[1]["x-id"] == b"e1"
    assert copy(undecoded, id_from="key") == (None, {"deltadrain-replay-of": b"2@41",
                                                      REPLAY_ID_HEADER: b"clicks-2-41"})
