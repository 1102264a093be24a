"""SLA-like checks of a pipeline (the ingest DAG's `alerts` task, docs/airflow.md "Alerts"): lag above
`alerts.max_lag`, the oldest message not in the lake yet older than `alerts.max_pending_age`, DEAD
dead letters rising by more than `alerts.max_dead_rise` since the previous check.

The decisions are pure functions of the figures (`lag_finding`, `age_finding`, `dead_rise_finding`,
`verdict`); `check` reads the figures cheaply: the source's counts as the view reads them, and the
lake with delta-rs (no JVM, no Spark session). The previous check's DEAD count is the DLQ table's own
history: its DEAD count as of when the DAG run started.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta

from deltadrain.config import DeltadrainConfig, PipelineConfig
from deltadrain.errors import DeltadrainError

SOURCE_WAIT_S = 20  # how long the check waits for the source's answers


class AlertBreached(DeltadrainError):
    """A threshold of the pipeline's `alerts:` was passed; the message names each figure and threshold."""


@dataclass(frozen=True)
class Finding:
    check: str  # the config key: max_lag, max_pending_age, max_dead_rise
    figure: float | int | None  # None: it could not be measured
    threshold: float | int
    breached: bool
    text: str

    def as_dict(self) -> dict:
        return asdict(self)


def lag_finding(lag: int | None, limit: int, why_unknown: str | None = None) -> Finding:
    """Messages not in the lake yet against `max_lag`. A lag that cannot be measured fails: an SLA that
    cannot be shown kept is not kept (pure)."""
    if lag is None:
        return Finding("max_lag", None, limit, True,
                       f"lag unknown (threshold {limit:,}): {why_unknown or 'the source did not answer'}")
    breached = lag > limit
    return Finding("max_lag", lag, limit, breached,
                   f"lag {lag:,} messages {'above' if breached else 'within'} the threshold {limit:,} (alerts.max_lag)")


def age_finding(oldest_ms: int | None, now_ms: int, limit: timedelta, lag: int | None,
                why_unknown: str | None = None) -> Finding:
    """The age of the oldest message not in the lake yet (appended at `oldest_ms`, epoch ms) against
    `max_pending_age`; nothing waiting is age 0 (pure)."""
    limit_s = limit.total_seconds()
    if lag is None:
        return Finding("max_pending_age", None, limit_s, True,
                       f"oldest pending message's age unknown (threshold {_duration(limit_s)}): "
                       f"{why_unknown or 'the source did not answer'}")
    if oldest_ms is None or lag == 0:
        return Finding("max_pending_age", 0, limit_s, False,
                       f"no message waiting (threshold {_duration(limit_s)}, alerts.max_pending_age)")
    age_s = max(0.0, (now_ms - oldest_ms) / 1000)
    breached = age_s > limit_s
    at = datetime.fromtimestamp(oldest_ms / 1000, UTC)
    return Finding("max_pending_age", round(age_s, 1), limit_s, breached,
                   f"oldest pending message appended {_duration(age_s)} ago ({at:%Y-%m-%d %H:%M:%S} UTC), "
                   f"{'older than' if breached else 'within'} the threshold {_duration(limit_s)} (alerts.max_pending_age)")


def dead_rise_finding(dead_now: int, dead_before: int, limit: int) -> Finding:
    """DEAD dead letters now against their count at the previous check; a replay lowers it (pure)."""
    rise = dead_now - dead_before
    breached = rise > limit
    return Finding("max_dead_rise", rise, limit, breached,
                   f"DEAD dead letters {'rose' if rise > 0 else 'changed'} by {rise:+,} since the previous check "
                   f"({dead_before:,} -> {dead_now:,}), {'above' if breached else 'within'} the threshold {limit:,} "
                   "(alerts.max_dead_rise)")


def verdict(pipeline: str, findings: list[Finding]) -> str | None:
    """The failure message when any finding is breached (each breached one with its figure and
    threshold), else None (pure)."""
    breached = [f.text for f in findings if f.breached]
    if not breached:
        return None
    return f"pipeline '{pipeline}': {len(breached)} alert(s): " + "; ".join(breached)


def _duration(seconds: float) -> str:
    """A duration as the log shows it: 90 -> '1 min 30 s' (pure)."""
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    parts = [f"{h} h"] * bool(h) + [f"{m} min"] * bool(m) + [f"{s} s"] * bool(s or not (h or m))
    return " ".join(parts)


# -- reading the figures (I/O) ----------------------------------------------------------------------------


def _source_counts(cfg: DeltadrainConfig, pipeline: PipelineConfig) -> tuple[dict | None, str | None]:
    """(the source's counts, None) or (None, why they are unknown)."""
    from deltadrain.observe import notes as states
    from deltadrain.observe import tables as lakeview
    from deltadrain.sources import LakeSide, SourceNote

    try:
        counts = states.source_counts(cfg, pipeline, LakeSide(lambda: lakeview.checkpoint(cfg, pipeline)),
                                      until=time.monotonic() + SOURCE_WAIT_S, quick=True)
    except SourceNote as exc:
        return None, str(exc)
    if counts["PENDING"] is None:
        return None, "; ".join(n["note"] for n in counts.get("notes") or []) or None
    return counts, None


def measure_lag(cfg: DeltadrainConfig, pipeline: PipelineConfig) -> int | None:
    """Messages at the source not in the lake yet (PENDING + CLAIMED, as status counts them), or None
    when the source does not answer within SOURCE_WAIT_S. The drain task's `deltadrain.lag` metric."""
    from deltadrain.observe import tables as lakeview

    with lakeview.one_read():
        counts, _ = _source_counts(cfg, pipeline)
    return counts["PENDING"] + counts["CLAIMED"] if counts is not None else None


def check(cfg: DeltadrainConfig, pipeline: PipelineConfig, since: datetime | None,
          now: datetime | None = None) -> dict:
    """The figures of every threshold the pipeline sets, and the verdict. `since`: when the previous
    check had run (the DAG run's start); the DEAD count then is read from the DLQ table's history (None:
    the table as it is, a rise of 0). Raises nothing for a breach: the caller decides (`raise_if_breached`)."""
    from deltadrain.observe import tables as lakeview
    from deltadrain.sources import source_of

    settings = pipeline.alerts
    now = now or datetime.now(UTC)
    findings: list[Finding] = []
    with lakeview.one_read():
        if settings.max_lag is not None or settings.max_pending_age is not None:
            counts, why = _source_counts(cfg, pipeline)
            lag = counts["PENDING"] + counts["CLAIMED"] if counts is not None else None
            if settings.max_lag is not None:
                findings.append(lag_finding(lag, settings.max_lag, why))
            if settings.max_pending_age is not None:
                oldest = source_of(pipeline).oldest_pending_ms(cfg, pipeline, counts) if lag and counts else None
                findings.append(age_finding(oldest, int(now.timestamp() * 1000), settings.max_pending_age, lag, why))
        if settings.max_dead_rise is not None:
            dead_now = lakeview.dlq_counts(cfg, pipeline).get("DEAD", 0)
            dead_before = lakeview.dead_count_at(cfg, pipeline, since) if since is not None else dead_now
            findings.append(dead_rise_finding(dead_now, dead_before, settings.max_dead_rise))
    return {"pipeline": pipeline.name, "checked_at": now.isoformat(), "since": since.isoformat() if since else None,
            "findings": [f.as_dict() for f in findings], "failure": verdict(pipeline.name, findings)}


def raise_if_breached(report: dict) -> None:
    if report["failure"]:
        raise AlertBreached(report["failure"])
