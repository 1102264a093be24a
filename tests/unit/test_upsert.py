"""Upsert mode's decisions: the newest event of each key in a batch, against what the table holds, with
deletes remembered for the dedup window; and, over random workloads, that batches, redeliveries and
replays give the table that applying each change once in order gives."""

import random
from datetime import UTC, datetime, timedelta

import pytest

from deltadrain.run.upsert import (
    Decision,
    Effect,
    Event,
    KeyState,
    Order,
    Position,
    after,
    decide,
    decide_batch,
    effect,
    forget,
    newer,
    newest,
    orders,
)

NOW = datetime(2026, 1, 1, tzinfo=UTC)
WEEK = timedelta(days=7)


def at(position: str, partition: str = "0") -> Position:
    return Position.parse(partition, position)


def up(position, value=None, key="k", partition="0") -> Event:
    return Event(key, at(position, partition), delete=False, value=value)


def rm(position, value=None, key="k", partition="0") -> Event:
    return Event(key, at(position, partition), delete=True, value=value)


def order(position, value=None, partition="0") -> Order:
    return Order(value, at(position, partition))


def one(events, state=None, now=NOW, window=WEEK) -> Decision:
    return decide(events, state, now=now, window=window)


# -- order ---------------------------------------------------------------------------------------

def test_positions_compare_as_integers():
    assert newer(order("5-10"), order("5-9"))
    assert newer(order("10-0"), order("9-99"))
    assert newer(order("10"), order("9"))  # Kafka offsets
    assert Position.parse("orders:{3}", "1700000000000-2") == Position("orders:{3}", 1700000000000, 2)


def test_an_order_by_value_wins_over_position_and_a_tie_goes_to_the_later_position():
    assert newer(order("1", value=5), order("9", value=4))
    assert newer(order("9", value=5), order("1", value=5))
    assert not newer(order("1", value=5), order("1", value=5))  # equal is not newer
    assert newer(order("1"), None)


# -- newest per key within a batch ---------------------------------------------------------------

def test_a_key_updated_many_times_in_one_batch_keeps_its_last_update():
    events = [up(f"100-{i}") for i in range(50)]
    random.Random(1).shuffle(events)  # a batch is not in order; the positions are
    got = one(events)
    assert got.event.position == at("100-49") and got.effect == Effect.UPSERT


def test_deleted_then_inserted_again_in_one_batch_is_the_new_row():
    got = one([up("1"), rm("2"), up("3")])
    assert got.event == up("3") and got.effect == Effect.UPSERT
    got = one([up("1"), up("2"), rm("3")])
    assert got.event == rm("3") and got.effect == Effect.DELETE


def test_order_by_a_column_takes_the_greatest_value_not_the_last_position():
    events = [up("1", value=3), up("2", value=9), up("3", value=5)]
    assert one(events).event == up("2", value=9)
    # the same events under order_by: position
    assert one([up("1"), up("2"), up("3")]).event == up("3")


def test_ties_on_the_order_by_column_are_broken_by_position():
    got = one([up("7", value=5), up("3", value=5), up("5", value=5)])
    assert got.event == up("7", value=5) and got.order == order("7", value=5)


def test_one_message_delivered_twice_in_a_batch_counts_once():
    got = one([up("4"), up("4"), up("2")])
    assert got.event == up("4") and got.effect == Effect.UPSERT


def test_across_partitions_the_order_is_fixed_but_not_the_sources():
    # No order exists between partitions; the choice only has to be the same on every run.
    a, b = up("900", partition="0"), up("5", partition="1")
    assert one([a, b]).event == one([b, a]).event == b


def test_batch_decisions_are_per_key():
    events = [up("1", key="a"), rm("2", key="a"), up("3", key="b"), up("4", key="c"), up("5", key="b")]
    states = {"c": KeyState(row=order("9"))}
    got = decide_batch(events, states, now=NOW, window=WEEK)
    assert {k: (d.event.position.hi, d.effect) for k, d in got.items()} == {
        "a": (2, Effect.DELETE), "b": (5, Effect.UPSERT), "c": (4, Effect.NOTHING)}


def test_a_key_without_events_has_no_newest():
    with pytest.raises(ValueError):
        newest([])


# -- against what the table holds ----------------------------------------------------------------

@pytest.mark.parametrize("make", [up, rm], ids=["upsert", "delete"])
def test_an_older_or_equal_event_changes_nothing_and_a_newer_one_applies(make):
    state = KeyState(row=order("5"))
    assert one([make("4")], state).effect == Effect.NOTHING  # a late arrival, a replay, a backfill
    assert one([make("5")], state).effect == Effect.NOTHING  # a redelivery of the row's own event
    assert one([make("6")], state).effect == (Effect.DELETE if make is rm else Effect.UPSERT)


def test_an_event_older_than_the_row_is_ignored_under_an_order_by_column_too():
    state = KeyState(row=order("5", value=10))
    assert one([up("9", value=8)], state).effect == Effect.NOTHING
    assert one([up("9", value=10)], state).effect == Effect.UPSERT  # same version, later position
    assert one([up("2", value=11)], state).effect == Effect.UPSERT  # newer version, earlier position


def test_a_remembered_delete_blocks_an_older_upsert_within_the_window_and_is_forgotten_after():
    state = KeyState(deleted=order("5"), deleted_at=NOW - WEEK)
    assert one([up("3")], state, now=NOW).effect == Effect.NOTHING  # exactly the window: still remembered
    assert one([up("5")], state, now=NOW).effect == Effect.NOTHING
    assert one([up("6")], state, now=NOW).effect == Effect.UPSERT  # newer than the delete: the row is back
    later = NOW + timedelta(microseconds=1)
    assert one([up("3")], state, now=later).effect == Effect.UPSERT
    assert forget(state, now=later, window=WEEK) is None
    assert forget(state, now=NOW, window=WEEK) == state


def test_forgetting_keeps_the_row_and_a_delete_without_its_time():
    state = KeyState(row=order("9"), deleted=order("5"), deleted_at=NOW - 2 * WEEK)
    assert forget(state, now=NOW, window=WEEK) == KeyState(row=order("9"))
    timeless = KeyState(deleted=order("5"))
    assert forget(timeless, now=NOW, window=WEEK) == timeless


def test_a_delete_is_remembered_also_when_there_was_no_row():
    # A delete that arrives before its insert (the insert was a dead letter, replayed later).
    got = one([rm("5")], None)
    assert got.effect == Effect.DELETE
    state = after(None, got, now=NOW)
    assert state == KeyState(deleted=order("5"), deleted_at=NOW)
    assert one([up("3")], state).effect == Effect.NOTHING


def test_a_delete_older_than_a_remembered_one_changes_nothing():
    state = KeyState(deleted=order("8"), deleted_at=NOW)
    assert one([rm("6")], state).effect == Effect.NOTHING
    assert one([rm("8")], state).effect == Effect.NOTHING
    assert one([rm("9")], state).effect == Effect.DELETE


def test_a_retried_delete_still_deletes_a_row_when_it_is_already_remembered():
    # The tombstone was written, the target's commit was not: the retry meets its own delete.
    state = KeyState(row=order("3"), deleted=order("5"), deleted_at=NOW)
    got = one([rm("5")], state)
    assert got.effect == Effect.DELETE
    assert after(state, got, now=NOW + timedelta(hours=1)) == KeyState(deleted=order("5"), deleted_at=NOW)
    # An upsert between the row and that delete is older than the delete: it changes nothing.
    assert one([up("4")], state).effect == Effect.NOTHING


def test_a_key_written_again_after_its_delete_needs_to_be_newer_than_both():
    state = KeyState(row=order("9"), deleted=order("5"), deleted_at=NOW)
    assert one([up("7")], state).effect == Effect.NOTHING
    assert one([rm("7")], state).effect == Effect.NOTHING
    assert one([up("10")], state).effect == Effect.UPSERT


def test_the_state_after_each_effect():
    row = KeyState(row=order("3"))
    upsert = one([up("4")], row)
    assert after(row, upsert, now=NOW) == KeyState(row=order("4"))
    delete = one([rm("5")], row)
    assert after(row, delete, now=NOW) == KeyState(deleted=order("5"), deleted_at=NOW)
    nothing = one([up("1")], row)
    assert after(row, nothing, now=NOW) is row
    remembered = KeyState(deleted=order("5"), deleted_at=NOW)
    assert after(remembered, one([up("6")], remembered), now=NOW) == KeyState(row=order("6"), deleted=order("5"),
                                                                               deleted_at=NOW)


# -- nulls in an order_by column -----------------------------------------------------------------

def test_a_null_order_value_is_older_than_any_value():
    assert newer(order("1", value=0), order("9", value=None))
    assert one([up("1", value=None), up("2", value=1)]).event == up("2", value=1)
    assert one([up("1", value=1), up("2", value=None)], None).order == order("2", value=1)
    state = KeyState(row=order("5", value=None))
    assert one([up("2", value=1)], state).effect == Effect.UPSERT


def test_a_tombstone_deletes_the_row_it_follows_whatever_its_version():
    state = KeyState(row=order("5", value=42))
    got = one([rm("6")], state)  # a tombstone has no payload, so no version
    assert got.order == order("6", value=42) and got.effect == Effect.DELETE
    # and in the same batch as the row it deletes
    got = one([up("5", value=42), rm("6")], None)
    assert got.event == rm("6") and got.effect == Effect.DELETE
    # a version written after it, even a lower one, is newer: the value is what the key had
    assert one([up("7", value=43)], after(state, got, now=NOW)).effect == Effect.UPSERT


def test_an_event_without_a_value_older_than_the_row_changes_nothing():
    state = KeyState(row=order("5", value=42))
    assert one([rm("4")], state).effect == Effect.NOTHING  # a replayed tombstone from before the row
    assert one([up("4", value=None)], state).effect == Effect.NOTHING
    assert one([up("6", value=None)], state).effect == Effect.UPSERT


def test_null_values_take_the_greatest_value_before_them():
    got = orders([up("4", value=None), up("1", value=7), up("3", value=2), up("2", value=None)],
                 KeyState(row=order("0", value=5)))
    assert [(e.position.hi, o.value) for e, o in got] == [(1, 7), (2, 7), (3, 2), (4, 7)]
    assert orders([up("1"), up("2")]) == [(up("1"), order("1")), (up("2"), order("2"))]


def test_the_effect_without_any_state():
    assert effect(up("1"), order("1"), None) == Effect.UPSERT
    assert effect(rm("1"), order("1"), None) == Effect.DELETE
    assert effect(rm("1"), order("1"), KeyState()) == Effect.DELETE


# -- random workloads ----------------------------------------------------------------------------

KEYS = ["a", "b", "c", "d"]


def workload(rng: random.Random, n: int, *, values: str, partitions: int = 1) -> list[Event]:
    """n changes of a few keys in position order; each key stays in its partition. `values`: "none"
    (order_by: position), "rising" (versions that mostly rise, with ties and late ones) or "nulls"
    (as rising, and some events without a version, tombstones among them)."""
    events, version = [], dict.fromkeys(KEYS, 0)
    for i in range(n):
        key = rng.choice(KEYS)
        partition = str(KEYS.index(key) % partitions)
        delete = rng.random() < 0.25
        value = None
        if values != "none":
            version[key] += rng.choice([-2, 0, 1, 1, 2])
            value = version[key]
            if values == "nulls" and rng.random() < 0.3:
                value = None
        events.append(Event(key, Position(partition, 1000 + i // 3, i % 3), delete=delete, value=value))
    return events


def once_in_order(events: list[Event]) -> dict:
    """The table the changes make, applied one at a time in position order: the reference. A key's
    current order is (value, position), nulls first; an event without a value takes the key's."""
    current: dict = {}  # key -> (rank, the event shown, or None when deleted)
    for e in sorted(events, key=lambda e: e.position):
        have = current.get(e.key)
        value = e.value if e.value is not None else (have[0][1] if have else None)
        rank = (value is not None, value, e.position)
        if have is None or rank > have[0]:
            current[e.key] = (rank, None if e.delete else e)
    return {k: shown for k, (_, shown) in current.items() if shown is not None}


def drained(batches: list[list[Event]], now=NOW) -> dict:
    """The table after each batch is decided against it and its decisions applied."""
    states: dict = {}
    rows: dict = {}
    for batch in batches:
        for key, decision in decide_batch(batch, states, now=now, window=WEEK).items():
            states[key] = after(states.get(key), decision, now=now)
            if decision.effect == Effect.UPSERT:
                rows[key] = decision.event
            elif decision.effect == Effect.DELETE:
                rows.pop(key, None)
    return rows


def in_batches(rng: random.Random, events: list[Event], redeliver: bool) -> list[list[Event]]:
    """`events` cut into batches of random sizes; with `redeliver`, batches also carry copies of events
    already delivered (a redelivery after a kill, a reaped claim, a backfill), and some batches come twice
    (a crash after the commit, before the acknowledgement)."""
    batches, done, i = [], [], 0
    while i < len(events):
        size = rng.randrange(1, 12)
        batch = events[i:i + size]
        i += size
        if redeliver and done:
            batch = batch + rng.sample(done, min(len(done), rng.randrange(0, 6)))
            rng.shuffle(batch)
        batches.append(batch)
        if redeliver and rng.random() < 0.2:
            batches.append(list(batch))
        done += batch
    return batches


@pytest.mark.parametrize("values", ["none", "rising", "nulls"])
@pytest.mark.parametrize("partitions", [1, 3])
def test_random_batches_and_redeliveries_give_the_table_of_each_change_applied_once(values, partitions):
    rng = random.Random(f"{values}-{partitions}")
    for _ in range(200):
        events = workload(rng, rng.randrange(1, 60), values=values, partitions=partitions)
        expected = once_in_order(events)
        assert drained([events]) == expected
        assert drained(in_batches(rng, events, redeliver=False)) == expected
        assert drained(in_batches(rng, events, redeliver=True)) == expected


@pytest.mark.parametrize("values", ["none", "rising"])
def test_with_an_order_value_on_every_event_any_delivery_order_gives_the_same_table(values):
    """Replays of old dead letters and backfills deliver changes out of order; when every event has its
    order, what the table shows depends only on which changes arrived, never on when."""
    rng = random.Random(values)
    for _ in range(200):
        events = workload(rng, rng.randrange(1, 60), values=values)
        expected = once_in_order(events)
        shuffled = list(events)
        rng.shuffle(shuffled)
        assert drained(in_batches(rng, shuffled, redeliver=True)) == expected


def test_the_random_workloads_hold_the_cases_that_matter():
    """Guards the tests above: their workloads must delete keys, and let an older version or a null lose."""
    rng = random.Random(0)
    seen = {"deleted at the end": 0, "last change lost": 0, "null took a value": 0}
    for _ in range(200):
        events = workload(rng, 40, values="nulls")
        shown = once_in_order(events)
        last = {e.key: e for e in sorted(events, key=lambda e: e.position)}
        seen["deleted at the end"] += any(k not in shown for k in last)
        seen["last change lost"] += any(not e.delete and shown.get(k) is not e for k, e in last.items())
        seen["null took a value"] += any(e.value is None and o.value is not None for k in last
                                         for e, o in orders([e for e in events if e.key == k]))
    assert min(seen.values()) >= 20, seen
