"""Upsert mode's commit (`target.mode: upsert`, docs/cdc.md): a batch's events -> each key's newest change
(deltadrain.run.upsert decides), applied to the target in the batch's one MERGE commit, with the positions and
the batch number as in insert mode (deltadrain.run.commit).

What the table holds for a key is read from the lake at the start of the commit: its live row's order from the
target (`_dd_partition`, `_dd_pos_hi`, `_dd_pos_lo`, `_dd_order`), its remembered delete from the tombstone table
beside it (`<lake>/_deltadrain/tombstones/<pipeline>`). The deletes a batch applies are MERGEd into the tombstone
table first, insert-only on (key, partition, position), as dead letters are: a run killed after it and before the
target's commit only repeats it, and the retry still deletes the row (`upsert.effect`). The same MERGE drops the
tombstones remembered longer than twice `dedup_window`, so the table stays small (`upsert.decide` forgets them
after one window whatever the table keeps).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from datetime import UTC, datetime, timedelta

from deltadrain.formats.changes import CHANGE, DELETE, KEY, ORDER, TRUNCATE
from deltadrain.formats.debezium import truncate_line
from deltadrain.lake.delta import ensure_table, is_table, merge_into, retry_conflicts, sql_literal, sql_name
from deltadrain.run.upsert import Decision, Effect, Event, KeyState, Order, Position, decide_batch, newer

EFFECT = "_dd_effect"
PLACE = ("_dd_partition", "_dd_pos_hi", "_dd_pos_lo")
DELETED_AT = "_dd_deleted_at"
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class TruncateRefused(Exception):
    """A batch holds a truncate and the pipeline's target.on_truncate is fail: the message is the one line."""


def events_of(rows: Iterable[tuple]) -> tuple[list[Event], dict[str, Position]]:
    """(key, change, order value, partition, pos_hi, pos_lo) rows -> (the row changes as upsert Events, each
    partition's newest truncate). A partition's events at or before its truncate are left out: the truncate
    emptied the table after them."""
    rows = list(rows)
    truncated: dict[str, Position] = {}
    for _key, change, _, part, hi, lo in rows:
        if change == TRUNCATE:
            at = Position(part, hi, lo)
            if part not in truncated or at > truncated[part]:
                truncated[part] = at
    events = []
    for key, change, value, part, hi, lo in rows:
        at = Position(part, hi, lo)
        if change == TRUNCATE or (part in truncated and at <= truncated[part]):
            continue
        events.append(Event(key, at, delete=change == DELETE, value=value))
    return events, truncated


def state_of(row: Order | None, tombstones: Iterable[tuple[Order, datetime | None]]) -> KeyState:
    """A key's KeyState from its live row's order and its remembered deletes (the newest counts)."""
    deleted, at = None, None
    for order, when in tombstones:
        if newer(order, deleted):
            deleted, at = order, when
    return KeyState(row=row, deleted=deleted, deleted_at=at)


def applied(decisions: dict[Hashable, Decision]) -> dict[Hashable, Decision]:
    """The decisions that change the table (an older or equal event changes nothing)."""
    return {k: d for k, d in decisions.items() if d.effect != Effect.NOTHING}


def tombstone_schema(order_type) -> object:
    from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

    return StructType([StructField(KEY, StringType(), False), StructField("_dd_partition", StringType(), False),
                       StructField("_dd_pos_hi", LongType(), False), StructField("_dd_pos_lo", LongType(), False),
                       StructField(ORDER, order_type, True), StructField(DELETED_AT, TimestampType(), False),
                       StructField("_dd_batch", LongType(), True), StructField("_dd_run_id", StringType(), True)])


def read_states(spark, target: str, tombstones: str, keys: list[str]) -> dict[str, KeyState]:
    """What the target and the tombstone table hold for `keys`: two reads joined to the batch's keys."""
    from pyspark.sql import functions as F

    if not keys:
        return {}
    wanted = F.broadcast(spark.createDataFrame([(k,) for k in keys], f"{KEY} string"))
    rows: dict[str, Order] = {}
    if is_table(spark, target):
        for r in spark.read.format("delta").load(target).join(wanted, KEY).select(KEY, *PLACE, ORDER).collect():
            rows[r[0]] = Order(r[4], Position(r[1], r[2], r[3]))
    marks: dict[str, list[tuple[Order, datetime | None]]] = {}
    if is_table(spark, tombstones):
        # As microseconds: Spark gives timestamps back naive, in the session's time zone.
        for r in (spark.read.format("delta").load(tombstones).join(wanted, KEY)
                  .select(KEY, *PLACE, ORDER, F.unix_micros(DELETED_AT)).collect()):
            at = EPOCH + timedelta(microseconds=r[5]) if r[5] is not None else None
            marks.setdefault(r[0], []).append((Order(r[4], Position(r[1], r[2], r[3])), at))
    return {k: state_of(rows.get(k), marks.get(k, ())) for k in set(rows) | set(marks)}


def write_tombstones(spark, path: str, decisions: dict[Hashable, Decision], order_type, *, batch: int, run_id: str,
                     now: datetime, window: timedelta) -> None:
    """Remember the batch's deletes (insert-only on key and place), and forget those older than two windows."""
    from pyspark.sql import functions as F

    schema = tombstone_schema(order_type)
    ensure_table(spark, path, schema)
    rows = [(str(k), d.order.position.partition, d.order.position.hi, d.order.position.lo, d.order.value, now,
             batch, run_id) for k, d in decisions.items() if d.effect == Effect.DELETE]
    if not rows:
        return
    source = spark.createDataFrame(rows, schema).withColumn(DELETED_AT, F.lit(now).cast("timestamp"))
    on = " AND ".join(f"d.{c} = s.{c}" for c in (KEY, *PLACE))
    cutoff = sql_literal(now - 2 * window)
    retry_conflicts(lambda: merge_into(
        spark, path, source, on,
        f"WHEN NOT MATCHED THEN INSERT * WHEN NOT MATCHED BY SOURCE AND d.{DELETED_AT} < {cutoff} THEN DELETE",
        alias="d"))


def winners(spark, rows, decisions: dict[Hashable, Decision]):
    """The batch's rows of the decisions that apply, with their effect and the order they are kept with (a
    null order_by value takes the one it follows: `upsert.orders`)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    order_type = rows.schema[ORDER].dataType
    schema = StructType([StructField(KEY, StringType()), StructField("_dd_partition", StringType()),
                         StructField("_dd_pos_hi", LongType()), StructField("_dd_pos_lo", LongType()),
                         StructField(EFFECT, StringType()), StructField("_dd_kept_order", order_type)])
    chosen = spark.createDataFrame(
        [(str(k), d.event.position.partition, d.event.position.hi, d.event.position.lo, d.effect.value,
          d.order.value) for k, d in decisions.items()], schema)
    picked = rows.join(F.broadcast(chosen), [KEY, *PLACE]).dropDuplicates([KEY])
    return picked.withColumn(ORDER, F.col("_dd_kept_order")).drop("_dd_kept_order", CHANGE)


def merge_clauses(columns: list[str], truncating: bool) -> str:
    """The target MERGE's clauses (ON the key): a delete deletes, an upsert replaces or inserts the row; after a
    truncate every row the batch does not write again goes."""
    names = [c for c in columns if c != EFFECT]
    sets = ", ".join(f"t.{sql_name(c)} = s.{sql_name(c)}" for c in names)
    cols = ", ".join(sql_name(c) for c in names)
    vals = ", ".join(f"s.{sql_name(c)}" for c in names)
    clauses = (f"WHEN MATCHED AND s.{EFFECT} = 'delete' THEN DELETE "  # noqa: S608 - names quoted by sql_name
               f"WHEN MATCHED AND s.{EFFECT} = 'upsert' THEN UPDATE SET {sets} "
               f"WHEN NOT MATCHED AND s.{EFFECT} = 'upsert' THEN INSERT ({cols}) VALUES ({vals})")
    if truncating:
        clauses += " WHEN NOT MATCHED BY SOURCE THEN DELETE"
    return clauses


def prepare(spark, rows, *, pipeline, target: str, tombstones: str, batch: int, run_id: str, now: datetime):
    """Decide the batch and remember its deletes: (the MERGE's source rows, its clauses, how many keys it
    changes). Raises TruncateRefused for a truncate the pipeline may not follow."""
    events_rows = rows.select(KEY, CHANGE, ORDER, *PLACE).collect()
    events, truncated = events_of(tuple(r) for r in events_rows)
    if truncated and pipeline.target.on_truncate == "fail":
        where = next(r[0] for r in events_rows if r[1] == TRUNCATE)
        raise TruncateRefused(truncate_line(where, pipeline.name))
    keys = sorted({str(e.key) for e in events})
    states: dict[Hashable, KeyState] = {}
    if not truncated:
        states.update(read_states(spark, target, tombstones, keys))
    decisions = applied(decide_batch(events, states, now=now, window=pipeline.dedup_window))
    write_tombstones(spark, tombstones, decisions, rows.schema[ORDER].dataType, batch=batch, run_id=run_id, now=now,
                     window=pipeline.dedup_window)
    source = winners(spark, rows, decisions)
    return source, merge_clauses(source.columns, bool(truncated)), len(decisions)

