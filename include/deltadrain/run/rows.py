"""The rows of a run: claimed rows -> the rows the transform sees and the target gets, dead-letter
rows, the transform's culprits found by bisection, and the messages whose rows the target's
constraints refuse. Pure DataFrame functions: drains (run.drain), backfills and replays (heal) share
them, and none of them touches the source.
"""

from __future__ import annotations

from datetime import UTC, datetime

from deltadrain import failpoints
from deltadrain.config import PipelineConfig
from deltadrain.errors import DeltadrainError, error_line
from deltadrain.formats.changes import CHANGE, KEY, ORDER, order_type
from deltadrain.formats.decode import EXTRA_COLUMNS
from deltadrain.lake.checkpoint import META_COLUMNS
from deltadrain.lake.deadletter import DEAD
from deltadrain.lake.delta import add_missing_columns, ensure_table, is_table, row_constraints, sql_name
from deltadrain.transforms import load_transform

MAX_CULPRITS = 32  # beyond this many failing messages in one batch, fail the run instead of bisecting on
# Beyond this many messages whose rows the target's constraints refuse in one batch, the constraint
# refuses the stream itself, not a few bad messages: fail the run (a counted attempt) instead.
MAX_REFUSED = 1000
REFUSED_BATCH_MIN = 20  # ... or most of a batch of at least this many messages


class DrainError(DeltadrainError):
    """A run that stops: it commits and acknowledges nothing, and says why."""


class BatchFailure(DrainError):
    """The transform fails on the batch in a way no single message isolates (no culprit explains it,
    it still fails without its culprits, or too many fail), or the target refuses rows its constraints
    do not name. The batch's messages caused it, so (on Kafka) the run counts as an attempt at them."""


def id_column(pipeline: PipelineConfig) -> str:
    """The column that identifies a staged row: the message id, or in upsert mode the key's text."""
    return KEY if pipeline.upsert else pipeline.payload_schema.id_field


def claim_schema(pipeline: PipelineConfig):
    from pyspark.sql.types import _parse_datatype_string

    schema = pipeline.payload_schema
    payload = ", ".join(f"`{name}` {kind}" for name, kind in schema.fields.items())
    extra = "".join(f", {name} string" for name in EXTRA_COLUMNS) if schema.collects_new_fields else ""
    if pipeline.upsert:
        extra += f", {KEY} string, {CHANGE} string, {ORDER} {order_type(schema.fields, pipeline.target.order_by)}"
    return _parse_datatype_string(
        "_dd_partition string, _dd_position string, _dd_pos_hi long, _dd_pos_lo long, _dd_source_ts timestamp, "
        "_dd_attempts int, _dd_reclaimed boolean, _dd_message_id string, _dd_error_type string, _dd_error string, "
        f"_dd_original binary, _dd_first_failure_at timestamp, {payload}{extra}")


def target_rows(good, pipeline: PipelineConfig, batch: int, run_id: str, now: datetime | None = None):
    """Claimed rows -> the rows the transform sees: payload columns plus the _dd_ metadata. The payload
    columns are every claimed column but deltadrain's own: the declared fields, and with schema evolution
    the table's evolved columns and the batch's new ones.

    The run's own columns (batch, run id, ingestion time) come from a one-row table joined to every row,
    not from literals: Spark compiles a long or timestamp literal into the code it generates, so each
    batch's new values would make the server compile and JIT-warm that code again
    (bench/stable_code/README.md). `now`: the ingestion time (now by default)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

    payload, meta = _target_columns(good.columns)
    run = StructType([StructField("_dd_batch", LongType(), False), StructField("_dd_run_id", StringType(), False),
                      StructField("_dd_ingested_at", TimestampType(), False)])
    values = good.sparkSession.createDataFrame([(batch, run_id, now or datetime.now(UTC))], run)
    return good.crossJoin(F.broadcast(values)).select(*[F.col(sql_name(c)) for c in payload], *meta, *run.names)


def _target_columns(claimed: list[str]) -> tuple[list[str], list[str]]:
    """(payload columns, metadata columns) of `target_rows`, in its order, from the claimed columns."""
    payload = [name for name in claimed if not name.startswith("_dd_")]
    return payload, [name for name, _ in META_COLUMNS[:6]] + [c for c in (KEY, ORDER, CHANGE) if c in claimed]


def target_arrow(staged, batch: int, run_id: str, now: datetime):
    """`target_rows` of the good rows of a batch staged in this process (`Staged.table`), computed here as Arrow:
    the same columns, types and values (tests/integration/test_upsert_decision.py holds the two equal)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    claimed = staged.table()
    good = claimed.filter(pc.is_null(claimed["_dd_error_type"]))
    payload, meta = _target_columns(claimed.column_names)
    n = good.num_rows
    return pa.table({**{c: good[c] for c in (*payload, *meta)},
                     "_dd_batch": pa.array([batch] * n, pa.int64()), "_dd_run_id": pa.array([run_id] * n, pa.string()),
                     "_dd_ingested_at": pa.array([now] * n, pa.timestamp("us", tz="UTC"))})


def transformed(rows, pipeline: PipelineConfig):
    from pyspark.sql import functions as F

    out = load_transform(pipeline.transform)(rows)
    id_field = id_column(pipeline)
    missing = [c for c in [id_field, *(n for n, _ in META_COLUMNS)] if c not in out.columns]
    if missing:
        raise DrainError(f"transform {pipeline.transform} dropped columns the drain needs: {missing}")
    if pipeline.transform is None:
        return out  # decode gave every row an id
    # A row without an id would be inserted again by every redelivery (no MERGE key matches null):
    # the transform failed on that message, which then goes the way of any transform failure (DLQ).
    ids = F.col(f"`{id_field}`")
    blank = ids.isNull() | (F.trim(ids.cast("string")) == "")
    reason = F.concat(F.lit(f"transform {pipeline.transform} left the message id ('{id_field}') null or blank "
                            "at "), F.col("_dd_partition"), F.lit(" "), F.col("_dd_position"))
    return out.withColumn(id_field, F.when(blank, F.raise_error(reason)).otherwise(ids))


def batch_stats_columns(id_field: str) -> list:
    """Aggregate columns for BatchStats.of over transformed rows (every one of them is good; the
    dead letters were counted by the staging)."""
    from pyspark.sql import functions as F

    ids = F.col(f"`{id_field}`")
    return [F.count("*").alias("_dd_good"), F.count_distinct(ids).alias("_dd_distinct"),
            F.min(ids).alias("_dd_lo"), F.max(ids).alias("_dd_hi"), F.lit(None).cast("long").alias("_dd_bad")]


def filtered_out(offered: int, kept: int) -> int:
    """How many of the `offered` valid messages the transform kept no row for: exact for a transform
    that gives each message at most one row. One that makes several rows of some (an explode)
    offsets what it filtered by as many extra rows, and never counts below 0."""
    return max(0, offered - kept)


def dedup_in_batch(df, id_field: str, by_place: bool = False):
    """Keep the first occurrence of each id in the batch (by source time, then position); with
    `by_place`, of each id at each (partition, position)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    keys = [F.col(f"`{id_field}`"), *((F.col("_dd_partition"), F.col("_dd_position")) if by_place else ())]
    order = Window.partitionBy(*keys).orderBy("_dd_source_ts", "_dd_partition", "_dd_pos_hi", "_dd_pos_lo")
    return df.withColumn("_dd_rank", F.row_number().over(order)).where("_dd_rank = 1").drop("_dd_rank")


def dead_letter_rows(bad, pipeline: str, batch: int, run_id: str):
    from pyspark.sql import functions as F

    now = F.current_timestamp()
    return bad.select(
        F.lit(pipeline).alias("pipeline"), F.col("_dd_partition").alias("partition"),
        F.col("_dd_position").alias("position"), F.col("_dd_pos_hi").alias("pos_hi"),
        F.col("_dd_pos_lo").alias("pos_lo"), F.col("_dd_message_id").alias("message_id"),
        F.col("_dd_original").alias("original"), F.col("_dd_error").alias("error"),
        F.col("_dd_error_type").alias("error_type"), F.col("_dd_attempts").alias("attempts"),
        F.coalesce(F.col("_dd_first_failure_at"), now).alias("first_failure_at"),
        now.alias("last_failure_at"), F.lit(DEAD).alias("state"), F.lit(batch).cast("long").alias("batch"),
        F.lit(run_id).alias("run_id"), F.lit(None).cast("timestamp").alias("replayed_at"),
        F.lit(None).cast("string").alias("replay_run_id"))


def find_culprits(indexed, n: int, evaluate) -> list[tuple[int, str]]:
    """Split a failing batch until each failing message is alone (invariant 6).

    `indexed` holds the batch with a dense `_dd_idx` in [0, n); `evaluate(df)` runs the transform
    over a slice and raises what it raises. Only failing halves are split again, so one poison
    message among n costs about 2*log2(n) small evaluations.
    """
    from pyspark.sql import functions as F

    def failure(lo: int, hi: int) -> str | None:
        try:
            evaluate(indexed.where((F.col("_dd_idx") >= lo) & (F.col("_dd_idx") < hi)).drop("_dd_idx"))
        except DrainError:
            raise
        except Exception as exc:
            failpoints.reraise_abandon(exc)
            return error_line(exc)
        return None

    culprits: list[tuple[int, str]] = []
    stack = [(0, n, failure(0, n))]
    while stack:
        lo, hi, err = stack.pop()
        if err is None:
            continue
        if hi - lo == 1:
            culprits.append((lo, err))
            if len(culprits) > MAX_CULPRITS:
                raise BatchFailure(f"more than {MAX_CULPRITS} messages of the batch make the transform fail; "
                                   f"first error: {culprits[0][1]}")
            continue
        mid = (lo + hi) // 2
        stack.append((mid, hi, failure(mid, hi)))
        stack.append((lo, mid, failure(lo, mid)))
    return sorted(culprits)


def refuses_the_data(refused: int, messages: int) -> bool:
    """A constraint that refuses more than MAX_REFUSED messages of a batch, or most of a batch of at
    least REFUSED_BATCH_MIN, refuses the data itself, not a few bad messages: dead-lettering would
    empty the stream into the DLQ one batch at a time, so the run fails instead."""
    return refused > MAX_REFUSED or (messages >= REFUSED_BATCH_MIN and 2 * refused > messages)


def refused_messages(spark, target: str, rows, id_field: str, updating: bool = False) -> tuple[list | None, str]:
    """After `target` refused a MERGE of `rows` (as the MERGE took them):
    ([(_dd_partition, _dd_position, constraint)] of the messages with a row that breaks one of its
    constraints (lake.row_constraints), naming one it breaks, ""), or (None, why) when none is named,
    the constraints could not be evaluated, or they refuse the data itself (`refuses_the_data`).
    An insert-only MERGE matches a row whose id the target holds already instead of inserting it, so
    Delta never checks it; a MERGE that is `updating` (reprocess) writes exactly those rows."""
    from pyspark.sql import functions as F

    ids = F.col(f"`{id_field}`")
    try:
        constraints = row_constraints(spark, target)
        if not constraints:
            return None, "none of its constraints names a row of the batch"
        broken = F.coalesce(*[F.when(~F.coalesce(F.expr(cond), F.lit(False)), F.lit(name))
                              for name, cond in constraints])
        found = (rows.select("_dd_partition", "_dd_position", ids.cast("string").alias("id"), broken.alias("error"))
                 .where(F.col("error").isNotNull())
                 .groupBy("_dd_partition", "_dd_position").agg(F.min("error"), F.collect_set("id").alias("ids")))
        found = found.limit(MAX_REFUSED + 1).collect()  # one pass: past MAX_REFUSED the count is moot
        messages = rows.select("_dd_partition", "_dd_position").distinct().count() if found else 0
        if refuses_the_data(len(found), messages):
            count = f"more than {MAX_REFUSED}" if len(found) > MAX_REFUSED else len(found)
            return None, f"{count} of the batch's {messages} messages break its constraints: they refuse the data itself"
        held = {str(r[0]) for r in spark.read.format("delta").load(target)
                .where(ids.cast("string").isin(sorted({i for r in found for i in r.ids})))
                .select(ids).distinct().collect()} if found and not updating else set()
    except Exception as exc:  # e.g. a CHECK on a column the transform does not give
        return None, f"its constraints could not be checked on the batch ({error_line(exc)})"
    found = [(r[0], r[1], r[2]) for r in found if not set(r.ids) <= held]
    if not found:
        return None, ("none of its constraints names a row of the batch" if updating else
                      "none of its constraints names a row of the batch the table does not hold already")
    return found, ""


def split_claimed(claimed):
    """(rows that decoded, rows for the DLQ). Gap markers are reported, never written as rows."""
    from pyspark.sql import functions as F

    error = F.col("_dd_error_type")
    return claimed.where(error.isNull()), claimed.where(error.isNotNull() & (error != "gap"))


def _target_schema(spark, pipeline: PipelineConfig, good_schema, run_id: str):
    empty = spark.createDataFrame([], good_schema)
    rows = transformed(target_rows(empty, pipeline, 0, run_id), pipeline)
    return rows.drop(CHANGE).schema  # what an upsert event does is no column of the table


def ensure_target(spark, target: str, pipeline: PipelineConfig, good_schema, run_id: str) -> None:
    """Create the target table, with the schema the transform gives claimed rows, if it is missing."""
    if not is_table(spark, target):
        schema = _target_schema(spark, pipeline, good_schema, run_id)
        ensure_table(spark, target, schema, pipeline.target.partition_by, pipeline.target.cluster_by)


def settle_columns(spark, target: str, pipeline: PipelineConfig, good_schema, run_id: str) -> None:
    """Put a batch's new columns into the target table now, in a commit of their own (creating the table
    if it is missing): the types its vote chose are then the table's, so a run killed before the batch's
    commit leaves the next run typing those fields by the columns, and the messages that lost the vote
    stay dead letters instead of being published by a batch whose vote goes the other way."""
    schema = _target_schema(spark, pipeline, good_schema, run_id)
    if is_table(spark, target):
        add_missing_columns(spark, target, schema)
    else:
        ensure_table(spark, target, schema, pipeline.target.partition_by, pipeline.target.cluster_by)


def isolate_culprits(spark, pipeline: PipelineConfig, good, batch: int, run_id: str, staged: str):
    """Bisect `good` for messages that make the transform fail: (culprits with `_dd_culprit_error`,
    the rest), or (None, good) when no single message explains a failure. Drains, backfills and
    replays isolate their culprits here."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    # A dense index 0..n-1 (the batch is at most batch_cap rows, numbered in one partition), staged so
    # that every evaluation slices the same rows.
    index = F.row_number().over(Window.orderBy(F.monotonically_increasing_id())) - 1
    good.withColumn("_dd_idx", index.cast("long")).write.mode("overwrite").parquet(staged)
    indexed = spark.read.parquet(staged)

    def evaluate(part) -> None:
        rows = transformed(target_rows(part, pipeline, batch, run_id), pipeline)
        rows.write.format("noop").mode("overwrite").save()

    found = find_culprits(indexed, indexed.count(), evaluate)
    if not found:
        return None, good
    errors = spark.createDataFrame(found, "_dd_idx long, _dd_culprit_error string")
    culprits = indexed.join(F.broadcast(errors), "_dd_idx").drop("_dd_idx")
    rest = indexed.join(F.broadcast(errors), "_dd_idx", "left_anti").drop("_dd_idx")
    return culprits.cache(), rest
