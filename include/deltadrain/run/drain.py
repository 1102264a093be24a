"""One drain run, in the contract's order (docs/contract.md, "One drain run").

read checkpoint -> plan -> claim (Spark tasks) -> decode -> dead letters -> MERGE with the checkpoint
-> compare-and-set outcome -> acknowledge (or release and refuse) -> summary. `Drain.run` holds that
order once, for every kind: a source's subclass (`sources/<kind>/drain.py`) supplies the steps that
differ (`plan`, `claim`, `gaps`, `acknowledge`, `settle_culprits`, `originals`, `finish`) and the
capabilities only it has (`run.steps`: `Leases`, `RecordsGaps`, `MirrorsCheckpoint`, `Notices`), and
cannot reorder them. Every step's decision lives in a small module of its own (the rows a run makes:
`run.rows`).
"""

from __future__ import annotations

import abc
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING, Any, Generic, final

from deltadrain import failpoints
from deltadrain.config import DeltadrainConfig, PipelineConfig
from deltadrain.errors import error_line
from deltadrain.formats.changes import KEY
from deltadrain.lake.checkpoint import Checkpoint, commit_metadata, read_checkpoint
from deltadrain.lake.deadletter import take_back, write_dead_letters
from deltadrain.lake.delta import add_missing_columns, exists, refused_rows
from deltadrain.lake.metrics import record_run_safely
from deltadrain.lake.scratch import remove_staging, staging_dir
from deltadrain.logs import fields, run_logger
from deltadrain.paths import command_line
from deltadrain.positions import merge_positions
from deltadrain.run.apply_upsert import UpsertRefused
from deltadrain.run.commit import CONFLICT_RETRIES, NewTable, commit_batch, dedup_window_start
from deltadrain.run.layout import allow_widening, end_widening, new_columns, run_layout
from deltadrain.run.outcome import Outcome
from deltadrain.run.rows import (
    BatchFailure,
    DrainError,
    batch_stats_columns,
    claim_schema,
    dead_letter_rows,
    dedup_in_batch,
    ensure_target,
    filtered_out,
    id_column,
    isolate_culprits,
    refused_messages,
    settle_columns,
    split_claimed,
    target_arrow,
    target_rows,
    transformed,
)
from deltadrain.run.stage import BatchStats
from deltadrain.run.steps import (
    Detail,
    Gaps,
    Leases,
    MirrorsCheckpoint,
    Notices,
    RecordsGaps,
    RunPlan,
    no_message_to_blame,
)
from deltadrain.run.summary import RunSummary, new_run_id
from deltadrain.schema.evolution import EvolutionError
from deltadrain.transforms import identity, load_transform

if TYPE_CHECKING:
    from deltadrain.run.stage import Staged


def go_on_past(cfg: DeltadrainConfig, pipeline: PipelineConfig) -> str:
    """What a run that stops on a gap (on_gap: fail) tells the operator, for either source."""
    return ("Nothing was committed. To go on past them, with the next commit recording them, trigger one run "
            "with Accept gaps (the ingest DAG's parameter; "
            f"`{command_line(f'drain {pipeline.name} --accept-gaps', cfg.source_file)}`) or set on_gap: continue")


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


class Drain(abc.ABC, Generic[Detail]):
    """One run. Construct, then call `run()`; the summary is returned, and printed by the callers.

    `run` is the only entry and holds the order (`_steps`); a subclass supplies the abstract steps,
    may override the hooks (`before_held`, `backlog_total`) and mix in capabilities (`run.steps`), and
    cannot override `run`; its type parameter is the source's own plan (`RunPlan.detail`). The parts
    that need Spark and the lake (`read_checkpoint`, `publish`, `record_metrics`) are methods too: a
    test of the order stands them in (tests/unit/test_drain_order.py)."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if {"run", "_steps"} & set(vars(cls)):
            raise TypeError(f"{cls.__name__} overrides Drain.run: a source supplies the steps, Drain keeps their order")

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
        self.failed_on_batch = False  # publish raised BatchFailure: the batch's messages caused it
        # Nothing can fail between decode and MERGE: the source counts the batch, no transform pass.
        where = f"{cfg.source_file}: pipeline '{pipeline.name}', field 'transform': "
        self.identity_transform = load_transform(pipeline.transform, where) is identity

    # -- the steps a source supplies --------------------------------------------------------------

    @abc.abstractmethod
    def plan(self, checkpoint: Checkpoint) -> RunPlan[Detail]:
        """What this run claims after `checkpoint`: reads of the source only, nothing claimed (the
        batch cap, what runs that died left, the source's gaps)."""

    @abc.abstractmethod
    def claim(self, plan: RunPlan[Detail]) -> Staged:
        """Claim and stage the planned batch in exactly one job (no later step goes back to the
        source for it); counts what it took over again in `summary.reclaimed`."""

    @abc.abstractmethod
    def gaps(self, plan: RunPlan[Detail], staged: Staged | None) -> Gaps:
        """The gaps this run meets: before its claim (`staged` None) and after it."""

    @abc.abstractmethod
    def acknowledge(self, plan: RunPlan[Detail], staged: Staged | None, keep: frozenset[tuple[str, str]]) -> int:
        """After a committed (or already committed) batch: acknowledge what it holds, the messages of
        `staged` (None: the commit carried positions or gaps alone) but the culprits in `keep`, left
        for another attempt; `summary.positions` is the checkpoint committed. Returns how many."""

    @abc.abstractmethod
    def settle_culprits(self, culprits):
        """(dead letters out of retries, [(partition, position)] left for another attempt): where a
        failing message's attempts are counted differs per source."""

    @abc.abstractmethod
    def originals(self, keys: list[tuple[str, str]]) -> dict[tuple[str, str], bytes]:
        """The source's bytes of these messages (the staging keeps only bad messages' bytes)."""

    @abc.abstractmethod
    def finish(self) -> None:
        """Best-effort cleanup after every run, committed or not, unless it ended as killed."""

    # -- hooks (optional) -------------------------------------------------------------------------

    def before_held(self, rows):
        """The rows this commit may hold once culprits are left for another attempt (all of them
        where each message is acknowledged alone, as on Valkey)."""
        return rows

    def backlog_total(self) -> int | None:
        """Messages still waiting at the source after the run (for the metrics table), if cheap to know."""
        return None

    # -- the run ----------------------------------------------------------------------------------

    @final
    def run(self) -> RunSummary:
        """The run, in the contract's order (`_steps`); a run that ends as killed cleans nothing up."""
        started = self._last = time.monotonic()
        abandoned = False
        try:
            self._steps()
        except BaseException as exc:
            if (abandoned := ended_as_killed(exc)) and isinstance(self, Notices):
                self.settle_notices()  # nothing else: a run stopped as a SIGKILL stops it cleans nothing up
            if abandoned and failpoints.abandons(exc):
                raise failpoints.Abandoned(failpoints.ABANDON) from None
            raise
        finally:
            if not abandoned:
                self._end(started)
        return self.summary

    def _steps(self) -> None:
        s, on_gap = self.summary, self.pipeline.source.on_gap
        checkpoint = self.read_checkpoint()
        expected = checkpoint.batch
        s.batch = expected + 1
        plan = self.plan(checkpoint)
        self._lap("checkpoint")
        if on_gap == "fail":  # before anything is claimed
            self._stop_at(self.gaps(plan, None), plan, expected)
        staged = self._claim(plan) if plan.claims else None
        gaps = self.gaps(plan, staged)  # the claim may find more (Valkey: entries deleted while pending)
        self._report(gaps)
        if on_gap == "fail":
            self._stop_at(gaps, plan, expected, staged)
        elif gaps:
            self.commit_extra["gaps"] = gaps.ranges
        batch = staged if s.claimed else None  # what the commit holds (a claim may take nothing)
        # The checkpoint never stays behind a message the batch holds.
        s.positions = merge_positions(plan.positions, batch.positions) if batch is not None else dict(plan.positions)
        if not (s.claimed or gaps or plan.commits_alone):
            s.batch, s.positions = expected, dict(plan.start)
            if isinstance(self, MirrorsCheckpoint):
                self.mirror_checkpoint(s.positions)
            return
        try:
            result, pending = self.publish(batch, expected)
        except BatchFailure:
            self.failed_on_batch = True
            raise
        if result.outcome in (Outcome.COMMITTED, Outcome.ALREADY_COMMITTED):
            if isinstance(self, RecordsGaps):
                self.forget_gaps(gaps)  # the commit's metadata holds them now
            failpoints.hit("after_commit")
            failpoints.pause("after_commit")
            s.acked = self.acknowledge(plan, batch, frozenset(pending))  # invariant 4: after the commit
            self._lap("ack")
            return
        # Another writer is ahead, or the table went backwards: acknowledge nothing (invariant 5).
        if staged is not None and isinstance(self, Leases):
            s.released = self.release(staged)
        self.refuse(result, expected)

    def _claim(self, plan: RunPlan[Detail]) -> Staged:
        s = self.summary
        try:
            staged = self.claim(plan)
        except Exception as exc:
            if isinstance(self, Leases) and no_message_to_blame(exc):
                # The next run reclaims them whole, and a long outage convicts no message of killing runs.
                s.released = self.hand_back()
            raise
        failpoints.hit("after_claim")
        failpoints.pause("after_claim")
        self._lap("claim")
        s.claimed = staged.total.rows
        return staged

    def _report(self, gaps: Gaps) -> None:
        """Every gap this run meets goes into the summary and the log (and, under on_gap: continue,
        into its commit's metadata)."""
        s = self.summary
        s.gap_ranges, s.gaps = list(gaps.ranges), gaps.missing
        log = run_logger(s.pipeline, s.run_id, s.batch, source=self.pipeline.source.kind)
        for gap in gaps.ranges:
            log.warning("%s", fields(step="gap", **gap))

    def _stop_at(self, gaps: Gaps, plan: RunPlan[Detail], expected: int, staged: Staged | None = None) -> None:
        """on_gap: fail. A run that meets a gap commits nothing: it releases what it claimed and stops
        with an error naming the gaps (status and the Airflow view show them until a run under
        on_gap: continue carries them in its commit)."""
        if not gaps:
            return
        s = self.summary
        if staged is not None and isinstance(self, Leases):
            s.released = self.release(staged)
        s.batch, s.positions = expected, dict(plan.start)
        s.gap_ranges, s.gaps = list(gaps.ranges), gaps.missing
        s.error = f"{gaps.said}. {go_on_past(self.cfg, self.pipeline)}"
        raise DrainError(s.error)

    def _end(self, started: float) -> None:
        """Every run's end, committed or not: its scratch, cleanup, the last log line and metrics row."""
        self.summary.seconds = round(time.monotonic() - started, 3)
        remove_staging(self.scratch)
        self.finish()
        s = self.summary
        run_logger(s.pipeline, s.run_id, s.batch, source=self.pipeline.source.kind).info(
            "%s", fields(step="end", outcome=s.outcome, claimed=s.claimed, written=s.written,
                         dead_lettered=s.dead_lettered, acked=s.acked, seconds=s.seconds, error=s.error))
        self.record_metrics()

    # -- what needs the lake and Spark ------------------------------------------------------------

    def read_checkpoint(self) -> Checkpoint:
        """The target's checkpoint: the last batch committed and the positions it covered."""
        return read_checkpoint(self.spark, self.target, self.pipeline.name, self.dlq, self.quarantine)

    def record_metrics(self) -> None:
        """Best effort (never raises): one row per run in the metrics table, failed runs included."""
        record_run_safely(self.spark, self.cfg, self.pipeline, self.summary, backlog=self.backlog_total)

    def isolate_culprits(self, good, batch: int):
        return isolate_culprits(self.spark, self.pipeline, good, batch, self.run_id, str(self.scratch / "indexed"))

    def dead_records(self, rows, columns: list[str], error_type: str, error: str, first_of) -> list[tuple]:
        """Claimed rows with `_dd_culprit_error` -> tuples of `columns` for the DLQ: the error, the
        message's original bytes, and when it first failed (`first_of(row)`)."""
        originals = self.originals([(r._dd_partition, r._dd_position) for r in rows])
        out = []
        for r in rows:
            record = r.asDict()
            record.update(_dd_error_type=error_type, _dd_error=f"{error}: {r._dd_culprit_error}",
                          _dd_original=originals.get((r._dd_partition, r._dd_position)),
                          _dd_first_failure_at=first_of(r))
            out.append(tuple(record[c] for c in columns))
        return out

    def refused(self, good, rows, batch: int, reason: str, named: tuple[list | None, str] | None = None):
        """After the target refused the MERGE of `rows` (Delta's `reason`): (dead letters of the messages
        whose rows break the table's constraints, how many, the rest of `good`). `named`: what
        `refused_messages` gave already (an upsert's, over the rows its MERGE writes). Raises BatchFailure
        when `refused_messages` names none."""
        from pyspark.sql import functions as F

        found, why = named or refused_messages(self.spark, self.target, rows, self.pipeline.payload_schema.id_field)
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

    def no_rows(self):
        """(rows, stats) of a batch without rows: a commit that carries positions or gaps alone."""
        stats = BatchStats(0, 0, None, None, 0) if self.identity_transform else None
        return self.spark.createDataFrame([], claim_schema(self.pipeline)), stats

    def publish(self, staged: Staged | None, expected: int):
        """The staged batch (None: a commit that carries positions or gaps alone) -> dead letters, then
        the one MERGE commit of batch `expected + 1` carrying `summary.positions`. Returns (CommitResult,
        [(partition, position)] of culprits left for another attempt). Which messages to acknowledge
        afterwards is `run`'s business.

        Under the identity transform (`identity_transform`) the staging reports' stats stand: nothing can
        fail between the decode and the MERGE, so the MERGE reads the claimed rows directly. Any other
        transform runs over the batch once before the commit (`_rows`), so that a message it fails on
        is isolated instead of failing the commit, and that pass counts the batch. The staging reports'
        (decoded, dead-letter) `counts` spare the passes that would count them again while the
        claimed rows are all still in play."""

        s, p = self.summary, self.pipeline
        batch = expected + 1
        if staged is not None:
            claimed, oldest = staged.rows(self.spark), staged.total.oldest
            stats = staged.stats() if self.identity_transform else None
            counts = (staged.total.good, staged.total.bad)
        else:
            (claimed, stats), oldest, counts = self.no_rows(), None, None
        staged_claimed = claimed
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
        events: Callable[[], Any] | None = None  # the upsert decision's rows, read here without a Spark job
        if transforming:
            rows, stats = self._rows(good, batch)
        else:
            now = datetime.now(UTC)
            rows = target_rows(good, p, batch, self.run_id, now)
            if p.upsert and staged is not None and staged.here and claimed is staged_claimed:
                events = partial(target_arrow, staged, batch, self.run_id, now)
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
            merged, named = rows, None
            try:
                if p.upsert:
                    result, filtered = self._commit_changes(rows, expected, stats, create, events), 0
                    break
                # Counted before each commit try, over the rows it offers (refusals take some away).
                filtered = self.count_filtered(good, stats, counts[0] if counts is not None else None) if transforming else 0
                meta = commit_metadata(p.name, batch, self.run_id, s.positions, claimed=s.claimed,
                                       dead_lettered=s.dead_lettered, filtered=filtered, **self.commit_extra)
                merged = rows if stats.unique else dedup_in_batch(rows, p.payload_schema.id_field)
                result = commit_batch(self.spark, self.target, pipeline=p.name, expected_batch=expected,
                                      run_id=self.run_id, rows=merged, id_field=p.payload_schema.id_field,
                                      window_start=dedup_window_start(oldest, p.dedup_window) if oldest is not None else None,
                                      metadata=meta, id_range=stats.id_range, create=create,
                                      evolve=self.evolving)
                break
            except Exception as exc:
                # A constraint the operator put on the target refused rows: the data's fault, like a
                # malformed message. The messages whose rows break a constraint become dead letters
                # naming it, and the rest commits (an upsert target's batch is decided again without
                # them). Rows the constraints do not explain fail the batch, which counts as an attempt
                # (so on Kafka the range is halved down to the row) instead of every run failing on
                # them (a stuck pipeline).
                reason = refused_rows(exc)
                if reason is None:
                    raise
                named = exc.named if isinstance(exc, UpsertRefused) else None
                if attempt == 2:
                    # Refused, so not committed: the dead letters written for the first refusal are
                    # taken back, or a run after a change to the constraints could publish them too.
                    take_back(self.spark, self.dlq, p.name, self.run_id, "refused")
                    raise BatchFailure(f"batch {batch}: the target table refused its rows again without the "
                                       f"{refused} messages its constraints name: {reason}") from exc
                dead, refused, good = self.refused(good, merged, batch, reason, named)
                counts = None
                write_dead_letters(self.spark, self.dlq, dead_letter_rows(dead, p.name, batch, self.run_id))
                failpoints.hit("after_refused_dead_letters")
                s.dead_lettered += refused
                rows.unpersist()
                rows, stats = self._rows(good, batch)
                events = None
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

    def _commit_changes(self, rows, expected: int, stats: BatchStats, create: NewTable | None, events=None):
        """Upsert mode's commit (deltadrain.run.apply_upsert): each key's newest change, in the batch's one MERGE
        with its positions, or in the commit that creates the table (`create`: the MERGE's effect on an empty
        table is to insert the upserts). `events`: a callable giving `rows` as Arrow, computed here. Raises
        UpsertRefused when the target's constraints refuse rows it writes."""
        from deltadrain.run.apply_upsert import EFFECT, Survey, TruncateRefused, prepare
        from deltadrain.run.upsert import Effect

        s, p = self.summary, self.pipeline
        batch = expected + 1
        # The staging counted the batch's changes: without a truncate (whose place only Spark's survey
        # reads) that is the survey.
        seen = None
        if stats.changes is not None and not stats.changes[1]:
            seen = Survey(stats.id_range, (), stats.changes[0], stats.changes[2])
        try:
            decided = prepare(self.spark, rows, pipeline=p, target=self.target,
                              tombstones=str(self.cfg.tombstones_path(p)), batch=batch, run_id=self.run_id,
                              now=datetime.now(UTC), seen=seen, size=stats.good, events=events)
        except TruncateRefused as exc:
            s.error = str(exc)
            raise DrainError(s.error) from None
        try:
            failpoints.hit("after_tombstones")
            self._lap("decide")
            if exists(self.target):  # schema.evolution
                add_missing_columns(self.spark, self.target, decided.source.drop(EFFECT).schema)
            meta = commit_metadata(p.name, batch, self.run_id, s.positions, claimed=s.claimed,
                                   dead_lettered=s.dead_lettered, **self.commit_extra)
            result = commit_batch(self.spark, self.target, pipeline=p.name, expected_batch=expected,
                                  run_id=self.run_id, rows=decided.source, id_field=KEY, window_start=None,
                                  metadata=meta, upsert=(decided.condition, decided.clauses), create=create,
                                  first_rows=decided.upserts())
        except Exception as exc:
            if refused_rows(exc) is None:
                raise
            # The rows the MERGE writes are the batch's upserts: a constraint is checked on those alone.
            written = decided.source.where(f"{EFFECT} = '{Effect.UPSERT.value}'")
            raise UpsertRefused(exc, refused_messages(self.spark, self.target, written, KEY, updating=True)) from exc
        finally:
            decided.release()
        return result

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
            row = rows.agg(*batch_stats_columns(id_column(self.pipeline))).first()
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


