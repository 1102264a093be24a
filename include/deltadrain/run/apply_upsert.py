"""Upsert mode's commit (`target.mode: upsert`, docs/cdc.md): a batch's events -> each key's newest change,
applied to the target in the batch's one MERGE commit, with the positions and the batch number as in insert mode
(deltadrain.run.commit).

The decisions are the ones `deltadrain.run.upsert.decide_batch` states in pure Python, made over columns: in
Spark, or for a batch of at most DRIVER_ROWS rows in Arrow on the driver. Each key's newest event is picked; what
the lake holds for the batch's keys (the target's live row: `_dd_partition`, `_dd_pos_hi`, `_dd_pos_lo`,
`_dd_order`; the newest remembered delete in the tombstone table `<lake>/_deltadrain/tombstones/<pipeline>`, read
for the batch's keys with the batch's key range as literals for Delta's file skipping) gives its effect. Three
ways, one answer (tests hold each equal to `decide_batch` on random batches):
- `newest_frame`, for a batch whose events all have their order (`order_by: position`, or a value in each) and
  no truncate: the tombstones are read for the batch's keys, and the target MERGE's matched clauses compare the
  event with the live row they match, so the target is read once, by the MERGE;
- `newest_arrow`, the same decision for such a batch when it is small (`prepare_on_driver`): one Spark job brings
  its rows to the driver, the tombstones are read and appended with delta-rs, and the MERGE's source is the
  decided rows themselves, so no Spark job decides and Delta does not compute the decision a second time;
- `decide_frame`, otherwise: an event without an order value takes its key's newest (`upsert.orders`), which may
  be the live row's, so the target is read for the batch's keys first.

A batch's deletes are appended to the tombstone table before the target's commit: a run killed after
it and before the target's commit only appends them again, which the decision does not see (a key's newest
delete counts), and the retry still deletes the row (`upsert.effect`: a delete applies when newer than the live
row, even when it is already remembered). A batch without deletes writes no tombstone commit. Every
EXPIRE_EVERY batches a DELETE drops the tombstones remembered longer than twice `dedup_window`, so the table
stays small (`upsert.decide` forgets them after one window whatever the table keeps).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple

from deltadrain.formats.changes import CHANGE, DELETE, KEY, ORDER, TRUNCATE
from deltadrain.formats.debezium import truncate_line
from deltadrain.lake.delta import (
    append_arrow,
    ensure_table,
    file_count,
    is_table,
    read_arrow,
    retry_conflicts,
    sql_literal,
    sql_name,
    table_ref,
)
from deltadrain.run.upsert import Effect, Position, last_truncates

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

EFFECT = "_dd_effect"
PLACE = ("_dd_partition", "_dd_pos_hi", "_dd_pos_lo")
DELETED_AT = "_dd_deleted_at"
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# The decision's working columns: the order of the key's live row, and of its newest remembered delete.
ROW, MARK = "_dd_row", "_dd_mark"
KEPT = "_dd_kept_order"
# Every this many batches the tombstones remembered longer than twice dedup_window are dropped.
EXPIRE_EVERY = 32
# A target of at least SPREAD_FILES files is MERGEd with at most KEY_RANGES ranges of the batch's keys, found
# on the driver for a batch of at most RANGE_KEYS keys (a larger one keeps its one range).
SPREAD_FILES, KEY_RANGES, RANGE_KEYS = 16, 16, 200_000
# A batch of at most DRIVER_ROWS rows that `newest_frame` could decide is decided on the driver in Arrow
# (`newest_arrow`): it spares the Spark jobs of the decision and of the tombstones' append, and the MERGE's
# second computation of its source. The bound keeps the batch's copies on the driver (in Arrow, and as the
# MERGE's source in the JVM) small beside the driver's memory; a larger batch is decided in Spark.
DRIVER_ROWS = 50_000
KNOWN = "_dd_known"


class TruncateRefused(Exception):
    """A batch holds a truncate and the pipeline's target.on_truncate is fail: the message is the one line."""


class UpsertRefused(Exception):
    """An upsert target's constraints refused its MERGE (the error, as Delta raised it): `named` is what
    `refused_messages` makes of the rows the MERGE writes, found before its decisions were released."""

    def __init__(self, error: Exception, named: tuple[list | None, str]):
        super().__init__(str(error))
        self.named = named


def tombstone_schema(order_type) -> StructType:
    from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

    return StructType([StructField(KEY, StringType(), False), StructField("_dd_partition", StringType(), False),
                       StructField("_dd_pos_hi", LongType(), False), StructField("_dd_pos_lo", LongType(), False),
                       StructField(ORDER, order_type, True), StructField(DELETED_AT, TimestampType(), False),
                       StructField("_dd_batch", LongType(), True), StructField("_dd_run_id", StringType(), True)])


class Survey(NamedTuple):
    """What the driver needs to know of a batch before deciding it: its row changes' lowest and highest key
    (None without any), its truncates' (key, place), the key naming the truncated table, how many of its
    events are deletes, and how many have no order value."""

    key_range: tuple[str, str] | None
    truncates: tuple[tuple[str, Position], ...]
    deletes: int = 0
    unordered: int = 0


def survey(rows) -> Survey:
    """One small aggregate over the batch's rows (truncates are few: Debezium sends one per TRUNCATE)."""
    from pyspark.sql import functions as F

    change = F.when(F.col(CHANGE) != TRUNCATE, F.col(KEY))
    got = rows.agg(F.min(change), F.max(change),
                   F.collect_list(F.when(F.col(CHANGE) == TRUNCATE, F.struct(KEY, *PLACE))),
                   F.count(F.when(F.col(CHANGE) == DELETE, 1)),
                   F.count(F.when((F.col(CHANGE) != TRUNCATE) & F.col(ORDER).isNull(), 1))).first()
    if got is None:
        return Survey(None, ())
    places = tuple(sorted(((t[0], Position(t[1], t[2], t[3])) for t in got[2] or ()), key=lambda t: t[1]))
    return Survey((str(got[0]), str(got[1])) if got[0] is not None else None, places, int(got[3]), int(got[4]))


def key_range_condition(key_range: tuple[str, str] | None, alias: str = "") -> str:
    """SQL restricting `alias`'s key to the batch's range: changes nothing about which keys match, but as
    literals Delta can skip every file whose key statistics lie outside it."""
    if key_range is None:
        return ""
    column = f"{alias}.{KEY}" if alias else KEY
    return f"{column} >= {sql_literal(key_range[0])} AND {column} <= {sql_literal(key_range[1])}"


def rank(value, place: tuple | None = None, order_type=None):
    """Column: an order as a struct that Spark compares as `upsert.newer` does (structs compare field by field,
    a null field below any other): whether there is a value, the value, then the position. `value` a column or
    its name; `place` the position's three columns (default: PLACE's)."""
    from pyspark.sql import functions as F

    v = F.col(value) if isinstance(value, str) else value
    if order_type is not None:
        v = v.cast(order_type)
    p, hi, lo = place if place is not None else (F.col(c) for c in PLACE)
    return F.struct(v.isNotNull().alias("known"), v.alias("value"), p.alias("partition"), hi.alias("hi"),
                    lo.alias("lo"))


def remembered(tombstones, keys, order_type, *, now: datetime, window: timedelta,
               key_range: tuple[str, str] | None = None):
    """The remembered delete of each of `keys` (KEY, MARK: its order as `rank` gives it): only a key's newest
    counts, and it is forgotten a window after its commit (`upsert.forget`)."""
    from pyspark.sql import functions as F

    if key_range is not None:
        tombstones = tombstones.filter(key_range_condition(key_range))
    cutoff = (now - window - EPOCH) // timedelta(microseconds=1)
    return (tombstones.join(keys, KEY, "left_semi")
            .groupBy(KEY).agg(F.max(F.struct(rank(ORDER, order_type=order_type).alias("at"),
                                             F.unix_micros(DELETED_AT).alias("when"))).alias("_dd_m"))
            .filter(F.col("_dd_m.when").isNull() | (F.col("_dd_m.when") >= F.lit(cutoff)))
            .select(KEY, F.col("_dd_m.at").alias(MARK)))


def newest_frame(events, tombstones=None, *, now: datetime, window: timedelta,
                 key_range: tuple[str, str] | None = None):
    """The decision where it needs nothing of the target: a batch without truncates whose events all have their
    order (`order_by: position`, or a value in every event; a null value would take the key's from the table).
    -> each key's newest event, less the upserts its remembered delete is newer than, with EFFECT what it does if
    it is newer than the key's live row. The target MERGE weighs it against that row (`merge_clauses` with
    `weigh`), which it reads anyway: the same decisions as `decide_frame`, with one read of the target fewer."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    order_type = events.schema[ORDER].dataType
    first = Window.partitionBy(KEY).orderBy(rank(ORDER).desc())
    best = events.withColumn("_dd_n", F.row_number().over(first)).filter(F.col("_dd_n") == 1)
    delete = F.col(CHANGE) == DELETE
    if tombstones is not None:
        marks = remembered(tombstones, F.broadcast(best.select(KEY)), order_type, now=now, window=window,
                           key_range=key_range)
        # A delete is weighed against the live row alone, so that a retry after its tombstone was written
        # still deletes the row; without a row it only needs remembering.
        best = best.join(marks, KEY, "left").filter(delete | F.coalesce(rank(ORDER) > F.col(MARK), F.lit(True)))
    effect = F.when(delete, F.lit(Effect.DELETE.value)).otherwise(F.lit(Effect.UPSERT.value))
    return best.select(*(F.col(c) for c in events.columns if c != CHANGE), effect.alias(EFFECT))


def on_driver(order_type) -> bool:
    """Whether `newest_arrow` orders values of this Spark type as Spark does: not floating point, where Spark
    puts NaN above every number and Arrow's sort puts it last."""
    from pyspark.sql.types import DoubleType, FloatType

    return not isinstance(order_type, DoubleType | FloatType)


def first_per_key(table, extra: tuple[tuple[str, str], ...] = ()):
    """Each key's greatest row of a pyarrow Table by `rank` (whether ORDER has a value, ORDER, then the
    position), ties then broken by `extra` sort keys: the table sorted by key and rank descending, the first
    row of each key's run."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if table.num_rows == 0:
        return table
    ranked = table.append_column(KNOWN, pc.is_valid(table[ORDER]))
    order = pc.sort_indices(ranked, sort_keys=[(KEY, "ascending"), (KNOWN, "descending"), (ORDER, "descending"),
                                               *((c, "descending") for c in PLACE), *extra])
    ranked = ranked.take(order).drop_columns([KNOWN])
    keys = ranked[KEY]
    starts = pc.not_equal(keys[1:], keys[:-1]).combine_chunks()
    return ranked.filter(pa.concat_arrays([pa.array([True]), pc.fill_null(starts, True)]))


def newer_arrow(a, b):
    """Elementwise `rank(a) > rank(b)` of two aligned pyarrow Tables (ORDER of one type, PLACE); null where b's
    row is null (PLACE is never null in a row)."""
    import pyarrow.compute as pc

    pairs = [(pc.is_valid(a[ORDER]).cast("int8"), pc.is_valid(b[ORDER]).cast("int8")), (a[ORDER], b[ORDER]),
             *((a[c], b[c]) for c in PLACE)]
    newer = pc.greater(*pairs[-1])
    for x, y in reversed(pairs[:-1]):
        # Both without a value compare equal on it.
        newer = pc.or_(pc.fill_null(pc.greater(x, y), False), pc.and_(pc.fill_null(pc.equal(x, y), True), newer))
    return pc.if_else(pc.is_valid(b[PLACE[0]]), newer, None)


def remembered_arrow(path: str, keys, order_type, *, now: datetime, window: timedelta,
                     key_range: tuple[str, str] | None = None):
    """`remembered` on the driver: the tombstones of `keys` (a pyarrow array) read with delta-rs (the batch's
    key range as a filter for its file skipping), each key's newest (ORDER cast to the batch's `order_type`, a
    pyarrow type) when it was remembered within the window -> a pyarrow Table (KEY, *PLACE, ORDER); None
    without a tombstone table."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    where = ds.field(KEY).isin(keys)
    if key_range is not None:
        where = (ds.field(KEY) >= key_range[0]) & (ds.field(KEY) <= key_range[1]) & where
    marks = read_arrow(path, [KEY, *PLACE, ORDER, DELETED_AT], where)
    if marks is None:
        return None
    marks = marks.set_column(marks.schema.get_field_index(ORDER), ORDER, marks[ORDER].cast(order_type))
    newest = first_per_key(marks, ((DELETED_AT, "descending"),))
    cutoff = pa.scalar(now - window, pa.timestamp("us", tz="UTC"))
    return newest.filter(pc.greater_equal(newest[DELETED_AT], cutoff)).drop_columns([DELETED_AT])


def newest_arrow(events, marks=None):
    """`newest_frame` on the driver, over the batch's rows in a pyarrow Table: each key's newest event, less
    the upserts its remembered delete (`marks`, from `remembered_arrow`) is newer than, with EFFECT; ORDER of a
    type `on_driver` accepts. The same decisions (tests hold both to `upsert.decide_batch`)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    best = first_per_key(events)
    delete = pc.equal(best[CHANGE], DELETE)
    if marks is not None and marks.num_rows and best.num_rows:
        mark = marks.take(pc.index_in(best[KEY], value_set=marks[KEY].combine_chunks()))
        # A delete is weighed against the live row alone (see newest_frame).
        best = best.filter(pc.or_(delete, pc.fill_null(newer_arrow(best, mark), True)))
        delete = pc.equal(best[CHANGE], DELETE)
    effect = pc.if_else(delete, Effect.DELETE.value, Effect.UPSERT.value).cast(pa.string())
    return best.drop_columns([CHANGE]).append_column(EFFECT, effect)


def decide_frame(events, target=None, tombstones=None, *, now: datetime, window: timedelta,
                 truncated: Mapping[str, Position] | None = None, key_range: tuple[str, str] | None = None):
    """`upsert.decide_batch` in Spark. `events`: the batch's rows (KEY, CHANGE, ORDER, *PLACE and any others,
    kept); `target`: the target's rows (KEY, *PLACE, ORDER), `tombstones`: the remembered deletes (KEY, *PLACE,
    ORDER, DELETED_AT), each None when there is no such table; `truncated`: each partition's newest truncate,
    whose partition's events at or before it are left out (`upsert.events_of`). -> each key's newest row when it
    changes the table: the rows' columns without CHANGE, ORDER the value it is kept with, EFFECT."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    kept = events.filter(F.col(CHANGE) != TRUNCATE)
    for part, at in (truncated or {}).items():
        p, hi, lo = (F.col(c) for c in PLACE)
        gone = (p == F.lit(part)) & ((hi < F.lit(at.hi)) | ((hi == F.lit(at.hi)) & (lo <= F.lit(at.lo))))
        kept = kept.filter(~gone)
    keys = F.broadcast(kept.select(KEY).distinct())
    order_type = events.schema[ORDER].dataType
    state = kept
    if target is not None:
        if key_range is not None:
            target = target.filter(key_range_condition(key_range))
        rows = target.join(keys, KEY, "left_semi").select(KEY, rank(ORDER, order_type=order_type).alias(ROW))
        state = state.join(rows, KEY, "left")
    if tombstones is not None:
        state = state.join(remembered(tombstones, keys, order_type, now=now, window=window, key_range=key_range),
                           KEY, "left")
    none = rank(F.lit(None), (F.lit(None).cast("string"), F.lit(None).cast("long"), F.lit(None).cast("long")),
                order_type)
    row = F.col(ROW) if target is not None else F.when(F.lit(False), none)
    mark = F.col(MARK) if tombstones is not None else F.when(F.lit(False), none)
    # The value a null order_by value takes: the greatest its key has before it, in the lake or the batch.
    held = F.greatest(row, mark)
    earlier = Window.partitionBy(KEY).orderBy(*PLACE).rowsBetween(Window.unboundedPreceding, -1)
    ordered = state.withColumn(KEPT, F.coalesce(F.col(ORDER), F.greatest(F.max(ORDER).over(earlier),
                                                                         held["value"])))
    mine = rank(KEPT)
    first = Window.partitionBy(KEY).orderBy(mine.desc())
    best = ordered.withColumn("_dd_n", F.row_number().over(first)).filter(F.col("_dd_n") == 1)
    delete = F.col(CHANGE) == DELETE
    # A delete is weighed against the live row, or without one the remembered delete; an upsert against both.
    against = F.when(delete, F.coalesce(row, mark)).otherwise(held)
    effect = F.when(F.coalesce(mine > against, F.lit(True)),
                    F.when(delete, F.lit(Effect.DELETE.value)).otherwise(F.lit(Effect.UPSERT.value)))
    columns = [F.col(KEPT).alias(ORDER) if c == ORDER else F.col(c) for c in events.columns if c != CHANGE]
    return best.select(*columns, effect.alias(EFFECT)).filter(F.col(EFFECT).isNotNull())


def write_tombstones(spark, path: str, decided, order_type, *, batch: int, run_id: str, now: datetime) -> None:
    """Remember the batch's deletes (`decided`'s rows whose effect is delete), appended: a retry of the batch
    appends them again, which changes nothing the decision reads (a key's newest delete counts), and an
    append needs no read of the table and never conflicts."""
    from pyspark.sql import functions as F

    ensure_table(spark, path, tombstone_schema(order_type))
    source = (decided.filter(F.col(EFFECT) == Effect.DELETE.value)
              .select(KEY, *PLACE, F.col(ORDER).cast(order_type).alias(ORDER),
                      F.lit(now).cast("timestamp").alias(DELETED_AT), F.lit(batch).cast("long").alias("_dd_batch"),
                      F.lit(run_id).alias("_dd_run_id")))
    source.write.format("delta").mode("append").save(path)


def expire_when_due(spark, path: str, *, batch: int, remembered: bool, now: datetime, window: timedelta) -> None:
    """`expire_tombstones` every EXPIRE_EVERY batches, when the batch found a tombstone table (`remembered`)."""
    if remembered and batch > 0 and batch % EXPIRE_EVERY == 0:
        expire_tombstones(spark, path, now=now, window=window)


def expire_tombstones(spark, path: str, *, now: datetime, window: timedelta) -> None:
    """Drop the deletes remembered longer than twice `window` (`upsert.decide` forgets them after one, so
    when they go changes nothing). Delta skips the files whose `_dd_deleted_at` are all newer."""
    cutoff = sql_literal(now - 2 * window)
    retry_conflicts(lambda: spark.sql(f"DELETE FROM {table_ref(path)} WHERE {DELETED_AT} < {cutoff}"))  # noqa: S608


def rank_sql(alias: str) -> str:
    """`rank` of the row `alias` in SQL, from its ORDER and place columns."""
    return (f"named_struct('known', {alias}.{ORDER} IS NOT NULL, 'value', {alias}.{ORDER}, "
            + ", ".join(f"'{name}', {alias}.{c}" for name, c in zip(("partition", "hi", "lo"), PLACE, strict=True))
            + ")")


def merge_clauses(columns: list[str], truncating: bool, weigh: bool = False) -> str:
    """The target MERGE's clauses (ON the key): a delete deletes, an upsert replaces or inserts the row; after a
    truncate every row the batch does not write again goes. `weigh` (`newest_frame`'s source): a matched row
    changes only when the event is newer than it."""
    names = [c for c in columns if c != EFFECT]
    sets = ", ".join(f"t.{sql_name(c)} = s.{sql_name(c)}" for c in names)
    cols = ", ".join(sql_name(c) for c in names)
    vals = ", ".join(f"s.{sql_name(c)}" for c in names)
    newer = f" AND {rank_sql('s')} > {rank_sql('t')}" if weigh else ""
    clauses = (f"WHEN MATCHED AND s.{EFFECT} = 'delete'{newer} THEN DELETE "  # noqa: S608 - names quoted by sql_name
               f"WHEN MATCHED AND s.{EFFECT} = 'upsert'{newer} THEN UPDATE SET {sets} "
               f"WHEN NOT MATCHED AND s.{EFFECT} = 'upsert' THEN INSERT ({cols}) VALUES ({vals})")
    if truncating:
        clauses += " WHEN NOT MATCHED BY SOURCE THEN DELETE"
    return clauses


def merge_condition(key_range: tuple[str, str] | None, truncating: bool,
                    ranges: list[tuple[str, str]] | None = None) -> str:
    """The target MERGE's ON: the key, and the batch's key range for file skipping, or its `ranges` (`key_ranges`)
    when they were found (neither after a truncate, whose MERGE must reach every row to delete the ones not
    written again)."""
    cond = f"t.{KEY} = s.{KEY}"
    if truncating:
        return cond
    if ranges:
        return cond + " AND (" + " OR ".join(f"({key_range_condition(r, 't')})" for r in ranges) + ")"
    if key_range is not None:
        cond += " AND " + key_range_condition(key_range, "t")
    return cond


def key_ranges(keys: list[str], most: int) -> list[tuple[str, str]]:
    """A batch's distinct keys, sorted -> at most `most` ranges that hold them all, split where neighbouring keys
    share the shortest prefix: the widest gaps in text order. The batch's keys often come in a few clusters
    (recent ids, new ids, a region of the key space), and with Delta's per-file key statistics the MERGE then
    reads the files of each cluster instead of every file between the lowest key and the highest. Pure."""
    if not keys:
        return []

    def shared(a: str, b: str) -> int:
        n = 0
        for x, y in zip(a, b, strict=False):
            if x != y:
                break
            n += 1
        return n

    gaps = sorted(range(1, len(keys)), key=lambda i: (shared(keys[i - 1], keys[i]), i))[:most - 1]
    cuts = [0, *sorted(gaps), len(keys)]
    return [(keys[a], keys[b - 1]) for a, b in zip(cuts, cuts[1:], strict=False)]


@dataclass
class Prepared:
    """A decided batch: the target MERGE's source (`release` it after the commit), ON and clauses."""

    source: Any
    condition: str
    clauses: str

    def release(self) -> None:
        self.source.unpersist()

    def upserts(self):
        """The rows the MERGE inserts into an empty table: the batch's upserts, as the table's columns."""
        return self.source.where(f"{EFFECT} = '{Effect.UPSERT.value}'").drop(EFFECT)


def prepare(spark, rows, *, pipeline, target: str, tombstones: str, batch: int, run_id: str,
            now: datetime, seen: Survey | None = None, size: int | None = None, events=None) -> Prepared:
    """Decide the batch and remember its deletes. `seen`: the batch's survey when the staging made it; `size`:
    how many rows the batch has, when known (a batch of at most DRIVER_ROWS is decided on the driver, from
    `events()`, `rows` as Arrow, when given, else from `rows` brought there by a Spark job).
    Raises TruncateRefused for a truncate the pipeline may not follow, before anything is written."""
    seen = seen if seen is not None else survey(rows)
    if seen.truncates and pipeline.target.on_truncate == "fail":
        raise TruncateRefused(truncate_line(seen.truncates[0][0], pipeline.name))
    truncated = last_truncates(at for _, at in seen.truncates)
    window = pipeline.dedup_window
    weigh = not truncated and (pipeline.target.order_by == "position" or not seen.unordered)
    if weigh and size is not None and size <= DRIVER_ROWS and on_driver(rows.schema[ORDER].dataType):
        driven = prepare_on_driver(spark, rows, target=target, tombstones=tombstones, batch=batch, run_id=run_id,
                                   now=now, window=window, key_range=seen.key_range, events=events)
        if driven is not None:
            return driven
    # After a truncate the table holds nothing the batch's events must be newer than: it is not read.
    read = not truncated
    marks = spark.read.format("delta").load(tombstones) if read and is_table(spark, tombstones) else None
    if weigh:
        decided = newest_frame(rows, marks, now=now, window=window, key_range=seen.key_range)
    else:
        target_rows = spark.read.format("delta").load(target) if read and is_table(spark, target) else None
        decided = decide_frame(rows, target_rows, marks, now=now, window=window, truncated=truncated,
                               key_range=seen.key_range)
    ranges = batch_ranges(rows, target) if read else None
    if seen.deletes:  # read twice: by the tombstones' append and by the MERGE
        decided = decided.persist()
    try:
        if seen.deletes:
            write_tombstones(spark, tombstones, decided, rows.schema[ORDER].dataType, batch=batch, run_id=run_id,
                             now=now)
        expire_when_due(spark, tombstones, batch=batch, remembered=marks is not None, now=now, window=window)
    except BaseException:
        decided.unpersist()
        raise
    truncating = bool(truncated)
    return Prepared(decided, merge_condition(seen.key_range, truncating, ranges),
                    merge_clauses(decided.columns, truncating, weigh))


def prepare_on_driver(spark, rows, *, target: str, tombstones: str, batch: int, run_id: str, now: datetime,
                      window: timedelta, key_range: tuple[str, str] | None, events=None) -> Prepared | None:
    """`prepare` for a batch `newest_frame` could decide, decided on the driver (`newest_arrow`): its rows are
    `events()` (Arrow, computed in this process) or else brought there by one Spark job, the tombstones are read
    and appended with delta-rs, and the MERGE's source is the decided rows, which Delta need not compute again.
    None when delta-rs cannot read the tombstone table (a table feature it lacks): the batch is then decided in
    Spark, nothing having been written."""
    import pyarrow.compute as pc
    from deltalake.exceptions import DeltaProtocolError
    from pyspark.sql.pandas.types import to_arrow_schema, to_arrow_type
    from pyspark.sql.types import StringType, StructField, StructType

    order_type = rows.schema[ORDER].dataType
    events = events().cast(to_arrow_schema(rows.schema)) if events is not None else rows.toArrow()
    keys = pc.unique(events[KEY])
    try:
        marks = remembered_arrow(tombstones, keys, to_arrow_type(order_type), now=now, window=window,
                                 key_range=key_range)
    except DeltaProtocolError:
        return None
    decided = newest_arrow(events, marks)
    deletes = decided.filter(pc.equal(decided[EFFECT], Effect.DELETE.value))
    if deletes.num_rows:
        append_tombstones(spark, tombstones, deletes, order_type, batch=batch, run_id=run_id, now=now)
    expire_when_due(spark, tombstones, batch=batch, remembered=marks is not None, now=now, window=window)
    schema = StructType([f for f in rows.schema.fields if f.name != CHANGE] + [StructField(EFFECT, StringType())])
    source = spark.createDataFrame(decided, schema=schema)
    ranges = ranges_of(decided[KEY].to_pylist()) if spread(target) else None
    return Prepared(source, merge_condition(key_range, False, ranges), merge_clauses(source.columns, False, True))


def append_tombstones(spark, path: str, deletes, order_type, *, batch: int, run_id: str, now: datetime) -> None:
    """`write_tombstones` of deletes decided on the driver (`newest_arrow`'s rows whose effect is delete),
    appended with delta-rs, which creates a missing table with `tombstone_schema`: no Spark job. A table
    feature delta-rs cannot write is appended by Spark."""
    import pyarrow as pa
    from deltalake.exceptions import DeltaProtocolError
    from pyspark.sql.pandas.types import to_arrow_schema

    n = deletes.num_rows
    rows = pa.table({**{c: deletes[c] for c in (KEY, *PLACE, ORDER)},
                     DELETED_AT: pa.array([now] * n, pa.timestamp("us", tz="UTC")),
                     "_dd_batch": pa.array([batch] * n, pa.int64()), "_dd_run_id": pa.array([run_id] * n)})
    schema = tombstone_schema(order_type)
    try:
        append_arrow(path, rows, create=to_arrow_schema(schema))
    except DeltaProtocolError:
        ensure_table(spark, path, schema)
        spark.createDataFrame(rows, schema=schema).write.format("delta").mode("append").save(path)


def spread(target: str) -> bool:
    """Whether the target has files enough (SPREAD_FILES, counted in its log by delta-rs) for the MERGE's file
    skipping to pay for collecting the batch's keys."""
    return (file_count(target) or 0) >= SPREAD_FILES


def ranges_of(keys: list[str]) -> list[tuple[str, str]] | None:
    """`key_ranges` of a batch's distinct keys, or None for more than RANGE_KEYS of them (one range)."""
    return key_ranges(sorted(keys), KEY_RANGES) if len(keys) <= RANGE_KEYS else None


def batch_ranges(rows, target: str) -> list[tuple[str, str]] | None:
    """`ranges_of` the batch's keys, collected from `rows` when the target is `spread`, else None."""
    if not spread(target):
        return None
    return ranges_of([r[0] for r in rows.where(f"{CHANGE} != '{TRUNCATE}'").select(KEY).distinct()
                      .limit(RANGE_KEYS + 1).collect()])
