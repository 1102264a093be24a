"""A drain task's figures as metrics for Airflow's own metrics backend (StatsD, Datadog, OpenTelemetry;
the orchestration layer sends them, docs/observability.md). Pure: a summary in, metrics out.

Each figure has a name with the pipeline (and a step) as tags, the way Airflow names its current
metrics (`deltadrain.written`, tags `pipeline`), and the name with them as segments (`legacy`: what plain
StatsD, which drops tags, can tell apart), as Airflow's `[metrics] legacy_names_on` sends its own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

__all__ = ["PREFIX", "COUNTS", "Metric", "stat_segment", "drain_metrics"]

PREFIX = "deltadrain"
# summary key -> metric: the messages of each fate, counted per task (summed over its batches).
COUNTS = {"written": "written", "duplicates_skipped": "duplicates", "dead_lettered": "dead_lettered", "gaps": "gaps"}


@dataclass(frozen=True)
class Metric:
    kind: Literal["count", "gauge", "timing"]  # timing: seconds
    name: str
    value: float
    tags: dict[str, str] = field(default_factory=dict)

    @property
    def legacy(self) -> str:
        """The name with its tags as segments: `deltadrain.<pipeline>.<figure>[.<step>]`."""
        figure = self.name.removeprefix(f"{PREFIX}.")
        step = f".{self.tags['step']}" if "step" in self.tags else ""
        return f"{PREFIX}.{self.tags['pipeline']}.{figure}{step}"


def stat_segment(text: str) -> str:
    """A name part metrics backends accept (letters, digits, `_`, `-`): `dead letters` -> `dead_letters`."""
    return re.sub(r"[^A-Za-z0-9_-]+", "_", text).strip("_") or "_"


def _number(value) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, list):  # a backfill's gaps are its ranges
        return len(value)
    return value if isinstance(value, int) else None


def drain_metrics(summary: dict, lag: int | None = None) -> list[Metric]:
    """The metrics of one drain task from its summary (deltadrain.catchup's, one batch or several):
    the messages written, skipped as duplicates, dead-lettered and found missing (gaps), the seconds of
    each batch and of each of its steps, and `lag`, the messages at the source not in the lake yet after
    it (when measured)."""
    tags = {"pipeline": stat_segment(str(summary["pipeline"]))}
    out = [Metric("count", f"{PREFIX}.{metric}", n, tags)
           for key, metric in COUNTS.items() if (n := _number(summary.get(key))) is not None]
    # One batch: the summary is its own; several: `runs` lists each (the summary's timings are the last's).
    runs = summary.get("runs") or [summary]
    for run in runs:
        if isinstance(run.get("seconds"), int | float):
            out.append(Metric("timing", f"{PREFIX}.batch_seconds", float(run["seconds"]), tags))
        for step, seconds in (run.get("timings") or {}).items():
            if isinstance(seconds, int | float):
                out.append(Metric("timing", f"{PREFIX}.step_seconds", float(seconds),
                                  {**tags, "step": stat_segment(step)}))
    if lag is not None:
        out.append(Metric("gauge", f"{PREFIX}.lag", lag, tags))
    return out
