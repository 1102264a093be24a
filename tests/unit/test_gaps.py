"""The gap decision (deltadrain.sources.valkey.gaps) over the XINFO states a real Valkey 9 showed for each case
(the integration tests in test_valkey_drain.py produce them on a real server)."""

from __future__ import annotations

import json

import pytest

from deltadrain.positions import StreamId as S
from deltadrain.sources.valkey.gaps import (
    LISTED_IDS,
    SEQ_MAX,
    Gap,
    StreamState,
    as_ranges,
    carried_ends,
    count,
    deleted_while_pending,
    predecessor,
    successor,
    unread_gap,
)

NONE = S(0, 0)


def state(length, added, first, last, delivered=NONE, read=None, deleted=NONE, carried=NONE) -> StreamState:
    return StreamState(length=length, entries_added=added, first=first, last=last, max_deleted=deleted,
                       delivered=delivered, entries_read=read, carried=carried)


def test_successor_and_predecessor_carry_over_the_sequence():
    assert successor(S(5, 9)) == S(5, 10) and predecessor(S(5, 10)) == S(5, 9)
    assert successor(S(5, SEQ_MAX)) == S(6, 0) and predecessor(S(6, 0)) == S(5, SEQ_MAX)


def test_trimmed_before_the_group_ever_read_is_a_gap_up_to_the_first_entry_left():
    # 100 appended at 1-0 .. 1-99, MAXLEN 60: 1-40 is the first left; the group is at 0-0 (no counter).
    gap = unread_gap("s", state(60, 100, S(1, 40), S(1, 99)))
    assert gap == Gap("s", "unread", "0-1", "1-39", 40, gap.reason)
    assert "40 entries were removed after 0-0" in gap.reason and "first entry is 1-40" in gap.reason


def test_trimmed_after_the_group_read_part_counts_only_the_unread_ones():
    # The group read 1-0 .. 1-9 (counter 10), then MAXLEN 60 removed 1-0 .. 1-39: 30 were never read.
    gap = unread_gap("s", state(60, 100, S(1, 40), S(1, 99), delivered=S(1, 9), read=10))
    assert (gap.first, gap.last, gap.missing) == ("1-10", "1-39", 30)


def test_trimming_or_deleting_what_the_group_already_read_is_no_gap():
    # Read 30, MAXLEN 50 trimmed only read entries.
    assert unread_gap("s", state(50, 100, S(1, 30), S(1, 99), delivered=S(1, 29), read=30)) is None
    # Read all, acknowledged, XDEL of five of them; then five more appended.
    assert unread_gap("s", state(15, 20, S(1, 0), S(1, 19), delivered=S(1, 19), read=20, deleted=S(1, 7))) is None
    assert unread_gap("s", state(20, 25, S(1, 0), S(2, 4), delivered=S(1, 19), read=20, deleted=S(1, 7))) is None
    # ... or of the last one delivered (max-deleted-entry-id = last-delivered-id), with more after it.
    assert unread_gap("s", state(24, 25, S(1, 0), S(2, 4), delivered=S(1, 19), read=20, deleted=S(1, 19))) is None
    # Read all, every entry trimmed (the stream is empty), then three appended: all three are there.
    assert unread_gap("s", state(0, 10, None, S(1, 9), delivered=S(1, 9), read=10)) is None
    assert unread_gap("s", state(3, 13, S(2, 0), S(2, 2), delivered=S(1, 9), read=10)) is None
    # XDEL of every read entry: the stream is empty and holds nothing unread.
    assert unread_gap("s", state(0, 20, None, S(1, 19), delivered=S(1, 19), read=20, deleted=S(1, 19))) is None


def test_a_stream_emptied_before_the_group_read_it_is_a_gap_up_to_its_last_id():
    gap = unread_gap("s", state(0, 10, None, S(1, 9)))
    assert (gap.first, gap.last, gap.missing) == ("0-1", "1-9", 10) and "the stream is empty" in gap.reason


def test_an_unread_entry_deleted_with_xdel_is_a_gap_of_unknown_size_up_to_the_highest_deleted_id():
    # The group read 1-0 .. 1-4; XDEL of 1-9 and 1-11 (the server reports only the highest).
    gap = unread_gap("s", state(18, 20, S(1, 0), S(1, 19), delivered=S(1, 4), read=5, deleted=S(1, 11)))
    assert (gap.first, gap.last, gap.missing) == ("1-5", "1-11", None) and "XDEL" in gap.reason
    # Its pending entry deleted is not an unread gap (XAUTOCLAIM reports it).
    assert unread_gap("s", state(19, 20, S(1, 0), S(1, 19), delivered=S(1, 9), read=10, deleted=S(1, 4))) is None


def test_trimmed_and_deleted_beyond_the_first_entry_left_is_one_gap_over_both():
    gap = unread_gap("s", state(59, 100, S(1, 40), S(1, 99), delivered=S(1, 9), read=10, deleted=S(1, 50)))
    assert (gap.first, gap.last, gap.missing) == ("1-10", "1-50", 31)


def test_without_a_read_counter_a_trimmed_range_is_a_possible_gap_of_unknown_size():
    gap = unread_gap("s", state(5, 15, S(2, 3), S(2, 7), delivered=S(1, 9)))
    assert (gap.first, gap.last, gap.missing) == ("1-10", "2-2", None) and "may have been" in gap.reason
    # ... but not when nothing was ever removed, nor when the first entry left directly follows.
    assert unread_gap("s", state(15, 15, S(1, 0), S(2, 7), delivered=S(1, 9))) is None
    assert unread_gap("s", state(5, 15, S(1, 10), S(2, 7), delivered=S(1, 9))) is None


def test_ids_compare_as_integer_pairs_not_strings():
    # "5-10" < "5-9" as strings: the first entry left, 5-10, directly follows the delivered 5-9.
    # 5-1 .. 5-9 read, then trimmed.
    assert unread_gap("s", state(3, 12, S(5, 10), S(5, 12), delivered=S(5, 9), read=9)) is None
    gap = unread_gap("s", state(3, 14, S(5, 12), S(5, 14), delivered=S(5, 9), read=9))
    assert (gap.first, gap.last, gap.missing) == ("5-10", "5-11", 2)
    assert unread_gap("s", state(5, 12, S(5, 3), S(5, 14), delivered=S(5, 10), read=10, deleted=S(5, 9))) is None


def test_nothing_after_the_delivered_id_or_nothing_removed_is_no_gap():
    assert unread_gap("s", state(60, 100, S(1, 40), S(1, 99), delivered=S(1, 99), read=100)) is None
    assert unread_gap("s", state(100, 100, S(1, 0), S(1, 99))) is None


def test_state_is_parsed_from_xinfo_replies():
    stream = {"length": 60, "entries-added": 100, "recorded-first-entry-id": b"1-40", "max-deleted-entry-id": b"0-0",
              "last-generated-id": b"1-99", "first-entry": (b"1-40", {b"data": b"x"})}
    group = {"name": b"g", "last-delivered-id": b"1-9", "entries-read": 10, "lag": 90, "pending": 10}
    assert StreamState.of(stream, group) == state(60, 100, S(1, 40), S(1, 99), delivered=S(1, 9), read=10)
    assert StreamState.of(stream, None) == state(60, 100, S(1, 40), S(1, 99))  # the drain creates it at 0-0
    empty = {**stream, "length": 0, "recorded-first-entry-id": b"0-0", "first-entry": None}
    assert StreamState.of(empty, {**group, "entries-read": None}).first is None
    older = {k: v for k, v in stream.items() if k != "recorded-first-entry-id"}
    assert StreamState.of(older, group).first == S(1, 40)


def test_entries_deleted_while_pending_are_one_gap_with_their_ids_in_integer_order():
    gap = deleted_while_pending("s", [b"5-10", b"5-9", b"12-0"])
    assert (gap.kind, gap.first, gap.last, gap.missing, gap.ids) == ("pending", "5-9", "12-0", 3,
                                                                      ("5-9", "5-10", "12-0"))
    assert deleted_while_pending("s", []) is None
    many = deleted_while_pending("s", [f"1-{i}" for i in range(LISTED_IDS + 50)])
    assert many.missing == LISTED_IDS + 50 and len(many.ids) == LISTED_IDS and many.last == f"1-{LISTED_IDS + 49}"


def test_recorded_gaps_are_listed_in_order_and_counted():
    unread = Gap("s:{1}", "unread", "0-1", "1-39", 40, "r")
    unknown = Gap("s:{0}", "unread", "1-10", "1-50", None, "r")
    pending = deleted_while_pending("s:{1}", ["0-5"])
    fields = {g.field: json.dumps(g.as_dict()) for g in (unread, unknown, pending)}
    assert len(fields) == 3  # the same stream's unread and pending gaps never share a field
    ranges = as_ranges(fields)
    assert [(g["partition"], g["from"]) for g in ranges] == [("s:{0}", "1-10"), ("s:{1}", "0-1"), ("s:{1}", "0-5")]
    assert count(ranges) == 40 + 1 + 1  # a range of unknown size counts once


@pytest.mark.parametrize("bad", ["1-x", "", "-1"])
def test_malformed_ids_are_refused(bad):
    with pytest.raises(ValueError):
        deleted_while_pending("s", [bad])


def test_a_gap_is_described_by_its_stream_range_size_and_kind():
    from deltadrain.sources.valkey.gaps import describe_gap

    unread = {"partition": "s:{0}", "kind": "unread", "from": "5-1", "to": "9-0", "missing": 40}
    pending = {"partition": "s:{1}", "kind": "pending", "from": "7-0", "to": "7-0", "missing": 1}
    xdel = {**unread, "missing": None}
    assert describe_gap(unread) == "stream s:{0} ids 5-1 to 9-0 (40 entries, removed before the group read them)"
    assert describe_gap(pending) == "stream s:{1} ids 7-0 to 7-0 (1 entry, deleted while pending)"
    assert "(an unknown number of entries, removed" in describe_gap(xdel)


def test_an_xdel_gap_a_commit_carried_is_not_found_again_but_a_further_deletion_is():
    # 1-0 .. 1-99, 1-80 XDELed; a commit carried the gap up to 1-80, the group has read up to 1-29.
    read_part = dict(delivered=S(1, 29), read=30, deleted=S(1, 80))
    assert unread_gap("s", state(99, 100, S(1, 0), S(1, 99), **read_part)) is not None  # nothing carried
    assert unread_gap("s", state(99, 100, S(1, 0), S(1, 99), **read_part, carried=S(1, 80))) is None
    # 1-90 deleted since: max-deleted-entry-id moved past what was carried.
    gap = unread_gap("s", state(98, 100, S(1, 0), S(1, 99), **{**read_part, "deleted": S(1, 90)}, carried=S(1, 80)))
    assert (gap.first, gap.last, gap.missing) == ("1-30", "1-90", None)
    # A carried end beyond the stream's last id is an earlier stream of that name: it hides nothing.
    assert unread_gap("s", state(9, 10, S(1, 0), S(1, 9), delivered=S(1, 2), read=3, deleted=S(1, 5),
                                 carried=S(5, 0))) is not None


def test_the_carried_ends_are_the_furthest_unread_gap_of_each_stream():
    def g(partition, kind, to):
        return json.dumps({"partition": partition, "kind": kind, "from": "0-1", "to": to, "missing": None})

    carried = {"a": g("s1", "unread", "1-80"), "b": g("s1", "unread", "1-9"), "c": g("s2", "pending", "7-0"),
               "d": g("s3", "unread", "2-10")}
    assert carried_ends(carried) == {"s1": S(1, 80), "s3": S(2, 10)}  # deleted-while-pending ones are not XDEL evidence
