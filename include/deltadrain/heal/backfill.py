"""Backfill: heal an interval of the target from the source's retained history.

A backfill run re-reads what the source still holds for [start, end) and MERGEs it insert-only on
the message id, like a drain, with three differences that keep the live pipeline untouched: it
claims nothing (XRANGE, not XREADGROUP), acknowledges nothing, and commits without the pipeline's
SetTransaction, so the live checkpoint does not move. Its rows carry batch 0 (drained batches
start at 1). Running it
twice, or beside a live drain, inserts each message id once. An upsert target's backfill applies the
interval's changes as a drain's batch is decided (each key's newest, only where newer than what the table
holds or remembers), so it heals a lost row and never rolls one back.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime

from deltadrain.config import DeltadrainConfig, PipelineConfig
from deltadrain.errors import DeltadrainError, error_line
from deltadrain.lake.deadletter import write_dead_letters
from deltadrain.lake.delta import (
    changed_rows,
    is_table,
    merge_into,
    of_table,
    recent_commits,
    refused_rows,
    retry_conflicts,
    sql_name,
    table_id,
)
from deltadrain.lake.scratch import remove_staging, staging_dir
from deltadrain.run.commit import dedup_window_start
from deltadrain.sources import source_of

NO_BATCH = 0  # the batch number of rows a backfill inserts (a reprocess keeps a row's); drained batches start at 1


class BackfillError(DeltadrainError):
    pass


@dataclass
class BackfillSummary:
    pipeline: str
    run_id: str
    start: str
    end: str
    read: int = 0
    written: int = 0
    duplicates_skipped: int = 0
    dead_lettered: int = 0
    skipped_failing: list = field(default_factory=list)  # transform failures: left to the live drain
    skipped_refused: list = field(default_factory=list)  # rows the target's constraints refuse: not merged
    skipped_quarantined: int = 0  # messages a batch check moved to the quarantine: not put back
    skipped_dead_lettered: int = 0  # messages the DLQ holds (dead or replayed): the replay is their way back
    skipped_truncates: int = 0  # an upsert target's truncates in the interval: not applied by a backfill
    filtered: int = 0  # valid messages the transform kept no row for
    gaps: list = field(default_factory=list)
    acked: int = 0  # always 0: a backfill never acknowledges
    table_version: int | None = None
    seconds: float = 0.0
    mode: str = "backfill"

    def line(self) -> str:
        return json.dumps(asdict(self), default=str)


def check_interval(start: datetime, end: datetime) -> tuple[datetime, datetime]:
    if start.tzinfo is None or end.tzinfo is None:
        raise BackfillError("backfill interval bounds must carry a time zone")
    if not start < end:
        raise BackfillError(f"backfill interval is empty or inverted: start {start} is not before end {end}")
    return start.astimezone(UTC), end.astimezone(UTC)


def prepare_rows(spark, pipeline: PipelineConfig, claimed, run_id: str, scratch):
    """History rows -> (transformed good rows, bad rows, [(partition, position, error)] of rows the
    transform fails on). Malformed rows are data (the DLQ); transform failures are left alone."""
    from deltadrain.run.rows import isolate_culprits, split_claimed, target_rows, transformed

    good, bad = split_claimed(claimed)

    def build(df):
        return transformed(target_rows(df, pipeline, NO_BATCH, run_id), pipeline)

    rows = build(good).cache()
    try:
        rows.count()
        return rows, bad, []
    except DeltadrainError:
        raise
    except Exception as exc:
        rows.unpersist()
        first_error = error_line(exc)
    culprits, rest = isolate_culprits(spark, pipeline, good, NO_BATCH, run_id, str(scratch / "indexed"))
    if culprits is None:
        raise BackfillError(f"the transform fails on this range and no single message explains it: {first_error}")
    skipped = [(r._dd_partition, r._dd_position, r._dd_culprit_error)
               for r in culprits.select("_dd_partition", "_dd_position", "_dd_culprit_error").collect()]
    rows = build(rest).cache()
    rows.count()
    return rows, bad, skipped


def merge_without_checkpoint(spark, target: str, rows, pipeline: PipelineConfig, metadata: dict, *,
                             window_start: datetime | None,
                             update_matched: list[str] | None = None) -> tuple[dict, list[tuple[str, str, str]]]:
    """MERGE on the message id with commit metadata but no SetTransaction: the live checkpoint
    stays where it is. Insert-only, or (reprocess) updating the given columns of the rows matched on
    the id at the same place (partition and position).
    Idempotent, so a lost race is simply retried. Returns the commit's metrics and the messages
    (partition, position, constraint) left out of it because the target's constraints refuse their
    rows: history, like a transform failure here, not dead letters."""
    from deltadrain.run.commit import merge_condition
    from deltadrain.run.rows import dedup_in_batch

    id_field = pipeline.payload_schema.id_field
    condition = merge_condition(id_field, window_start)
    if update_matched:
        # A reprocessed message updates the row it was published as: an id the target holds twice
        # (repeated beyond dedup_window) is two messages, each re-read and matched at its own place.
        condition += " AND t._dd_partition = s._dd_partition AND t._dd_position = s._dd_position"
        clauses = "WHEN MATCHED THEN UPDATE SET " + ", ".join(f"{sql_name(c)} = s.{sql_name(c)}" for c in update_matched)
    else:
        clauses = "WHEN NOT MATCHED THEN INSERT *"

    def unique(df):
        # An insert keeps one row per id; an update one per id and place (a place read twice, or a
        # transform that gives one message's id twice, must not match one target row twice).
        return dedup_in_batch(df, id_field, by_place=bool(update_matched))

    def merge(source) -> None:
        # An insert's rows deduplicated again after a refusal, so a later message with a refused one's id takes
        # its place.
        source = unique(source)
        try:
            merge_into(spark, target, source, condition, clauses)
        except Exception as exc:
            problem = refusal(spark, target, exc, source, id_field, updating=bool(update_matched))
            if problem is exc:
                raise
            raise problem from exc

    refused = merge_leaving_refused(spark, rows, metadata, merge)
    return commit_metrics(target, metadata["run_id"]), refused


def commit_metrics(target: str, run_id: str) -> dict:
    """The version and metrics of run `run_id`'s commit to `target` ({} when none of the newest is)."""
    for commit in recent_commits(target, 20):
        if (commit["meta"] or {}).get("run_id") == run_id:
            return {"version": commit["version"], **{k: int(v) for k, v in commit["metrics"].items()
                                                     if str(v).isdigit()}}
    return {}


def upsert_without_checkpoint(spark, cfg: DeltadrainConfig, pipeline: PipelineConfig, rows, metadata: dict,
                              summary: BackfillSummary) -> tuple[dict, list[tuple[str, str, str]]]:
    """An upsert target's backfill commit: the interval's changes decided as a drain's batch is
    (deltadrain.run.apply_upsert: each key's newest, applied only where newer than what the table holds or
    remembers, so history never rolls a row back), its deletes remembered, one MERGE without the
    pipeline's SetTransaction. A conflict decides again from the tables as they are then. A truncate is
    left out and counted (`skipped_truncates`): it empties the table at its place in the source, which a
    backfill, applying changes per key, cannot redo without deleting rows written after it. Returns the
    commit's metrics and the messages (partition, position, constraint) the target's constraints refuse,
    left out as in insert mode."""
    from pyspark.sql import functions as F

    from deltadrain.formats.changes import CHANGE, KEY, TRUNCATE
    from deltadrain.run.apply_upsert import EFFECT, prepare
    from deltadrain.run.upsert import Effect

    target = str(cfg.target_path(pipeline))
    changes = rows.where(F.col(CHANGE) != TRUNCATE)
    summary.skipped_truncates = rows.where(F.col(CHANGE) == TRUNCATE).count()

    def merge(source) -> None:
        decided = prepare(spark, source, pipeline=pipeline, target=target, tombstones=str(cfg.tombstones_path(pipeline)),
                          batch=NO_BATCH, run_id=metadata["run_id"], now=datetime.now(UTC))
        try:
            merge_into(spark, target, decided.source, decided.condition, decided.clauses)
        except Exception as exc:
            # The rows the MERGE writes are the upserts: a constraint is checked on those alone.
            written = decided.source.where(f"{EFFECT} = '{Effect.UPSERT.value}'")
            problem = refusal(spark, target, exc, written, KEY, updating=True)
            if problem is exc:
                raise
            raise problem from exc
        finally:
            decided.release()

    refused = merge_leaving_refused(spark, changes, metadata, merge)
    return commit_metrics(target, metadata["run_id"]), refused


def merge_leaving_refused(spark, rows, metadata: dict, merge) -> list[tuple[str, str, str]]:
    """`merge(rows)` with `metadata` as its commit's, retried when it loses a race; when the target's constraints
    refuse rows (`merge` raises Refused, naming their messages), once more without those messages. Returns the
    messages (partition, position, constraint) left out."""
    from pyspark.sql import functions as F

    from deltadrain.run.commit import USER_METADATA

    text = json.dumps(metadata, sort_keys=True, default=str)

    def attempt(source) -> None:
        spark.conf.set(USER_METADATA, text)
        try:
            merge(source)
        finally:
            spark.conf.unset(USER_METADATA)

    try:
        retry_conflicts(lambda: attempt(rows))
        return []
    except Refused as first:
        keys = spark.createDataFrame([r[:2] for r in first.named], "_dd_partition string, _dd_position string")
        try:
            retry_conflicts(lambda: attempt(rows.join(F.broadcast(keys), ["_dd_partition", "_dd_position"],
                                                      "left_anti")))
        except Refused as again:
            raise BackfillError(f"the target table refused rows again without the {len(first.named)} its "
                                f"constraints name: {again.reason}") from again
        return first.named


def refusal(spark, target: str, exc: Exception, written, id_field: str, *, updating: bool) -> Exception:
    """What an error of a MERGE of `written` into `target` is: Refused naming the messages the target's
    constraints refuse (refused_messages), BackfillError when they name none, or `exc` itself when it is no
    refusal."""
    from deltadrain.run.rows import refused_messages

    reason = refused_rows(exc)
    if reason is None:
        return exc
    named, why = refused_messages(spark, target, written, id_field, updating=updating)
    if named is None:
        return BackfillError(f"the target table refused rows ({why}): {reason}")
    return Refused(named, reason)


class Refused(Exception):
    """A backfill's MERGE was refused by the target's constraints (Delta's `reason`): `named` the messages they
    name."""

    def __init__(self, named: list[tuple[str, str, str]], reason: str):
        super().__init__(f"{len(named)} messages refused: {reason}")
        self.named, self.reason = named, reason


def without_held(spark, rows, table: str, partition: str = "_dd_partition", position: str = "_dd_position",
                 target_id: str | None = None):
    """`rows` minus the messages (partition and position) `table` holds, where it has those columns
    under the names given. An id sent again (a new position) is a new message and stays. For the
    quarantine, `target_id`: only the rows moved out of that target table (lake.of_table)."""
    if not is_table(spark, table):
        return rows
    held = (of_table(spark.read.format("delta").load(table), target_id)
            .selectExpr(f"{partition} AS _dd_partition", f"{position} AS _dd_position").distinct())
    return rows.join(held, ["_dd_partition", "_dd_position"], "left_anti")


def offered_rows(rows) -> tuple[int, datetime | None]:
    """(how many rows, their oldest source time, UTC) in one pass; times as epoch microseconds, so
    that no Python time zone comes into it."""
    from pyspark.sql import functions as F

    got = rows.agg(F.count("*").alias("n"), F.min(F.unix_micros("_dd_source_ts")).alias("oldest")).first()
    oldest = None if got.oldest is None else datetime.fromtimestamp(got.oldest / 1_000_000, UTC)
    return int(got.n), oldest


STEPS = ("read history", "dead letters", "merge")


def with_table_columns(cfg: DeltadrainConfig, pipeline: PipelineConfig) -> PipelineConfig:
    """The pipeline as a backfill or reprocess reads it: with schema.evolution add_columns, the table's
    evolved columns are filled too (deltadrain.run.layout.run_layout); none is added."""
    from deltadrain.run.layout import run_layout
    from deltadrain.schema.evolution import EvolutionError

    try:
        return run_layout(pipeline, str(cfg.target_path(pipeline)), adding=False)[0]
    except EvolutionError as exc:
        raise BackfillError(f"{cfg.source_file}: pipeline '{pipeline.name}', field 'schema.fields': {exc}") from None


def backfill(cfg: DeltadrainConfig, pipeline: PipelineConfig, spark, start: datetime, end: datetime,
             run_id: str | None = None, progress=None) -> BackfillSummary:
    """Heal [start, end) of the target from the source's retained history. `progress(step)` is called
    as each of STEPS is done (the CLI's progress bar)."""
    from deltadrain.run.rows import dead_letter_rows, ensure_target, filtered_out, split_claimed
    from deltadrain.run.summary import new_run_id

    start, end = check_interval(start, end)
    pipeline = with_table_columns(cfg, pipeline)
    run_id = run_id or new_run_id()
    summary = BackfillSummary(pipeline.name, run_id, start.isoformat(), end.isoformat())
    began = time.monotonic()
    done_steps: set[str] = set()

    def step(name: str) -> None:
        if progress is not None and name not in done_steps:
            done_steps.add(name)
            progress(name)

    scratch = staging_dir(run_id, cfg.lake_dir())
    try:
        claimed, summary.gaps = source_of(pipeline).read_interval(spark, cfg, pipeline, start, end, scratch)
        summary.read = claimed.count()
        # A dead letter is out of the target on purpose (a poison message that killed runs, a transform
        # failure). Decoded afresh with the transform since fixed it would be inserted beside its DEAD
        # row, for a later replay to send again; a replayed one was sent back already.
        kept = without_held(spark, claimed, str(cfg.dlq_path(pipeline)), "partition", "position")
        if kept is not claimed:
            claimed, summary.skipped_dead_lettered = kept, summary.read - kept.count()
        step("read history")
        if summary.read > summary.skipped_dead_lettered:
            rows, bad, skipped = prepare_rows(spark, pipeline, claimed, run_id, scratch)
            summary.skipped_failing = [{"partition": p, "position": pos, "error": e} for p, pos, e in skipped]
            summary.filtered = filtered_out(split_claimed(claimed)[0].count() - len(skipped), rows.count())
            summary.dead_lettered = bad.count()
            if summary.dead_lettered:
                # The DLQ MERGE on (partition, position) keeps them single whoever writes them first.
                write_dead_letters(spark, str(cfg.dlq_path(pipeline)),
                                   dead_letter_rows(bad, pipeline.name, NO_BATCH, run_id))
            step("dead letters")
            target = str(cfg.target_path(pipeline))
            ensure_target(spark, target, pipeline, claimed.schema, run_id)
            # Quarantined messages re-read are the same messages: put back, only the whole-table check
            # (which never quarantines) would see them again.
            kept = without_held(spark, rows, str(cfg.quarantine_path(pipeline)), target_id=table_id(target))
            offered, oldest = offered_rows(kept)
            summary.skipped_quarantined = 0 if kept is rows else rows.count() - offered
            if offered:
                meta = {"deltadrain": 1, "pipeline": pipeline.name, "kind": "backfill", "run_id": run_id,
                        "interval": [start.isoformat(), end.isoformat()]}
                if pipeline.upsert:
                    metrics, refused = upsert_without_checkpoint(spark, cfg, pipeline, kept, meta, summary)
                    summary.written = changed_rows(metrics)
                else:
                    # From the oldest source time among the rows, as a drain's window: a Kafka record can be
                    # stamped (CreateTime) long before the interval its offset lies in.
                    metrics, refused = merge_without_checkpoint(
                        spark, target, kept, pipeline, meta,
                        window_start=dedup_window_start(min(start, oldest or start), pipeline.dedup_window))
                    summary.written = metrics.get("numTargetRowsInserted", 0)
                summary.skipped_refused = [{"partition": p, "position": pos, "error": e} for p, pos, e in refused]
                summary.table_version = metrics.get("version")
                summary.duplicates_skipped = offered - summary.written - len(refused)
            rows.unpersist()
        step("merge")
    finally:
        remove_staging(scratch)
        summary.seconds = round(time.monotonic() - began, 3)
    return summary
