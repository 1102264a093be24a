"""The upsert decision made on the driver in Arrow (`apply_upsert.newest_arrow`, with the remembered deletes read
by `remembered_arrow` from a tombstone table delta-rs writes) equals its pure specification (`upsert.decide_batch`)
on random batches without live rows: the MERGE weighs the live row (tests/integration/test_upsert_decision.py
runs the whole path on Delta tables with Spark)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from deltadrain.formats.changes import DELETE, UPSERT
from deltadrain.run.apply_upsert import EFFECT, newest_arrow, remembered_arrow
from deltadrain.run.upsert import Effect, Order, Position, decide_batch, events_of, state_of

NOW = datetime(2026, 3, 1, 12, tzinfo=UTC)
WINDOW = timedelta(days=7)


def random_batch(rng: random.Random, ordered: bool, text: bool):
    keys = [f"k{k}" for k in range(40)]
    places = rng.sample([(p, hi, lo) for p in ("a", "b", "c") for hi in range(1, 60) for lo in (0, 1)], 300)

    def value():
        if not ordered:
            return None
        v = rng.randint(1, 8)
        return f"v{v:02d}" if text else v

    events = [(rng.choice(keys), DELETE if rng.random() < 0.3 else UPSERT, value(), *places.pop())
              for _ in range(150)]
    events += rng.sample(events, 10)  # delivered twice in one batch
    rng.shuffle(events)
    ages = (timedelta(hours=1), timedelta(days=6), WINDOW, timedelta(days=8))
    # Remembered deletes may lack an order value, also under an order_by column.
    marks = [(rng.choice(keys), *places.pop(), value() if rng.random() < 0.7 else None, NOW - rng.choice(ages))
             for _ in range(60)]
    return events, marks


@pytest.mark.parametrize(("ordered", "text"), [(False, False), (True, False), (True, True)])
def test_the_decision_on_the_driver_equals_decide_batch(tmp_path, ordered, text):
    import pyarrow as pa
    from deltalake import write_deltalake

    order = pa.string() if text else pa.int64()
    for seed in range(8):
        events, marks = random_batch(random.Random(seed), ordered, text)
        path = str(tmp_path / f"tombstones{seed}")
        write_deltalake(path, pa.table({
            "_dd_key": [m[0] for m in marks], "_dd_partition": [m[1] for m in marks],
            "_dd_pos_hi": pa.array([m[2] for m in marks], pa.int64()),
            "_dd_pos_lo": pa.array([m[3] for m in marks], pa.int64()),
            "_dd_order": pa.array([m[4] for m in marks], order),
            "_dd_deleted_at": pa.array([m[5] for m in marks], pa.timestamp("us", tz="UTC"))}))
        batch = pa.table({"_dd_key": [e[0] for e in events], "_dd_change": [e[1] for e in events],
                          "_dd_order": pa.array([e[2] for e in events], order),
                          "_dd_partition": [e[3] for e in events], "_dd_pos_hi": [e[4] for e in events],
                          "_dd_pos_lo": [e[5] for e in events], "name": [f"{e[0]}@{e[3]}{e[4]}.{e[5]}" for e in events]})
        keys = pa.array(sorted({e[0] for e in events}))
        got = newest_arrow(batch, remembered_arrow(path, keys, order, now=NOW, window=WINDOW,
                                                   key_range=(keys[0].as_py(), keys[-1].as_py())))
        assert got.column_names == [c for c in batch.column_names if c != "_dd_change"] + [EFFECT]
        decided = {r["_dd_key"]: r for r in got.to_pylist()}
        assert len(decided) == got.num_rows

        changes, _ = events_of(events)
        remembered: dict[str, list] = {}
        for m in marks:
            remembered.setdefault(m[0], []).append((Order(m[4], Position(*m[1:4])), m[5]))
        states = {k: state_of(None, v) for k, v in remembered.items()}
        want = decide_batch(changes, states, now=NOW, window=WINDOW)
        newest = {k: d.event for k, d in want.items()}
        # A delete is always kept (the MERGE weighs it against the live row, and it is remembered); an upsert
        # only where decide_batch applies it.
        expected = {k: e for k, e in newest.items() if e.delete or want[k].effect == Effect.UPSERT}
        assert set(decided) == set(expected), seed
        for k, e in expected.items():
            row = decided[k]
            assert (row["_dd_partition"], row["_dd_pos_hi"], row["_dd_pos_lo"]) == tuple(e.position), (seed, k)
            assert row[EFFECT] == (Effect.DELETE.value if e.delete else Effect.UPSERT.value)
        assert any(d.effect == Effect.NOTHING and not d.event.delete for d in want.values())
