"""Drain runs: one (`drain`, by the pipeline's source), or several in one Spark session while full
batches wait (catch-up: `drain_batches`).

Each batch is a complete drain run (its own checkpoint read, claim, commit and acknowledgement),
so the protocol is the same as for one batch; only the JVM start and the cold first batch are paid
once per task instead of once per batch. `next_batch` decides, purely, whether to go on.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field

from deltadrain.config import DeltadrainConfig, PipelineConfig
from deltadrain.logs import run_logger
from deltadrain.run.summary import RunSummary, new_run_id
from deltadrain.sources import source_of

SUMMED = ("claimed", "reclaimed", "written", "duplicates_skipped", "dead_lettered", "left_pending", "filtered",
          "acked", "released", "gaps")
DONE = ("committed", "already_committed")


def drain(cfg: DeltadrainConfig, pipeline: PipelineConfig, spark=None, run_id: str | None = None) -> RunSummary:
    """One drain run of `pipeline`, by its source (a Spark session of its own unless given)."""
    if spark is None:
        from deltadrain.runtime.session import get_spark

        spark = get_spark(f"deltadrain-drain-{pipeline.name}", cfg=cfg)
    return source_of(pipeline).drain(cfg, pipeline, spark, run_id)


def next_batch(last: RunSummary, batch_cap: int, done: int, elapsed_s: float, max_batches: int,
               max_seconds: float) -> str | None:
    """None to drain another batch, else why the task stops here."""
    if last.outcome not in DONE or last.error:
        return f"the last batch ended {last.outcome}" + (" with an error" if last.error else "")
    if last.claimed < batch_cap and not last.dead_runs:  # a batch narrowed after dead runs is short on purpose
        return "the last batch was not full: the backlog is drained"
    if done >= max_batches:
        return f"max_batches_per_run ({max_batches}) reached"
    if elapsed_s >= max_seconds:
        return f"max_drain_time ({max_seconds:.0f} s) reached"
    return None


def batch_run_id(run_id: str, index: int) -> str:
    """The first batch keeps the task's run id; later ones get a suffix (consumers, staging, metrics)."""
    return run_id if index == 0 else f"{run_id}-{index + 1}"


@dataclass
class CatchUp:
    runs: list[RunSummary]
    stopped: str
    later_error: str | None = None  # a batch after the first one failed: the batches before it stand
    batches: list[int] = field(default_factory=list)

    def as_dict(self) -> dict:
        """The last run's summary with the counts summed over the task's batches, the batches to check
        and why it stopped. With one batch: that batch's summary plus `batches` and `stopped`."""
        # A trailing empty run (the backlog was exactly full batches) does not hide the last commit.
        last = next((r for r in reversed(self.runs) if r.outcome in DONE), self.runs[-1])
        out = asdict(last)
        if len(self.runs) > 1:
            for key in SUMMED:
                out[key] = sum(getattr(r, key) for r in self.runs)
            out["seconds"] = round(sum(r.seconds for r in self.runs), 3)
            out["gap_ranges"] = [g for r in self.runs for g in r.gap_ranges]
            out["runs"] = [{"batch": r.batch, "run_id": r.run_id, "outcome": r.outcome, "claimed": r.claimed,
                            "written": r.written, "seconds": r.seconds, "timings": r.timings} for r in self.runs]
        out.update(batches=self.batches, stopped=self.stopped, later_error=self.later_error)
        return out

    def line(self) -> str:
        return json.dumps(self.as_dict(), default=str)


def drain_batches(cfg: DeltadrainConfig, pipeline: PipelineConfig, spark, run_id: str | None = None,
                  max_batches: int | None = None, max_seconds: float | None = None) -> CatchUp:
    """Drain batch after batch while `next_batch` says so. The first batch's failure is the task's
    (raised); a later one stops the task with the batches before it committed and reported, and
    the next task meets it first."""
    af = pipeline.airflow
    max_batches = max_batches or af.max_batches_per_run
    max_seconds = max_seconds if max_seconds is not None else af.max_drain_time.total_seconds()
    run_id = run_id or new_run_id()
    started = time.monotonic()
    runs: list[RunSummary] = []
    while True:
        this_id = batch_run_id(run_id, len(runs))
        try:
            s = drain(cfg, pipeline, spark=spark, run_id=this_id)
        except Exception as exc:
            if not runs:
                raise
            error = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:300]}"
            run_logger(pipeline.name, this_id).warning("catch-up stopped: a later batch failed: %s", error)
            return _done(runs, "a later batch failed", error)
        runs.append(s)
        stop = next_batch(s, pipeline.batch_cap, len(runs), time.monotonic() - started, max_batches, max_seconds)
        if stop is not None:
            return _done(runs, stop)


def _done(runs: list[RunSummary], stopped: str, later_error: str | None = None) -> CatchUp:
    batches = [r.batch for r in runs if r.outcome in DONE and r.batch]
    return CatchUp(runs, stopped, later_error, batches)
