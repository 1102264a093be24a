"""One drain run, step by step (docs/contract.md, "One drain run").

read checkpoint -> claim (Spark tasks) -> decode -> dead letters -> MERGE with the checkpoint
-> compare-and-set outcome -> acknowledge (or release) -> summary. Every step's decision lives in a
small module of its own; this one only puts them in order.

`Drain` holds what every source shares (transform, poison isolation, dead letters, the commit and
its outcome); each source's subclass (`sources/<kind>/drain.py`) only claims and acknowledges.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime

from deltadrain import failpoints
from deltadrain.config import DeltadrainConfig, PipelineConfig
from deltadrain.errors import DeltadrainError, error_line
from deltadrain.formats.decode import EXTRA_COLUMNS
from deltadrain.lake.checkpoint import META_COLUMNS, commit_metadata
from deltadrain.lake.deadletter import DEAD, take_back, write_dead_letters
from deltadrain.lake.delta import (
    add_missing_columns,
    ensure_table,
    is_table,
    refused_rows,
    row_constraints,
    sql_name,
)
from deltadrain.lake.metrics import record_run_safely
from deltadrain.lake.scratch import remove_staging, staging_dir
from deltadrain.logs import fields, run_logger
from deltadrain.run.commit import CONFLICT_RETRIES, NewTable, commit_batch, dedup_window_start
from deltadrain.run.layout import allow_widening, end_widening, new_columns, run_layout
from deltadrain.run.outcome import Outcome
from deltadrain.run.stage import BatchStats
from deltadrain.schema.evolution import EvolutionError
from deltadrain.transforms import identity, load_transform

# What a run that stops on a gap (on_gap: fail) tells the operator, for either source.
GO_ON_PAST = ("Nothing was committed. To go on past them, with the next commit recording them, trigger one run "
              "with Accept gaps (the ingest DAG's parameter; deltadrain drain --accept-gaps) or set on_gap: continue")
MAX_CULPRITS = 32  # beyond this many failing messages in one batch, fail the run instead of bisecting on
# Beyond this many messages whose rows the target's constraints refuse in one batch, the constraint
# refuses the stream itself, not a few bad messages: fail the run (a counted attempt) instead.
MAX_REFUSED = 1000
REFUSED_BATCH_MIN = 20  # ... or most of a batch of at least this many messages


class DrainError(DeltadrainError):
    pass


class BatchFailure(DrainError):
    """The transform fails on the batch in a way no single message isolates (no culprit explains it,
    it still fails without its culprits, or too many fail), or the target refuses rows its constraints
    do not name. The batch's messages caused it, so (on Kafka) the run counts as an attempt at them."""


@dataclass
class RunSummary:
    pipeline: str
    run_id: str
    batch: int | None = None
    outcome: str = Outcome.EMPTY.value
    claimed: int = 0
    reclaimed: int = 0
    written: int = 0
    duplicates_skipped: int = 0
    dead_lettered: int = 0
    left_pending: int = 0
    # Valid messages the pipeline's transform kept no row for (it filtered them out): acknowledged,
    # in no table. So that claimed = written + duplicates_skipped + dead_lettered + left_pending + filtered
    # (on Valkey, plus entries deleted while pending; see filtered_out for a transform that explodes).
    filtered: int = 0
    acked: int = 0
    released: int = 0
    gaps: int = 0
    # Kafka: offsets retention deleted before they were read. Valkey: entries removed before the group
    # read them or while pending, as recorded and not yet carried by a commit (deltadrain.sources.valkey.gaps).
    gap_ranges: list = field(default_factory=list)
    # Kafka: offsets read by runs that died before committing, and how many (deltadrain.sources.kafka.crashes).
    # Valkey: the segment of entries runs died on that this run reads part of (valkey.crashes).
    # This run reads less there, and a message past max_retries + 1 attempts is a dead letter.
    dead_runs: list = field(default_factory=list)
    seconds: float = 0.0
    positions: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)  # seconds per step
    error: str | None = None

    def line(self) -> str:
        return json.dumps(asdict(self), default=str)


def new_run_id() -> str:
    return f"{socket.gethostname()[:20]}-{os.getpid()}-{uuid.uuid4().hex[:8]}"




def claim_schema(pipeline: PipelineConfig):
    from pyspark.sql.types import _parse_datatype_string

    schema = pipeline.payload_schema
    payload = ", ".join(f"`{name}` {kind}" for name, kind in schema.fields.items())
    extra = "".join(f", {name} string" for name in EXTRA_COLUMNS) if schema.collects_new_fields else ""
    return _parse_datatype_string(
        "_dd_partition string, _dd_position string, _dd_pos_hi long, _dd_pos_lo long, _dd_source_ts timestamp, "
        "_dd_attempts int, _dd_reclaimed boolean, _dd_message_id string, _dd_error_type string, _dd_error string, "
        f"_dd_original binary, _dd_first_failure_at timestamp, {payload}{extra}")










def target_rows(good, pipeline: PipelineConfig, batch: int, run_id: str):
    """Claimed rows -> the rows the transform sees: payload columns plus the _dd_ metadata. The payload
    columns are every claimed column but deltadrain's own: the declared fields, and with schema evolution
    the table's evolved columns and the batch's new ones.

    The run's own columns (batch, run id, ingestion time) come from a one-row table joined to every row,
    not from literals: Spark compiles a long or timestamp literal into the code it generates, so each
    batch's new values would make the server compile and JIT-warm that code again
    (bench/stable_code/README.md)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

    payload = [F.col(sql_name(name)) for name in good.columns if not name.startswith("_dd_")]
    meta = [F.col(name) for name, _ in META_COLUMNS[:6]]
    run = StructType([StructField("_dd_batch", LongType(), False), StructField("_dd_run_id", StringType(), False),
                      StructField("_dd_ingested_at", TimestampType(), False)])
    values = good.sparkSession.createDataFrame([(batch, run_id, datetime.now(UTC))], run)
    return good.crossJoin(F.broadcast(values)).select(*payload, *meta, *run.names)


def transformed(rows, pipeline: PipelineConfig):
    from pyspark.sql import functions as F

    out = load_transform(pipeline.transform)(rows)
    id_field = pipeline.payload_schema.id_field
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
    return transformed(target_rows(empty, pipeline, 0, run_id), pipeline).schema


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


_KILLED = threading.Event()


def stop_as_killed() -> None:
    """This process's task is being killed (Airflow's on_kill): the drain under way ends as a SIGKILL
    would end it. Through Spark Connect the process lives on after a kill, and a run that cleaned up
    after itself would not count as an attempt at its messages: a message that hangs every run that
    reads it (until Airflow's timeout) would be read again for ever instead of isolated."""
    _KILLED.set()


def ended_as_killed(exc: BaseException) -> bool:
    """A run ends as killed, nothing cleaned up, when its task is killed, when a test stops it as a kill
    would (failpoints.ABANDON), or on a BaseException that is no Exception: an order to stop now, such as
    the timeout Airflow's task runner raises (AirflowTaskTimeout) or an interrupt."""
    return failpoints.abandons(exc) or _KILLED.is_set() or not isinstance(exc, Exception)


class Drain:
    """One run. Construct, then call run(); the summary is returned, and printed by the callers.

    Subclasses implement `_run` (claim, then `publish`, then acknowledge) and `settle_culprits`
    (where a failing message's attempts are counted differs per source)."""

    def __init__(self, cfg: DeltadrainConfig, pipeline: PipelineConfig, spark, run_id: str | None = None):
        self.cfg, self.pipeline, self.spark = cfg, pipeline, spark
        self.run_id = run_id or new_run_id()
        self.target = str(cfg.target_path(pipeline))
        self.dlq = str(cfg.dlq_path(pipeline))
        self.quarantine = str(cfg.quarantine_path(pipeline))
        self.summary = RunSummary(pipeline.name, self.run_id)
        # schema.evolution add_columns: the pipeline as this run decodes it (with the table's evolved
        # columns), and what its commit adds or widens. Read from the table's log before any claim.
        try:
            self.pipeline, self.layout = run_layout(pipeline, self.target)
        except EvolutionError as exc:
            raise DrainError(f"{cfg.source_file}: pipeline '{pipeline.name}', field 'schema.fields': {exc}") from None
        self.scratch = staging_dir(self.run_id, cfg.lake_dir())  # claim staging of this run, removed at its end
        self.commit_extra: dict = {}  # more commit metadata, set by a source while it settles its batch
        self.evolving = False  # this batch's MERGE adds or widens columns (`_evolve`)
        self.settling = False  # its new columns' types turned messages into dead letters (`_evolve`)
        # Nothing can fail between decode and MERGE: the source counts the batch, no transform pass.
        where = f"{cfg.source_file}: pipeline '{pipeline.name}', field 'transform': "
        self.identity_transform = load_transform(pipeline.transform, where) is identity

    # -- shared steps -----------------------------------------------------------------------------

    def isolate_culprits(self, good, batch: int):
        return isolate_culprits(self.spark, self.pipeline, good, batch, self.run_id, str(self.scratch / "indexed"))

    def settle_culprits(self, culprits):
        """(dead letters out of retries, [(partition, position)] left for another attempt)."""
        raise NotImplementedError

    def _originals(self, keys: list[tuple[str, str]]) -> dict[tuple[str, str], bytes]:
        """The source's bytes of these messages (the staging keeps only bad messages' bytes)."""
        raise NotImplementedError

    def dead_records(self, rows, columns: list[str], error_type: str, error: str, first_of) -> list[tuple]:
        """Claimed rows with `_dd_culprit_error` -> tuples of `columns` for the DLQ: the error, the
        message's original bytes, and when it first failed (`first_of(row)`)."""
        originals = self._originals([(r._dd_partition, r._dd_position) for r in rows])
        out = []
        for r in rows:
            record = r.asDict()
            record.update(_dd_error_type=error_type, _dd_error=f"{error}: {r._dd_culprit_error}",
                          _dd_original=originals.get((r._dd_partition, r._dd_position)),
                          _dd_first_failure_at=first_of(r))
            out.append(tuple(record[c] for c in columns))
        return out

    def refused(self, good, rows, batch: int, reason: str):
        """After the target refused the MERGE of `rows` (Delta's `reason`): (dead letters of the messages
        whose rows break the table's constraints, how many, the rest of `good`). Raises BatchFailure
        when `refused_messages` names none."""
        from pyspark.sql import functions as F

        found, why = refused_messages(self.spark, self.target, rows, self.pipeline.payload_schema.id_field)
        if found is None:
            raise BatchFailure(f"batch {batch}: the target table refused its rows ({why}): {reason}")
        keys = self.spark.createDataFrame(found, "_dd_partition string, _dd_position string, _dd_culprit_error string")
        on = ["_dd_partition", "_dd_position"]
        now = datetime.now(UTC)
        dead = self.dead_records(good.join(F.broadcast(keys), on).collect(), good.columns, "refused",
                                 "the target table refused its row", lambda _: now)
        names = sorted({error for _, _, error in found})
        run_logger(self.summary.pipeline, self.run_id, batch, source=self.pipeline.source.kind).warning(
            "%s", fields(step="refused", messages=len(found), constraints="; ".join(names)[:500]))
        return (self.spark.createDataFrame(dead, good.schema), len(dead),
                good.join(F.broadcast(keys.select(*on)), on, "left_anti"))

    def before_held(self, rows):
        """The rows this commit may hold once culprits are left for another attempt (all of them
        where each message is acknowledged alone, as on Valkey)."""
        return rows

    # -- the run ----------------------------------------------------------------------------------

    def run(self) -> RunSummary:
        started = self._last = time.monotonic()
        abandoned = False
        try:
            self._run()
        except BaseException as exc:
            if abandoned := ended_as_killed(exc):
                self._abandon()
                if failpoints.abandons(exc):
                    raise failpoints.Abandoned(failpoints.ABANDON) from None
            raise
        finally:
            if not abandoned:
                self._end(started)
        return self.summary

    def _abandon(self) -> None:
        """A run stopped as a SIGKILL stops it (failpoints.ABANDON): nothing is cleaned up."""

    def _end(self, started: float) -> None:
        """Every run's end, committed or not: its scratch, cleanup, the last log line and metrics row."""
        self.summary.seconds = round(time.monotonic() - started, 3)
        remove_staging(self.scratch)
        self._finish()
        s = self.summary
        run_logger(s.pipeline, s.run_id, s.batch, source=self.pipeline.source.kind).info(
            "%s", fields(step="end", outcome=s.outcome, claimed=s.claimed, written=s.written,
                         dead_lettered=s.dead_lettered, acked=s.acked, seconds=s.seconds, error=s.error))
        # Best effort (never raises): one row per run in the metrics table, failed runs included.
        record_run_safely(self.spark, self.cfg, self.pipeline, self.summary, backlog=self.backlog_total)

    def _run(self) -> None:
        raise NotImplementedError

    def backlog_total(self) -> int | None:
        """Messages still waiting at the source after the run (for the metrics table), if cheap to know."""
        return None

    def _finish(self) -> None:
        """Best-effort cleanup after every run, committed or not."""

    def no_rows(self):
        """(rows, stats) of a batch without rows: a commit that carries positions or gaps alone."""
        stats = BatchStats(0, 0, None, None, 0) if self.identity_transform else None
        return self.spark.createDataFrame([], claim_schema(self.pipeline)), stats

    def publish(self, claimed, expected: int, oldest, stats: BatchStats | None = None,
                counts: tuple[int, int] | None = None):
        """Claimed rows -> dead letters, then the one MERGE commit of batch `expected + 1` carrying
        `summary.positions`. Returns (CommitResult, [(partition, position)] of culprits left for another
        attempt). Which messages to acknowledge afterwards is the caller's business.

        `stats` comes from the source under the identity transform (`identity_transform`): nothing can
        fail between the decode and the MERGE, so the MERGE reads the claimed rows directly. Any other
        transform runs over the batch once before the commit (`_rows`), so that a message it fails on
        is isolated instead of failing the commit, and that pass counts the batch. `counts`, the staging
        reports' (decoded, dead-letter) rows, spares the passes that would count them again while the
        claimed rows are all still in play."""

        s, p = self.summary, self.pipeline
        batch = expected + 1
        claimed, stats, counts = self._evolve(claimed, stats, counts)
        good, bad = split_claimed(claimed)
        if self.settling:  # before the dead letters that the new columns' types decide
            settle_columns(self.spark, self.target, p, good.schema, self.run_id)
            failpoints.hit("after_settled_columns")
        # A missing table is created by this batch's commit (`NewTable`); a clustered one first by
        # the table builder, which declares its clustering.
        create = None if p.target.cluster_by else NewTable(tuple(p.target.partition_by))
        if create is None:
            ensure_target(self.spark, self.target, p, good.schema, self.run_id)

        pending_culprits: list[tuple[str, str]] = []
        transforming = stats is None
        if transforming:
            rows, stats = self._rows(good, batch)
        else:
            rows = target_rows(good, p, batch, self.run_id)
        self._lap("transform")
        if rows is None:
            # The transform failed on this batch (`stats` is its error): find the messages that make it fail.
            culprits, good = self.isolate_culprits(good, batch)
            if culprits is None:
                raise BatchFailure(f"batch {batch} failed and no single message explains it: {stats}")
            dead_culprits, pending_culprits = self.settle_culprits(culprits)
            s.left_pending = len(pending_culprits)
            bad = self.before_held(bad.unionByName(dead_culprits))
            good = self.before_held(good)
            rows, stats = self._rows(good, batch)
            if rows is None:
                raise BatchFailure(f"batch {batch} still fails without its culprits: {stats}")
            counts = None  # `good` and `bad` are not the claimed split any more

        # Dead letters first: idempotent, so a crash before the target commit only repeats them.
        if stats.bad is not None:
            s.dead_lettered = stats.bad
        else:
            s.dead_lettered = counts[1] if counts is not None else bad.count()
        if s.dead_lettered:
            write_dead_letters(self.spark, self.dlq, dead_letter_rows(bad, p.name, batch, self.run_id))
            failpoints.hit("after_dead_letters")

        self._lap("dead letters")
        failpoints.pause("before_commit")
        refused = 0
        for attempt in (1, 2):
            # Counted before each commit try, over the rows it offers (refusals take some away).
            filtered = self.count_filtered(good, stats, counts[0] if counts is not None else None) if transforming else 0
            meta = commit_metadata(p.name, batch, self.run_id, s.positions, claimed=s.claimed,
                                   dead_lettered=s.dead_lettered, filtered=filtered, **self.commit_extra)
            merged = rows if stats.unique else dedup_in_batch(rows, p.payload_schema.id_field)
            try:
                result = commit_batch(self.spark, self.target, pipeline=p.name, expected_batch=expected,
                                      run_id=self.run_id, rows=merged, id_field=p.payload_schema.id_field,
                                      window_start=dedup_window_start(oldest, p.dedup_window) if oldest is not None else None,
                                      metadata=meta, id_range=stats.id_range, create=create,
                                      evolve=self.evolving)
                break
            except Exception as exc:
                # A constraint the operator put on the target refused rows: the data's fault, like a
                # malformed message. The messages whose rows break a constraint become dead letters
                # naming it, and the rest commits. Rows the constraints do not explain fail the batch,
                # which counts as an attempt (so on Kafka the range is halved down to the row) instead
                # of every run failing on them (a stuck pipeline).
                reason = refused_rows(exc)
                if reason is None:
                    raise
                if attempt == 2:
                    # Refused, so not committed: the dead letters written for the first refusal are
                    # taken back, or a run after a change to the constraints could publish them too.
                    take_back(self.spark, self.dlq, p.name, self.run_id, "refused")
                    raise BatchFailure(f"batch {batch}: the target table refused its rows again without the "
                                       f"{refused} messages its constraints name: {reason}") from exc
                dead, refused, good = self.refused(good, merged, batch, reason)
                counts = None
                write_dead_letters(self.spark, self.dlq, dead_letter_rows(dead, p.name, batch, self.run_id))
                failpoints.hit("after_refused_dead_letters")
                s.dead_lettered += refused
                rows.unpersist()
                rows, stats = self._rows(good, batch)
                if rows is None:
                    take_back(self.spark, self.dlq, p.name, self.run_id, "refused")
                    raise BatchFailure(f"batch {batch} fails without its {refused} refused messages: {stats}") from exc
        rows.unpersist()
        if self.layout.widened and result.outcome in (Outcome.COMMITTED, Outcome.ALREADY_COMMITTED):
            end_widening(self.spark, self.target)
        self._lap("commit")
        s.outcome = result.outcome.value
        if result.outcome in (Outcome.COMMITTED, Outcome.ALREADY_COMMITTED):
            s.written = result.inserted
            s.duplicates_skipped = stats.good - result.inserted
            s.filtered = filtered  # acknowledged with the batch: not before it committed
        return result, pending_culprits

    def _evolve(self, claimed, stats, counts):
        """schema.evolution add_columns: the batch's new columns (from the layout with a schema file; from
        the staged rows for JSON and with a registry, whose messages a column refuses becoming dead
        letters), recorded in the commit metadata with the columns it widens. (claimed, stats, counts),
        the last two dropped when messages became dead letters: the staging reports' counts no longer hold."""
        if self.pipeline.payload_schema.evolution != "add_columns":
            return claimed, stats, counts
        schema = self.pipeline.payload_schema
        added, skipped = dict(self.layout.added), dict(self.layout.skipped)
        self.settling = False
        if schema.collects_new_fields:
            batch = new_columns(claimed, self.layout.evolved, by_writer=schema.format != "json")
            claimed = batch.rows
            added.update(batch.added)
            skipped.update(batch.skipped)
            if batch.widened:  # with a registry: a writer widened an evolved column
                self.layout = replace(self.layout, widened={**self.layout.widened, **batch.widened})
            if batch.moved:
                stats, counts = None, None
                self.settling = bool(batch.added)
        if self.layout.widened:
            allow_widening(self.spark, self.target)
            self.commit_extra["widened_columns"] = {n: f"{a} -> {b}" for n, (a, b) in self.layout.widened.items()}
        elif self.layout.widening_left:  # a widening run died before it ended the feature
            end_widening(self.spark, self.target)
        if added:
            self.commit_extra["added_columns"] = added
        self.evolving = bool(added or self.layout.widened)
        if self.evolving or skipped:
            s = self.summary
            run_logger(s.pipeline, s.run_id, s.batch, source=self.pipeline.source.kind).info(
                "%s", fields(step="schema", added=added or None, widened=self.commit_extra.get("widened_columns"),
                             skipped="; ".join(skipped.values())[:500] or None))
        return claimed, stats, counts

    def refuse(self, result, expected: int) -> None:
        """After a commit that is not ours: name the neighbour, or stop when the table went backwards."""
        s = self.summary
        if result.outcome == Outcome.CONFLICT:
            s.error = (f"batch {expected + 1} was not committed: other writers' commits to {self.target} conflicted "
                       f"with it {CONFLICT_RETRIES + 1} times in a row ({result.conflict}). Nothing was "
                       "acknowledged; the next run takes these messages again")
            raise DrainError(s.error)
        if result.outcome == Outcome.MISMATCH:
            s.error = (f"table {self.target} holds batch {result.observed_batch} of '{self.pipeline.name}', older "
                       f"than the {expected} this run started from: the table was restored or replaced; stop and check")
            raise DrainError(s.error)
        s.error = f"another writer is ahead (table at batch {result.observed_batch}); this run committed nothing"
        if result.conflict:
            s.error += f" ({result.conflict})"

    def count_filtered(self, good, stats: BatchStats, known: int | None = None) -> int:
        """The valid messages the transform kept no row for: one more pass over the staged rows (0.17 s
        per 100 000, bench/filtered_count/filtered_count.py), paid only by pipelines with a transform,
        and only when the staging reports' count (`known`) no longer holds."""
        return filtered_out(good.count() if known is None else known, stats.good)

    def _rows(self, good, batch: int):
        """(transformed rows, cached, and their BatchStats) or (None, error) when the transform fails."""
        from pyspark import StorageLevel

        rows = transformed(target_rows(good, self.pipeline, batch, self.run_id), self.pipeline)
        rows = rows.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            row = rows.agg(*batch_stats_columns(self.pipeline.payload_schema.id_field)).first()
        except DrainError:
            raise
        except Exception as exc:
            failpoints.reraise_abandon(exc)
            rows.unpersist()
            return None, error_line(exc)
        return rows, BatchStats.of(row)

    def _lap(self, step: str) -> None:
        now = time.monotonic()
        self.summary.timings[step] = round(now - self._last, 3)
        self._last = now
        s = self.summary
        run_logger(s.pipeline, s.run_id, s.batch, source=self.pipeline.source.kind).info(
            "%s", fields(step=step, seconds=s.timings[step], claimed=s.claimed or None,
                         dead_lettered=s.dead_lettered or None, outcome=s.outcome))



