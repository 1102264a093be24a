"""Splitting what Valkey runs that died left pending (deltadrain.sources.valkey.crashes): segments and the choice
of what a run reads. Pure; the runs a killer goes through are in test_isolation.py."""

from __future__ import annotations

from deltadrain.sources.valkey.crashes import (
    ALONE,
    CULPRIT,
    FIRST_HALF,
    HANDED_BACK,
    REST_OF_SPLIT,
    RESTING,
    SUSPECT,
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

    assert choose(segments(pending())).read == (("a", "1000-0", 1),)


def test_transform_culprits_and_handed_back_entries_ride_along():
    """Transform culprits and entries a run that stopped cleanly handed back are reclaimed whole with
    new entries, whatever their deliveries: no run died on them."""
    assert choose(segments([("a", "5-0", 3, CULPRIT)])) is None
    assert choose(segments([(s, i, 2, HANDED_BACK) for s, i in ids("a", 9)])) is None
    assert choose([]) is None


def test_a_run_reads_the_first_half_of_the_first_suspect_segment_and_nothing_new():
    """A dead run's entries are split from their first redelivery on."""
    found = segments([(s, i, 1, SUSPECT) for s, i in ids("a", 16)]
                     + [(s, i, 1, SUSPECT) for s, i in ids("b", 5)])
    split = choose(found)
    assert split.how == FIRST_HALF and split.marks_rest and split.alone is None
    assert split.segment.entries == 21
    assert split.read == (("a", "1000-0", 10),)  # 21 // 2 of the segment, from its first entry
    assert [p["partition"] for p in split.summary()] == ["a", "b"]
    assert {p["read"] for p in split.summary()} == {FIRST_HALF}
    one = choose(segments([("a", "7-0", 2, SUSPECT)]))
    assert one.read == (("a", "7-0", 1),) and not one.marks_rest and one.alone == ("a", "7-0")
    assert {p["read"] for p in one.summary()} == {ALONE}


def test_a_rest_is_read_whole_and_a_single_rest_entry_alone():
    rest = choose(segments([(s, i, 2, RESTING) for s, i in ids("a", 3)] + [(s, i, 3, SUSPECT) for s, i in ids("b", 4)]))
    assert (rest.how, rest.read, rest.marks_rest, rest.alone) == (REST_OF_SPLIT, (("a", "1000-0", 3),), False, None)
    single = choose(segments([("a", "9-0", 2, RESTING)]))
    assert (single.how, single.alone) == (REST_OF_SPLIT, ("a", "9-0"))


def test_first_entries_spans_streams():
    seg = Segment(SUSPECT, 2, (Piece("a", "1-0", "3-0", 3), Piece("b", "1-0", "9-0", 5)))
    assert first_entries(seg, 5) == (("a", "1-0", 3), ("b", "1-0", 2))
    assert first_entries(seg, 2) == (("a", "1-0", 2),)


def test_kinds():
    assert kind_of("deltadrain-rest", False) == RESTING
    assert kind_of("deltadrain-released", False) == HANDED_BACK  # a clean stop's, not a dead run's
    assert kind_of("drain-x", True) == CULPRIT
    assert kind_of("deltadrain-reaper", False) == SUSPECT
