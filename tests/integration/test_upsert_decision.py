"""Upsert mode's decisions in Spark equal their pure specification (`upsert.decide_batch`) on many random batches,
decided in one Spark job per case: every trial's keys and partitions carry the trial's number, so the trials
cannot touch each other. The batches hold keys changed many times, deletes and inserts again, redeliveries of what
the table holds, older events, null order values, exact duplicates, and remembered deletes inside and outside the
dedup window; a second case holds truncates. `apply_upsert.decide_frame` is compared decision by decision;
`apply_upsert.newest_frame`, which leaves the weighing against the live row to the MERGE, by the target and
tombstone tables its MERGE and append leave."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from deltadrain.formats.changes import DELETE, TRUNCATE, UPSERT
from deltadrain.lake.delta import ensure_table, merge_into
from deltadrain.run.apply_upsert import (
    decide_frame,
    expire_tombstones,
    key_ranges,
    merge_clauses,
    merge_condition,
    newest_frame,
    prepare_on_driver,
    survey,
    tombstone_schema,
    write_tombstones,
)
from deltadrain.run.upsert import (
    Effect,
    Order,
    Position,
    after,
    decide_batch,
    events_of,
    last_truncates,
    newer,
    state_of,
)

NOW = datetime(2026, 3, 1, 12, tzinfo=UTC)
WINDOW = timedelta(days=7)
EVENTS = "_dd_key string, _dd_change string, _dd_order long, _dd_partition string, _dd_pos_hi long, " \
         "_dd_pos_lo long, name string"
ROWS = "_dd_key string, _dd_partition string, _dd_pos_hi long, _dd_pos_lo long, _dd_order long"
MARKS = f"{ROWS}, _dd_deleted_at timestamp"


def value(rng: random.Random):
    return None if rng.random() < 0.3 else rng.randint(1, 6)


def trial(rng: random.Random, t: int, truncates: bool):
    """One batch: (event rows, the target's rows, the tombstones), in the columns the tables have."""
    parts = [f"{t}/a", f"{t}/b"]
    keys = [f"{t}:{k}" for k in range(rng.randint(1, 4))]
    places = rng.sample([(p, hi, lo) for p in parts for hi in range(1, 16) for lo in (0, 1)], 24)
    rows, marks, events = [], [], []
    for key in keys:
        if rng.random() < 0.5:
            rows.append((key, *places.pop(), value(rng)))
        for _ in range(rng.choice((0, 0, 1, 2, 3))):
            ago = rng.choice((timedelta(hours=1), timedelta(days=6), WINDOW, timedelta(days=8), timedelta(days=30)))
            marks.append((key, *places.pop(), value(rng), NOW - ago))
    for _ in range(rng.randint(1, 12)):
        key = rng.choice(keys)
        change = DELETE if rng.random() < 0.3 else UPSERT
        events.append((key, change, value(rng), *places.pop()))
    held = [r for r in rows if rng.random() < 0.5]  # redeliveries of the events the table holds
    events += [(r[0], UPSERT, r[4], *r[1:4]) for r in held]
    events += rng.sample(events, min(2, len(events)))  # a message delivered twice in one batch
    if truncates:
        for _ in range(rng.choice((0, 1, 1, 2))):
            events.append((f"db.public.t{t} at lsn {rng.randint(1, 99)}", TRUNCATE, None, *places.pop()))
    rng.shuffle(events)
    return [(*e, f"{e[0]}@{e[3]}:{e[4]}.{e[5]}") for e in events], rows, marks


def expected(events, rows, marks) -> dict:
    """What decide_batch says changes, as (place, effect, kept order value, name) per key."""
    changes, truncated = events_of(e[:6] for e in events)
    states = {}
    if not truncated:
        held = {r[0]: Order(r[4], Position(*r[1:4])) for r in rows}
        remembered: dict[str, list] = {}
        for m in marks:
            remembered.setdefault(m[0], []).append((Order(m[4], Position(*m[1:4])), m[5]))
        states = {k: state_of(held.get(k), remembered.get(k, ())) for k in set(held) | set(remembered)}
    decided = decide_batch(changes, states, now=NOW, window=WINDOW)
    return {k: ((*d.event.position,), d.effect.value, d.order.value, f"{k}@{d.event.position.partition}:"
                f"{d.event.position.hi}.{d.event.position.lo}")
            for k, d in decided.items() if d.effect != Effect.NOTHING}


def decided_in_spark(spark, events, rows, marks, *, with_lake: bool) -> dict:
    frame = spark.createDataFrame(events, EVENTS)
    seen = survey(frame)
    truncated = last_truncates(at for _, at in seen.truncates)
    target = spark.createDataFrame(rows, ROWS) if with_lake else None
    tombstones = spark.createDataFrame(marks, MARKS) if with_lake else None
    got = decide_frame(frame, target, tombstones, now=NOW, window=WINDOW, truncated=truncated,
                       key_range=seen.key_range).collect()
    assert len(got) == len({r["_dd_key"] for r in got}), "a key decided twice"
    assert "_dd_change" not in got[0].asDict() if got else True
    return {r["_dd_key"]: ((r["_dd_partition"], r["_dd_pos_hi"], r["_dd_pos_lo"]), r["_dd_effect"], r["_dd_order"],
                           r["name"]) for r in got}


def batches(seed: int, n: int, truncates: bool):
    rng = random.Random(seed)
    events, rows, marks = [], [], []
    for t in range(n):
        e, r, m = trial(rng, t, truncates)
        events += e
        rows += r
        marks += m
    return events, rows, marks


def test_the_spark_decision_equals_decide_batch_on_random_batches(spark):
    events, rows, marks = batches(7, 400, truncates=False)
    want = expected(events, rows, marks)
    got = decided_in_spark(spark, events, rows, marks, with_lake=True)
    assert got == want
    # The cases the batches must hold for the comparison to mean anything.
    effects = [w[1] for w in want.values()]
    assert effects.count("delete") > 20 and effects.count("upsert") > 100
    assert len(want) < len({e[0] for e in events}) - 50, "too few events that change nothing"
    assert any(w[2] is None for w in want.values()) and any(w[2] is not None for w in want.values())


def test_the_spark_decision_after_a_truncate_equals_decide_batch(spark):
    """A batch with a truncate is decided without the lake's state, and drops its partition's events up to it."""
    events, rows, marks = batches(11, 200, truncates=True)
    by_trial: dict[str, list] = {}
    for e in events:
        by_trial.setdefault(e[3].split("/")[0], []).append(e)
    # decide_batch takes one batch at a time: each trial's truncates reach only its own partitions.
    want: dict = {}
    for group in by_trial.values():
        if any(e[1] == TRUNCATE for e in group):
            want.update(expected(group, [], []))
    cut = [e for group in by_trial.values() if any(e[1] == TRUNCATE for e in group) for e in group]
    got = decided_in_spark(spark, cut, [], [], with_lake=False)
    assert got == want and len(want) > 50
    assert len(cut) > len(want) + 100, "too few events a truncate left out"


def states_of(rows, marks) -> dict:
    held = {r[0]: Order(r[4], Position(*r[1:4])) for r in rows}
    remembered: dict[str, list] = {}
    for m in marks:
        remembered.setdefault(m[0], []).append((Order(m[4], Position(*m[1:4])), m[5]))
    return {k: state_of(held.get(k), remembered.get(k, ())) for k in set(held) | set(remembered)}


@pytest.mark.parametrize("where", ["spark", "driver"])
@pytest.mark.parametrize("order_by", ["position", "version"])
def test_the_merge_that_weighs_against_the_live_row_leaves_what_decide_batch_says(spark, tmp_path, order_by, where):
    """`newest_frame` (or on the driver `newest_arrow`, through `prepare_on_driver`), its tombstones appended and
    its MERGE run on real Delta tables: every key's live row is the one `decide_batch` and `after` say, and
    every key without one has the newest remembered delete they say. Under `order_by: position` no order has a
    value; under a column every event has one (an event without one is decided by `decide_frame`), while rows
    and remembered deletes may lack it."""
    from pyspark.sql.types import LongType

    events, rows, marks = batches(13, 300, truncates=False)
    if order_by == "position":
        events = [(*e[:2], None, *e[3:]) for e in events]
        rows = [(*r[:4], None) for r in rows]
        marks = [(*m[:4], None, m[5]) for m in marks]
    else:
        events = [e for e in events if e[2] is not None]
    target, tombstones = str(tmp_path / "target"), str(tmp_path / "tombstones")
    spark.createDataFrame([(*r, f"{r[0]}@held") for r in rows], f"{ROWS}, name string") \
        .write.format("delta").save(target)
    spark.createDataFrame([(*m, 0, "before") for m in marks], tombstone_schema(LongType())) \
        .write.format("delta").save(tombstones)
    frame = spark.createDataFrame(events, EVENTS)
    seen = survey(frame)
    assert not seen.unordered or order_by == "position"
    if where == "driver":
        prepared = prepare_on_driver(spark, frame, target=target, tombstones=tombstones, batch=1, run_id="run",
                                     now=NOW, window=WINDOW, key_range=seen.key_range)
        assert prepared is not None
        merge_into(spark, target, prepared.source, prepared.condition, prepared.clauses)
    else:
        decided = newest_frame(frame, spark.read.format("delta").load(tombstones), now=NOW, window=WINDOW,
                               key_range=seen.key_range).persist()
        write_tombstones(spark, tombstones, decided, LongType(), batch=1, run_id="run", now=NOW)
        # The ON condition with the batch's keys in several ranges, as a large target's MERGE has it.
        ranges = key_ranges(sorted({e[0] for e in events}), 4)
        assert len(ranges) == 4
        merge_into(spark, target, decided, merge_condition(seen.key_range, False, ranges),
                   merge_clauses(decided.columns, False, weigh=True))
        decided.unpersist()

    changes, _ = events_of(e[:6] for e in events)
    states = states_of(rows, marks)
    decisions = decide_batch(changes, states, now=NOW, window=WINDOW)
    want_rows, want_marks = {}, {}
    for key in set(states) | set(decisions):
        state = states.get(key)
        if key in decisions:
            state = after(state, decisions[key], now=NOW)
        if state is not None and state.row is not None:
            want_rows[key] = state.row
        elif state is not None and state.deleted is not None:
            want_marks[key] = state.deleted
    names = {Order(e[2], Position(*e[3:6])): e[6] for e in events} | \
        {Order(r[4], Position(*r[1:4])): f"{r[0]}@held" for r in rows}
    got_rows = {r[0]: (Order(r[4], Position(*r[1:4])), r[5])
                for r in spark.read.format("delta").load(target).collect()}
    assert got_rows == {k: (o, names[o]) for k, o in want_rows.items()}
    got_marks: dict[str, Order] = {}
    for m in spark.read.format("delta").load(tombstones).collect():
        at = Order(m[4], Position(*m[1:4]))
        if newer(at, got_marks.get(m[0])):
            got_marks[m[0]] = at
    assert {k: got_marks.get(k) for k in want_marks} == want_marks
    # The cases the batches must hold for the comparison to mean anything.
    effects = [d.effect for d in decisions.values()]
    assert effects.count(Effect.DELETE) > 20 and effects.count(Effect.UPSERT) > 60
    assert effects.count(Effect.NOTHING) > 30


def test_tombstones_older_than_two_windows_are_dropped_and_the_rest_kept(spark, tmp_path):
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType

    path = str(tmp_path / "tombstones")
    ensure_table(spark, path, tombstone_schema(LongType()))
    ages = {"new": timedelta(hours=1), "one window": WINDOW + timedelta(days=1), "two windows": 2 * WINDOW,
            "older": 2 * WINDOW + timedelta(seconds=1)}
    spark.createDataFrame([(k, "0", i, 0, None, NOW - age, 1, "run") for i, (k, age) in enumerate(ages.items())],
                          tombstone_schema(LongType())).write.format("delta").mode("append").save(path)
    expire_tombstones(spark, path, now=NOW, window=WINDOW)
    left = {r[0] for r in spark.read.format("delta").load(path).select(F.col("_dd_key")).collect()}
    assert left == {"new", "one window", "two windows"}


def test_a_tombstone_table_the_driver_creates_is_one_spark_reads_appends_to_and_expires(spark, tmp_path):
    """`append_tombstones` (delta-rs) creates a missing table with `tombstone_schema`'s columns; a larger batch's
    Spark append (`write_tombstones`) and the expiry's DELETE work on it, and delta-rs appends after them."""
    import pyarrow as pa
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType

    from deltadrain.run.apply_upsert import EFFECT, append_tombstones

    path = str(tmp_path / "tombstones")

    def deletes(keys):
        return pa.table({"_dd_key": keys, "_dd_partition": ["0"] * len(keys),
                         "_dd_pos_hi": pa.array(range(len(keys)), pa.int64()), "_dd_pos_lo": [0] * len(keys),
                         "_dd_order": pa.array([None] * len(keys), pa.int64())})

    append_tombstones(spark, path, deletes(["old"]), LongType(), batch=1, run_id="r1", now=NOW - 3 * WINDOW)
    table = spark.read.format("delta").load(path)
    assert [(f.name, f.dataType) for f in table.schema] == [(f.name, f.dataType) for f in tombstone_schema(LongType())]
    decided = spark.createDataFrame([("spark", "0", 5, 0, None, "delete")],
                                    f"{ROWS}, {EFFECT} string")
    write_tombstones(spark, path, decided, LongType(), batch=2, run_id="r2", now=NOW)
    expire_tombstones(spark, path, now=NOW, window=WINDOW)
    append_tombstones(spark, path, deletes(["new"]), LongType(), batch=3, run_id="r3", now=NOW)
    got = spark.read.format("delta").load(path).select("_dd_key", "_dd_batch", "_dd_deleted_at")
    assert sorted((r[0], r[1]) for r in got.collect()) == [("new", 3), ("spark", 2)]
    assert got.where(F.col("_dd_deleted_at") == F.lit(NOW)).count() == 2


def test_the_driver_reads_a_batch_staged_here_as_the_rows_spark_makes_of_it(spark, tmp_path):
    """`target_arrow` over a batch staged in this process (`Staged.table`, read by pyarrow) gives what `target_rows`
    gives over the same staged files in Spark: the same columns in the same order, types and values, the dead
    letters and gap markers left out. Payload names that need quoting and every column kind an upsert claim
    has are in it."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import _parse_datatype_string

    from deltadrain.run.rows import split_claimed, target_arrow, target_rows
    from deltadrain.run.stage import stage_batches

    schema = _parse_datatype_string(
        "_dd_partition string, _dd_position string, _dd_pos_hi long, _dd_pos_lo long, _dd_source_ts timestamp, "
        "_dd_attempts int, _dd_reclaimed boolean, _dd_message_id string, _dd_error_type string, _dd_error string, "
        "_dd_original binary, _dd_first_failure_at timestamp, id long, `a.b` string, at timestamp, price double, "
        "gone boolean, _dd_key string, _dd_change string, _dd_order long")
    rng = random.Random(7)
    rows = []
    for i in range(200):
        error = rng.choice([None] * 6 + ["invalid_json", "gap"])
        rows.append((str(i % 3), str(i), i, 0, NOW - timedelta(seconds=i), 1, i % 5 == 0, f"m{i}", error,
                     "why" if error else None, b"raw" if error else None, None, value(rng), rng.choice(["x", None]),
                     rng.choice([NOW, None]), rng.choice([1.5, None]), rng.choice([True, False, None]),
                     f"k{i % 17}", rng.choice([UPSERT, DELETE]), value(rng)))
    claimed = spark.createDataFrame(rows, schema).toArrow()

    def produce(batches, arrow_schema):
        for b in batches:
            yield pa.RecordBatch.from_arrays([b.column(f.name).cast(f.type) for f in arrow_schema], schema=arrow_schema)

    staged = stage_batches(iter(claimed.to_batches(max_chunksize=64)), produce, schema, "_dd_key", str(tmp_path / "s"))
    assert staged.here and staged.total.rows == 200
    when = NOW + timedelta(minutes=1)
    in_spark = target_rows(split_claimed(staged.rows(spark))[0], None, 4, "run-4", when)
    expected = in_spark.toArrow()
    got = target_arrow(staged, 4, "run-4", when).cast(to_arrow_schema(in_spark.schema))
    assert got.schema == expected.schema
    assert got.num_rows == sum(r[8] is None for r in rows)
    assert got.sort_by("_dd_position").to_pylist() == expected.sort_by("_dd_position").to_pylist()
