"""Upsert mode's decisions (`target.mode: upsert`, invariant 2): each key once, in the state of its newest
event. Pure: no Spark, no I/O. This is the specification: the drain makes the same decisions in Spark
(`deltadrain.run.apply_upsert.decide_frame`, held equal to `decide_batch` by a test on random batches), so that
no batch's rows go to the driver (docs/cdc.md, "Upsert decisions").

The rules:
- **Order.** An event's order is its `Order`: the `target.order_by` column's value, then its source
  position (partition, then the position as integers: a stream id's (ms, seq), a Kafka offset's (offset, 0)).
  Under `order_by: position` the value is always None and the position alone orders. Positions order
  events within one partition only: the order of two partitions is a fixed but meaningless one (by the
  partition's name), so a key must stay in one partition (Kafka: the record key decides the partition;
  Valkey: one stream) for `position` ordering to mean anything.
- **Nulls.** A null order_by value is older than every value. An event without a value (a tombstone, a
  delete whose `before` lacks the column, a row with the column null) takes the newest value its key has
  at its position, in the table or earlier in its partition, and its position then puts it after what
  it follows: a tombstone deletes the row it follows, whatever version that row had.
- **Newest per key in a batch.** Of a key's events in one batch only the newest (its greatest order)
  applies, which is the same as applying them one by one in position order.
- **Against the table.** The newest applies only when it is newer than what the table holds for its key:
  an older or equal event (a redelivery, a replayed dead letter, a backfill, a late arrival) changes
  nothing. A delete is remembered (its order and when it was committed) so that an older upsert arriving
  later does not bring the row back; a remembered delete older than `dedup_window` is forgotten, by
  `decide` itself, so that what happens does not hang on when maintenance dropped it.

Where the table's state for a key is kept (the drain's storage), recommended: **a tombstone table beside
the target**, like the DLQ table, and only live rows in the target.
- The target row holds the order of the event it shows: its `_dd_partition`, `_dd_pos_hi`, `_dd_pos_lo`
  (already there) and, under an order_by column, `_dd_order` (the value it was ordered by: inherited
  when its own column is null). `KeyState.row` is read from them.
- The tombstone table holds a row per delete a batch decided (key text, order: value and position, and
  `deleted_at`), appended before the target's commit, as dead letters are written before it. A retry may
  append one again, and a delete older than the key's live row may be there too: neither changes a
  decision, which weighs an event against the live row where there is one (a row is only ever written
  newer than the key's remembered deletes). The drain
  deletes tombstones older than twice `dedup_window` every few batches.
Why: readers of the target (Spark or any other Delta reader) then see exactly the mirror, with no view to
go through and no filter to forget; deleted keys do not grow the target or its MERGE; expiring them is a
DELETE on a small table that never conflicts with the drain's commits. The two commits are safe because
a tombstone is always a real delete from the source: one whose batch did not commit only blocks events
older than it, and `effect` deletes a row that a delete is newer than even when that delete is already
remembered, so the retry still deletes the row. The alternative, deleted rows kept in the target with a
hidden `_dd_deleted` column and a view for readers, makes one commit of everything but shows the deleted
rows to every reader that reads the table rather than the view, and keeps them in the target's files.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, NamedTuple

from deltadrain.formats.changes import DELETE, TRUNCATE
from deltadrain.positions import StreamId


class Position(NamedTuple):
    """Where an event sits: its partition (as the target's `_dd_partition` holds it) and its position as
    integers (`_dd_pos_hi`, `_dd_pos_lo`)."""

    partition: str
    hi: int
    lo: int

    @classmethod
    def parse(cls, partition: str, position: str) -> Position:
        """A stream id `ms-seq` or an offset `n` (as `_dd_position` holds them) in `partition`."""
        at = StreamId.parse(position)
        return cls(partition, at.ms, at.seq)


class Order(NamedTuple):
    value: Any  # the order_by column's value (None under order_by: position, or a null with none to take)
    position: Position


def _rank(order: Order) -> tuple:
    # Nulls first, then the value, then the position breaks a tie.
    return (order.value is not None, order.value, order.position)


def newer(a: Order, b: Order | None) -> bool:
    """Whether `a` is newer than `b` (anything is newer than nothing)."""
    return b is None or _rank(a) > _rank(b)


def _newest(orders: Iterable[Order | None]) -> Order | None:
    best = None
    for order in orders:
        if order is not None and newer(order, best):
            best = order
    return best


@dataclass(frozen=True)
class Event:
    """One change of a key in a batch: an upsert, or a delete (a tombstone, Debezium's op d, delete_when)."""

    key: Hashable  # the key's canonical text (deltadrain.formats.debezium.key_text) or the key columns' values
    position: Position
    delete: bool = False
    value: Any = None  # the order_by column's typed value; None under order_by: position


@dataclass(frozen=True)
class KeyState:
    """What the table holds for a key: the order of its live row, and its remembered delete with the time
    it was committed (both may be there: a key deleted and written again, or a delete whose own commit
    has not happened yet)."""

    row: Order | None = None
    deleted: Order | None = None
    deleted_at: datetime | None = None

    @property
    def newest(self) -> Order | None:
        return _newest((self.row, self.deleted))


class Effect(StrEnum):
    UPSERT = "upsert"  # write the event's row (insert, or replace the key's row)
    DELETE = "delete"  # delete the key's row if there is one, and remember the delete
    NOTHING = "nothing"  # older than or equal to what the table holds


class Decision(NamedTuple):
    event: Event  # the key's newest event in the batch
    order: Order  # its order (its value taken from what it follows when its own is null)
    effect: Effect


def forget(state: KeyState | None, *, now: datetime, window: timedelta) -> KeyState | None:
    """`state` without a remembered delete committed more than `window` before `now` (None when nothing
    is left). A delete without its time is kept: forgetting too early could bring a row back."""
    if state is None or state.deleted is None or state.deleted_at is None or now - state.deleted_at <= window:
        return state
    if state.row is None:
        return None
    return KeyState(row=state.row)


def orders(events: Iterable[Event], state: KeyState | None = None) -> list[tuple[Event, Order]]:
    """A key's events in position order, each with its order. A null value takes the greatest value the
    key has so far: the table's (`state`) or an earlier event's in the batch."""
    known = state.newest if state is not None else None
    carried = known.value if known is not None else None
    out = []
    for event in sorted(events, key=lambda e: e.position):
        value = event.value
        if value is None:
            value = carried
        elif carried is None or value > carried:
            carried = value
        out.append((event, Order(value, event.position)))
    return out


def newest(events: Iterable[Event], state: KeyState | None = None) -> tuple[Event, Order]:
    """A key's newest event in a batch and its order. Two events at the same position are one message
    delivered twice; the first is taken."""
    ordered = orders(events, state)
    if not ordered:
        raise ValueError("a key without events has no newest")
    best = ordered[0]
    for pair in ordered[1:]:
        if newer(pair[1], best[1]):
            best = pair
    return best


def effect(event: Event, order: Order, state: KeyState | None) -> Effect:
    """What a key's newest event does to the table. An upsert applies when newer than everything the
    key holds. A delete applies when newer than the live row (even one whose delete is already
    remembered: that delete's batch did not commit), or, without a row, than the remembered delete."""
    if state is None:
        return Effect.DELETE if event.delete else Effect.UPSERT
    if not event.delete:
        return Effect.UPSERT if newer(order, state.newest) else Effect.NOTHING
    against = state.row if state.row is not None else state.deleted
    return Effect.DELETE if newer(order, against) else Effect.NOTHING


def decide(events: Iterable[Event], state: KeyState | None, *, now: datetime, window: timedelta) -> Decision:
    """One key's decision for a batch: its newest event and what it does, against the table's `state`
    read at `now` (the run's start)."""
    state = forget(state, now=now, window=window)
    event, order = newest(events, state)
    return Decision(event, order, effect(event, order, state))


def decide_batch(events: Iterable[Event], states: Mapping[Hashable, KeyState], *, now: datetime,
                 window: timedelta) -> dict[Hashable, Decision]:
    """Every key's decision for a batch. `states` holds what the table holds for the batch's keys
    (a key it has nothing for is absent)."""
    by_key: dict[Hashable, list[Event]] = {}
    for event in events:
        by_key.setdefault(event.key, []).append(event)
    return {key: decide(group, states.get(key), now=now, window=window) for key, group in by_key.items()}


def after(state: KeyState | None, decision: Decision, *, now: datetime) -> KeyState | None:
    """The key's state once `decision` is committed at `now`: what the drain stores. A remembered delete
    stays until it is forgotten, also under a row written after it; a delete older than the one already
    remembered leaves that one (and its time) in place."""
    if decision.effect == Effect.NOTHING:
        return state
    state = state or KeyState()
    if decision.effect == Effect.UPSERT:
        return replace(state, row=decision.order)
    if newer(decision.order, state.deleted):
        return KeyState(deleted=decision.order, deleted_at=now)
    return replace(state, row=None)


def last_truncates(places: Iterable[Position]) -> dict[str, Position]:
    """Each partition's newest truncate, of the places of a batch's truncates."""
    truncated: dict[str, Position] = {}
    for at in places:
        if at.partition not in truncated or at > truncated[at.partition]:
            truncated[at.partition] = at
    return truncated


def events_of(rows: Iterable[tuple]) -> tuple[list[Event], dict[str, Position]]:
    """(key, change, order value, partition, pos_hi, pos_lo) rows -> (the row changes as upsert Events, each
    partition's newest truncate). A partition's events at or before its truncate are left out: the truncate
    emptied the table after them. The pure form of what `apply_upsert.decide_frame` reads from a batch."""
    rows = list(rows)
    truncated = last_truncates(Position(part, hi, lo) for _k, change, _, part, hi, lo in rows if change == TRUNCATE)
    events = []
    for key, change, value, part, hi, lo in rows:
        at = Position(part, hi, lo)
        if change == TRUNCATE or (part in truncated and at <= truncated[part]):
            continue
        events.append(Event(key, at, delete=change == DELETE, value=value))
    return events, truncated


def state_of(row: Order | None, tombstones: Iterable[tuple[Order, datetime | None]]) -> KeyState:
    """A key's KeyState from its live row's order and its remembered deletes (the newest counts): what
    `apply_upsert.decide_frame` reads from the lake, in pure form."""
    deleted, at = None, None
    for order, when in tombstones:
        if newer(order, deleted):
            deleted, at = order, when
    return KeyState(row=row, deleted=deleted, deleted_at=at)
