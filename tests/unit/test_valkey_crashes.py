"""Splitting what Valkey runs that died left pending (deltadrain.valkey_crashes): segments, the choice
of what a run reads, and a simulated message that kills every run that reads it. Pure."""

from __future__ import annotations

import pytest

from deltadrain.valkey_crashes import (
    CULPRIT,
    FIRST_HALF,
    HANDED_BACK,
    REST_OF_SPLIT,
    RESTING,
    SUSPECT,
    USED_UP,
    Piece,
    Segment,
    choose,
    first_entries,
    kind_of,
    segments,
)


def ids(stream: str, n: int, start: int = 0) -> list[tuple[str, str]]:
    return [(stream, f"{1000 + i}-0") for i in range(start, start + n)]


def test_segments_are_runs_of_one_kind_and_delivery_count_across_streams():
    entries = [(s, i, 2, SUSPECT) for s, i in ids("a", 3)] + [(s, i, 2, SUSPECT) for s, i in ids("b", 2)]
    entries += [("b", "2000-0", 3, CULPRIT), ("b", "2001-0", 2, SUSPECT), ("b", "2002-0", 2, RESTING)]
    found = list(segments(entries))
    assert [(g.kind, g.deliveries, g.entries) for g in found] == [
        (SUSPECT, 2, 5), (CULPRIT, 3, 1), (SUSPECT, 2, 1), (RESTING, 2, 1)]
    assert found[0].pieces == (Piece("a", "1000-0", "1002-0", 3), Piece("b", "1000-0", "1001-0", 2))
    assert list(segments([])) == []


def test_choose_reads_the_pending_list_no_further_than_the_segment_it_splits():
    def pending():
        yield from [(s, i, 1, SUSPECT) for s, i in ids("a", 3)]
        yield from [(s, i, 2, SUSPECT) for s, i in ids("a", 4, start=3)]
        yield "b", "1-0", 1, SUSPECT  # ends the segment
        raise AssertionError("read past the segment")

    assert choose(segments(pending()), 4).read == (("a", "1003-0", 2),)


def test_a_first_redelivery_is_whole_and_transform_culprits_ride_along():
    """Entries a dead run left, delivered once, are reclaimed whole with new entries (most dead runs
    were not killed by their data); so are transform culprits, whatever their deliveries."""
    once = segments([(s, i, 1, SUSPECT) for s, i in ids("a", 16)])
    assert choose(once, max_attempts=4) is None
    assert choose(segments([("a", "5-0", 3, CULPRIT)]), 4) is None
    assert choose(segments([(s, i, 2, HANDED_BACK) for s, i in ids("a", 9)]), 4) is None
    assert choose([], 4) is None


def test_a_run_reads_the_first_half_of_the_first_twice_delivered_segment_and_nothing_new():
    found = segments([(s, i, 1, SUSPECT) for s, i in ids("a", 4)]
                     + [(s, i, 2, SUSPECT) for s, i in ids("a", 16, start=4)]
                     + [(s, i, 2, SUSPECT) for s, i in ids("b", 5)])
    split = choose(found, max_attempts=4)
    assert split.how == FIRST_HALF and split.marks_rest
    assert split.segment.entries == 21
    assert split.read == (("a", "1004-0", 10),)  # 21 // 2 of the segment, from its first entry
    assert [p["partition"] for p in split.summary()] == ["a", "b"]
    assert {p["read"] for p in split.summary()} == {FIRST_HALF}
    one = choose(segments([("a", "7-0", 2, SUSPECT)]), 4)
    assert one.read == (("a", "7-0", 1),) and one.how == FIRST_HALF


def test_a_rest_is_read_whole_and_a_used_up_segment_whole_as_dead_letters():
    rest = choose(segments([(s, i, 2, RESTING) for s, i in ids("a", 3)] + [(s, i, 3, SUSPECT) for s, i in ids("b", 4)]),
                  4)
    assert (rest.how, rest.read, rest.marks_rest) == (REST_OF_SPLIT, (("a", "1000-0", 3),), False)
    used = choose(segments([(s, i, 4, SUSPECT) for s, i in ids("a", 3)]), 4)
    assert (used.how, used.read, used.marks_rest) == (USED_UP, (("a", "1000-0", 3),), False)


def test_first_entries_spans_streams():
    seg = Segment(SUSPECT, 2, (Piece("a", "1-0", "3-0", 3), Piece("b", "1-0", "9-0", 5)))
    assert first_entries(seg, 5) == (("a", "1-0", 3), ("b", "1-0", 2))
    assert first_entries(seg, 2) == (("a", "1-0", 2),)


def test_kinds():
    assert kind_of("deltadrain-rest", False) == RESTING
    assert kind_of("deltadrain-released", False) == HANDED_BACK  # a clean stop's, not a dead run's
    assert kind_of("drain-x", True) == CULPRIT
    assert kind_of("deltadrain-reaper", False) == SUSPECT


def simulate(n: int, culprit: int, max_retries: int) -> tuple[list[str], set[int]]:
    """The runs a pending list of `n` entries goes through when entry `culprit` kills every run that
    reads it: each run's outcome, and the entries that end as dead letters."""
    max_attempts = max_retries + 1
    deliveries = dict.fromkeys(range(n), 1)  # the first run read them all and died
    holder = dict.fromkeys(range(n), "dead")
    runs, dead = ["killed"], set()
    while deliveries:
        assert len(runs) < 50, runs
        order = sorted(deliveries)
        found = segments(("s", f"{i}-0", deliveries[i], RESTING if holder[i] == "rest" else SUSPECT) for i in order)
        split = choose(found, max_attempts)
        if split is None:  # an ordinary batch: everything reclaimed
            read = order
        else:
            (_, start, count), = split.read
            first = int(start.split("-")[0])
            read = [i for i in order if i >= first][:count]
            if split.marks_rest:
                last = int(split.segment.pieces[-1].last.split("-")[0])
                for i in order:
                    if read[-1] < i <= last:
                        holder[i] = "rest"
        for i in read:
            deliveries[i] += 1
            holder[i] = "dead"
        gone = [i for i in read if deliveries[i] > max_attempts]
        if culprit in read and culprit not in gone:
            runs.append("killed")
            continue
        runs.append(f"{len(read)}:{len(gone)} dead")
        dead |= set(gone)
        for i in read:
            del deliveries[i]
    return runs, dead


@pytest.mark.parametrize("max_retries", [2, 3, 4])
@pytest.mark.parametrize("culprit", [0, 5, 9, 15])
def test_a_message_that_kills_every_run_takes_at_most_cap_over_2_to_the_max_retries_minus_1_with_it(
        culprit, max_retries):
    runs, dead = simulate(16, culprit, max_retries)
    assert culprit in dead
    assert len(dead) <= 16 >> (max_retries - 1)
    assert runs.count("killed") == max_retries + 1  # the culprit's max_retries + 1 deliveries
    assert sum(int(r.split(":")[0]) for r in runs if r != "killed") == 16  # every entry settled once


def test_the_simulated_crasher_of_the_integration_test():
    """test_valkey_drain.py's run list: 16 entries, the sixth kills, max_retries 3."""
    runs, dead = simulate(16, 5, 3)
    assert runs == ["killed", "killed", "killed", "4:0 dead", "killed", "4:4 dead", "8:0 dead"]
    assert dead == {4, 5, 6, 7}
