"""Kafka offset decisions: range planning, gaps, new partitions, held culprits, message ids. Pure."""

import time
from types import SimpleNamespace

import pytest

from deltadrain.sources.kafka.drain import TOMBSTONE
from deltadrain.sources.kafka.offsets import (
    Gap,
    OffsetError,
    answered_marks,
    claim_notice,
    claimed,
    hold_positions,
    plan_ranges,
    read_notice,
    retry_record,
    same_topic,
)
from tests.support.kafka_rows import TS, ctx, kafka_row


def test_first_run_reads_from_earliest_up_to_the_end_when_under_the_cap():
    plan = plan_ranges({}, {0: (0, 10), 1: (5, 8)}, cap=100)
    assert plan.ranges == {0: (0, 10), 1: (5, 8)} and plan.gaps == [] and plan.total == 13
    assert plan.positions == {"0": "10", "1": "8"}


def test_latest_applies_to_the_first_run_only_new_partitions_start_at_earliest():
    first = plan_ranges({}, {0: (0, 10), 1: (0, 4)}, cap=100, starting="latest")
    assert first.ranges == {} and first.positions == {"0": "10", "1": "4"}
    # Partition 2 appeared after the first commit: its messages are read from its beginning.
    later = plan_ranges({"0": "10", "1": "4"}, {0: (0, 12), 1: (0, 4), 2: (0, 3)}, cap=100, starting="latest")
    assert later.ranges == {0: (10, 12), 2: (0, 3)} and later.positions == {"0": "12", "1": "4", "2": "3"}
    assert later.gaps == []


def test_what_retention_deleted_of_a_partition_added_later_is_a_gap():
    # Partition 2 was added, then the pipeline stood still (paused, or stopped at a gap) past the
    # retention of its first 7 offsets: they were never read, and are reported, not skipped.
    later = plan_ranges({"0": "10", "1": "4"}, {0: (0, 12), 1: (0, 4), 2: (7, 9)}, cap=100)
    assert later.ranges == {0: (10, 12), 2: (7, 9)} and later.gaps == [Gap(2, 0, 7)]
    first = plan_ranges({}, {0: (5, 12)}, cap=100)  # before the pipeline began: not its loss
    assert first.ranges == {0: (5, 12)} and first.gaps == []
    # A checkpoint rebuilt from rows lists only partitions with rows: one without is not new.
    rebuilt = plan_ranges({"0": "10"}, {0: (0, 12), 1: (7, 9)}, cap=100, complete=False)
    assert rebuilt.ranges == {0: (10, 12), 1: (7, 9)} and rebuilt.gaps == []


def test_latest_is_for_a_pipeline_with_no_batch_not_for_a_checkpoint_without_positions():
    marks = {0: (5, 10), 1: (0, 4)}
    assert plan_ranges({}, marks, cap=100, starting="latest", first_run=True).ranges == {}
    # A committed batch whose positions could not be read back (rows recovery of a table that holds no
    # rows yet): every partition is read from its earliest offset, never skipped to the end.
    later = plan_ranges({}, marks, cap=100, starting="latest", first_run=False)
    assert later.ranges == {0: (5, 10), 1: (0, 4)} and later.positions == {"0": "10", "1": "4"}


def test_the_cap_is_spread_so_a_busy_partition_does_not_starve_the_others():
    marks = {0: (0, 1_000_000), **{p: (0, 10) for p in range(1, 6)}}
    plan = plan_ranges({}, marks, cap=1000)
    assert plan.total == 1000
    assert all(plan.ranges[p] == (0, 10) for p in range(1, 6))  # quiet partitions are read whole
    assert plan.ranges[0] == (0, 950)
    assert plan.positions["0"] == "950"


def test_ending_offsets_are_exclusive_and_continue_from_the_checkpoint():
    plan = plan_ranges({"0": "7"}, {0: (0, 9)}, cap=5)
    assert plan.ranges == {0: (7, 9)} and plan.positions == {"0": "9"}
    assert plan_ranges({"0": "9"}, {0: (0, 9)}, cap=5).ranges == {}


def test_retention_gap_is_reported_with_its_range_and_the_read_starts_after_it():
    plan = plan_ranges({"0": "100", "1": "50"}, {0: (250, 300), 1: (40, 60)}, cap=1000)
    assert plan.gaps == [Gap(0, 100, 250)] and plan.gaps[0].size == 150
    assert plan.ranges == {0: (250, 300), 1: (50, 60)}
    assert "[100, 250)" in str(plan.gaps[0]) and plan.gaps[0].as_dict()["missing"] == 150


def test_a_checkpoint_past_the_end_or_a_vanished_partition_stops_the_run():
    with pytest.raises(OffsetError, match="recreated"):
        plan_ranges({"0": "500"}, {0: (0, 10)}, cap=10)
    with pytest.raises(OffsetError, match=r"\['3'\]"):
        plan_ranges({"0": "5", "3": "1"}, {0: (0, 10)}, cap=10)


def test_a_checkpoint_from_a_topic_since_recreated_stops_the_run_even_when_the_new_one_grew_past_it():
    same_topic("orders", "id-a", "id-a")
    same_topic("orders", None, "id-b")  # a checkpoint from before ids were recorded
    same_topic("orders", "id-a", None)  # a broker that cannot say
    with pytest.raises(OffsetError, match=r"topic 'orders' was deleted and recreated .*id-a, now id-b"):
        same_topic("orders", "id-a", "id-b")


def test_a_culprit_holds_its_partition_and_its_attempts_are_kept_until_passed():
    positions = {"0": "100", "1": "40"}
    held = hold_positions(positions, [("0", "57"), ("0", "80")])
    assert held == {"0": "57", "1": "40"}
    record = retry_record({"1:10": {"attempts": 2}}, {("0", "57"): {"attempts": 1}, ("0", "80"): {"attempts": 1}},
                          held)
    # "1:10" is behind partition 1's checkpoint: it was published or dead-lettered, so it drops out.
    assert set(record) == {"0:57", "0:80"}


def test_kafka_rows_ids_from_field_key_header_and_the_offset_fallback():
    row = kafka_row(ctx(), 0, 5, TS, b"k", b'{"event_id": "e1", "amount": 2}', [])
    assert row[:8] == ("0", "5", 5, 0, TS, 3, False, "e1") and row[8] is None and row[-2:] == ("e1", 2.0)
    # id_from: field (the default) has no fallback: a payload without its id is a dead letter.
    missing = kafka_row(ctx(), 0, 6, TS, None, b'{"amount": 2}', [])
    assert missing[7] is None and missing[8] == "missing_id" and "'event_id' is missing" in missing[9]
    assert kafka_row(ctx(id_from="field_or_offset"), 0, 6, TS, None, b'{"amount": 2}', [])[7] == "clicks-0-6"
    key = kafka_row(ctx(id_from="key"), 1, 6, TS, b"from-key", b'{"event_id": "e1", "amount": 2}', [])
    assert key[7] == "from-key" and key[-2] == "from-key"
    assert kafka_row(ctx(id_from="key"), 1, 7, TS, None, b'{"amount": 2}', [])[7] == "clicks-1-7"  # null key
    hdr = ctx(id_from="header", id_header="id")
    assert kafka_row(hdr, 2, 8, TS, None, b'{"amount": 1}', [{"key": "id", "value": b"h-1"}])[7] == "h-1"
    assert kafka_row(hdr, 2, 9, TS, None, b'{"amount": 1}', [{"key": "other", "value": b"x"}])[7] == "clicks-2-9"
    # The configured source wins over the payload's field: without a header the id is the record's place.
    assert kafka_row(hdr, 2, 10, TS, None, b'{"event_id": "e9", "amount": 1}', [])[7] == "clicks-2-10"


def test_a_replayed_copy_without_an_id_of_its_own_takes_the_dead_letters_id():
    # The copy sits at partition 0, offset 90; the dead letter it copies had the id of its place, 3@41.
    copy = b"clicks-3-41"
    offsets = ctx(id_from="field_or_offset")
    assert kafka_row(offsets, 0, 90, TS, None, b'{"amount": 2}', [], copy)[7] == "clicks-3-41"
    assert kafka_row(offsets, 0, 90, TS, None, None, [], copy)[7] == "clicks-3-41"  # a tombstone's too
    # An id of its own wins, and an unreadable or empty replay id is ignored.
    assert kafka_row(offsets, 0, 90, TS, None, b'{"event_id": "e1", "amount": 2}', [], copy)[7] == "e1"
    hdr = ctx(id_from="header", id_header="id")
    assert kafka_row(hdr, 0, 90, TS, None, b'{"amount": 1}', [{"key": "id", "value": b"h-1"}], copy)[7] == "h-1"
    assert kafka_row(hdr, 0, 90, TS, None, b'{"amount": 1}', [], copy)[7] == "clicks-3-41"
    for junk in (b"", b"\xff\xfe"):
        assert kafka_row(offsets, 0, 90, TS, None, b'{"amount": 2}', [], junk)[7] == "clicks-0-90"
    # Under id_from: field a copy without the id field is what its original was: a dead letter.
    assert kafka_row(ctx(), 0, 90, TS, None, b'{"amount": 2}', [], copy)[8] == "missing_id"


def test_kafka_bad_records_become_dead_letters_with_a_reason():
    tomb = kafka_row(ctx(id_from="field_or_offset"), 0, 1, TS, b"k", None, [])
    assert tomb[8:10] == ("tombstone", TOMBSTONE) and tomb[7] == "clicks-0-1"
    assert kafka_row(ctx(), 0, 1, TS, b"k", None, [])[7:10] == (None, "tombstone", TOMBSTONE)
    bad_key = kafka_row(ctx(id_from="key"), 0, 2, TS, b"\xff\xfe", b'{"amount": 1}', [])
    assert bad_key[8] == "invalid_utf8" and "key is not valid UTF-8" in bad_key[9]
    wrong = kafka_row(ctx(), 0, 3, TS, None, b'{"event_id": "e", "amount": "x"}', [])
    assert wrong[8] == "schema" and wrong[10] == b'{"event_id": "e", "amount": "x"}'


def _flaky(errors: list, result="answer"):
    """A broker call that fails with `errors` (KafkaError codes) in turn, then answers."""
    from confluent_kafka import KafkaError, KafkaException

    calls = []

    def call():
        calls.append(1)
        if len(calls) <= len(errors):
            raise KafkaException(KafkaError(errors[len(calls) - 1]))
        return result

    return call, calls


def test_a_broker_that_is_loading_its_groups_is_asked_again_until_it_answers():
    from confluent_kafka import KafkaError

    from deltadrain.sources.kafka.offsets import patiently

    call, calls = _flaky([KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError.NOT_COORDINATOR])
    assert patiently(call, deadline_s=5, pause=0.01) == "answer" and len(calls) == 3


def test_a_lasting_or_real_broker_error_is_raised_not_retried_forever():
    from confluent_kafka import KafkaError, KafkaException

    from deltadrain.sources.kafka.offsets import patiently

    call, calls = _flaky([KafkaError.GROUP_AUTHORIZATION_FAILED])
    with pytest.raises(KafkaException, match="GROUP_AUTHORIZATION_FAILED|[Aa]uthoriz"):
        patiently(call, deadline_s=5, pause=0.01)
    assert len(calls) == 1  # not transient: raised at once
    call, calls = _flaky([KafkaError.NOT_COORDINATOR] * 1000)
    started = time.monotonic()
    with pytest.raises(KafkaException):
        patiently(call, deadline_s=0.3, pause=0.01)
    assert 2 <= len(calls) < 1000 and time.monotonic() - started < 2  # gave up at the deadline


def test_a_per_partition_error_in_a_committed_answer_is_raised():
    from confluent_kafka import KafkaError, KafkaException, TopicPartition

    from deltadrain.sources.kafka.offsets import _checked

    ok = [TopicPartition("t", 0, 5)]
    assert _checked(ok) == ok
    bad = SimpleNamespace(topic="t", partition=1, offset=-1001, error=KafkaError(KafkaError.NOT_COORDINATOR))
    with pytest.raises(KafkaException):
        _checked([*ok, bad])


def test_a_claim_notice_reads_back_and_other_metadata_is_no_notice():
    text = claim_notice("run-1", 20, 40, 1_700_000_000_000)
    assert len(text) < 200  # far under the broker's offset.metadata.max.bytes (4096)
    assert read_notice(text) == {"run": "run-1", "range": [20, 40], "since_ms": 1_700_000_000_000, "width": 20,
                                 "crashes": {}, "earlier": []}
    for other in (None, "", "lag-tool v2", "[1, 2]", '{"deltadrain_claim": 3}', '{"x": {"run": "a"}}',
                  '{"deltadrain_claim": {"run": "a", "range": [1], "since_ms": 0}}',
                  '{"deltadrain_claim": {"run": "a", "range": ["x", 2], "since_ms": 0}}'):
        assert read_notice(other) is None, other


@pytest.mark.parametrize(("lake", "end_offset", "expected"), [
    (20, 100, 20),  # a running batch: its whole range
    (30, 100, 10),  # the lake passed part of it (a newer batch landed): only the rest
    (40, 100, 0),  # its batch landed, the group commit did not (killed after the commit)
    (50, 100, 0),  # further batches landed since
    (20, 35, 15),  # retention or a recreated topic: no more than the topic holds
    (0, 100, 20),  # a notice ahead of the lake (a run that read after a gap): its range only
])
def test_a_notice_claims_only_what_the_lake_has_not_passed(lake, end_offset, expected):
    notice = read_notice(claim_notice("r", 20, 40, 0))
    assert claimed(notice, lake, end_offset) == expected
    assert claimed(None, lake, end_offset) == 0


def test_an_unknown_earliest_offset_is_asked_again_not_taken_for_the_end():
    # A restarted broker may answer -1 for a partition it has not loaded: librdkafka's watermarks then
    # report the end as the earliest, a whole partition that looks deleted by retention.
    marks, unknown = answered_marks({0: -1, 1: 5, 2: 0}, {0: 670, 1: 9, 2: 0})
    assert marks == {1: (5, 9), 2: (0, 0)} and unknown == [0]
    assert answered_marks({0: 3, 1: 0}, {0: 2}) == ({}, [0, 1])  # past the end; no end answer
    # Retention took all of a partition: its earliest is its end, and that is an answer.
    assert answered_marks({0: 670}, {0: 670}) == ({0: (670, 670)}, [])


def test_picks_far_apart_are_read_as_separate_ranges_not_everything_between():
    from deltadrain.sources.kafka.history import pick_rounds

    marks = {0: (100, 10_000_000), 1: (0, 50), 2: (0, 10)}
    picks = [("0", 150), ("0", 120), ("0", 9_000_000), ("0", 5_000_000), ("0", 5_000_010), ("1", 3), ("1", 3),
             ("1", 40), ("2", 12), ("0", 50), ("3", 1)]  # 2:12 past the end, 0:50 and 3 deleted or unknown
    rounds = pick_rounds(picks, marks, span=1000)
    assert rounds == [{0: (120, 151), 1: (3, 41)}, {0: (5_000_000, 5_000_011)}, {0: (9_000_000, 9_000_001)}]
    # Each picked record that retention holds is in exactly one round's range; nothing is read twice.
    held = {(int(p), o) for p, o in picks if int(p) in marks and marks[int(p)][0] <= o < marks[int(p)][1]}
    covered = [(p, o) for r in rounds for p, (lo, hi) in r.items() for o in range(lo, hi) if (p, o) in held]
    assert sorted(covered) == sorted(held)
    assert sum(hi - lo for r in rounds for lo, hi in r.values()) == 31 + 38 + 11 + 1
    assert pick_rounds([("0", 5)], {0: (10, 20)}, span=1000) == []
