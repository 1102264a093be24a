"""The order the suite hands its tests to pytest-xdist's workers in (tests/support/ordering.py)."""

from tests.support.ordering import long_first, share_sizes


def shares(order, workers):
    out, at = [], 0
    for size in share_sizes(len(order), workers):
        out.append(order[at:at + size])
        at += size
    return out


def test_share_sizes_are_worksteals_first_split():
    assert share_sizes(10, 3) == [3, 3, 4] and share_sizes(2, 3) == [0, 1, 1] and share_sizes(7, 1) == [7]


def test_each_share_starts_with_its_long_files_balanced_and_the_rest_keeps_its_order():
    items = [f"a{i}" for i in range(6)] + ["e2e"] + [f"b{i}" for i in range(6)] + ["s3", "avro1", "avro2", "view"]
    seconds = {"e2e": 480, "s3": 440, "avro": 190, "view": 160}
    order = long_first(items, lambda t: t.rstrip("0123456789") if t.startswith("avro") else t, seconds, 3)
    assert sorted(order) == sorted(items)
    first, second, third = shares(order, 3)
    # Longest first to the least loaded share: e2e, s3, then avro and view on the third.
    assert (first[0], second[0], third[:3]) == ("e2e", "s3", ["avro1", "avro2", "view"])
    rest = [t for t in order if not t.startswith(("e2e", "s3", "avro", "view"))]
    assert rest == [t for t in items if t.startswith(("a", "b")) and not t.startswith("avro")]


def test_a_selection_too_small_for_the_shares_puts_the_long_files_first():
    order = long_first(["x", "view", "e2e"], str, {"e2e": 480, "view": 160}, 3)
    assert order == ["e2e", "view", "x"]


def test_one_worker_runs_the_longest_first():
    order = long_first(["x", "view", "y", "e2e"], str, {"e2e": 480, "view": 160}, 1)
    assert order == ["e2e", "view", "x", "y"]
