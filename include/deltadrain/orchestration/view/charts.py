"""A pipeline's charts over the last day or week: throughput, lag, batch seconds by step, dead letters
and quality failures per batch, from the metrics table and the quality results table (delta-rs, no JVM).

`chart_data` turns the rows into series (pure; the JSON endpoint returns it), `charts_svg` draws
them as inline SVG (pure): the page fetches nothing, and the colours come from the page's CSS, so
the charts follow its light or dark theme.
"""

from __future__ import annotations

import html
import json
import math
from datetime import UTC, datetime, timedelta

from deltadrain.config import DeltadrainConfig, PipelineConfig

WINDOWS = {"1d": timedelta(days=1), "7d": timedelta(days=7)}
WINDOW_NAMES = {"1d": "last day", "7d": "last week"}
ALIASES = {"1w": "7d", "24h": "1d", "day": "1d", "week": "7d"}
MAX_POINTS = 300  # runs per line chart; more are merged into as many time buckets
MAX_BARS = 120  # batches per bar chart; more are merged into groups of consecutive batches
STEPS = ("checkpoint", "claim", "transform", "dead letters", "commit", "ack")  # a drain's steps, in order


def window_of(name: str) -> str | None:
    """The window's canonical name ('1d' or '7d'), or None for a name it does not know."""
    name = ALIASES.get(name, name)
    return name if name in WINDOWS else None


# -- reading (delta-rs) --------------------------------------------------------------------------------


def read_rows(cfg: DeltadrainConfig, pipeline: PipelineConfig, since: datetime) -> tuple[list[dict], list[dict]]:
    """(the pipeline's metrics rows finished since `since`, its batch checks made since then), oldest first."""
    from deltadrain.lake.metrics import metrics_path
    from deltadrain.observe import tables as lakeview
    from deltadrain.quality.results import results_path

    # Only the validated name and an int go into the text; `since` is whole minutes, so that a
    # reload within the minute is served from the per-version cache.
    micros = int(since.replace(second=0, microsecond=0).timestamp()) * 1_000_000
    name = lakeview._sql_literal(pipeline.name)
    runs, checks = [], []
    metrics = lakeview.open_table(str(metrics_path(cfg)))
    if metrics is not None:
        runs = lakeview.query(metrics, "SELECT batch, outcome, claimed, written, duplicates, dead, filtered, "  # noqa: S608
                                       "seconds, rows_per_s, backlog, timings, finished_at FROM m "
                                       f"WHERE pipeline = {name} AND finished_at >= to_timestamp_micros({micros}) "
                                       "ORDER BY finished_at", name="m")
    results = lakeview.open_table(str(results_path(cfg)))
    if results is not None:
        checks = lakeview.query(results, "SELECT batch, success, unexpected_count, failed, quarantined, checked_at "  # noqa: S608
                                         f"FROM r WHERE pipeline = {name} AND scope = 'batch' AND batch IS NOT NULL "
                                         f"AND checked_at >= to_timestamp_micros({micros}) ORDER BY checked_at",
                                name="r")
    return runs, checks


def pipeline_charts(cfg: DeltadrainConfig, pipeline: PipelineConfig, window: str,
                    now: datetime | None = None) -> dict:
    """The chart data of `pipeline` over `window` ('1d' or '7d')."""
    now = now or datetime.now(UTC)
    runs, checks = read_rows(cfg, pipeline, now - WINDOWS[window])
    return chart_data(pipeline.name, window, runs, checks, now)


# -- the series (pure) ---------------------------------------------------------------------------------


def _utc(t: datetime) -> datetime:
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def _handled(r: dict) -> int:
    return sum(int(r.get(k) or 0) for k in ("written", "duplicates", "dead", "filtered"))


def _timings(r: dict) -> dict:
    value = r.get("timings")
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            value = {}
    return {str(k): float(v) for k, v in (value or {}).items() if isinstance(v, int | float)}


def _buckets(items: list, key, limit: int) -> list[list]:
    """`items` (sorted) in at most `limit` groups: one each while they fit, else consecutive runs of
    them by `key` (a number), in groups of equal width."""
    if len(items) <= limit:
        return [[i] for i in items]
    low, high = key(items[0]), key(items[-1])
    width = (high - low) / limit or 1
    groups: dict[int, list] = {}
    for i in items:
        groups.setdefault(min(int((key(i) - low) / width), limit - 1), []).append(i)
    return [groups[k] for k in sorted(groups)]


def chart_data(pipeline: str, window: str, runs: list[dict], checks: list[dict], now: datetime) -> dict:
    """The five series of a pipeline over `window` ending at `now`, from metrics rows (`runs`) and batch
    checks (`checks`), oldest first (pure).

    - throughput: messages handled (written, duplicates, dead-lettered, filtered) per second of run;
    - lag: messages left in the source after the run (PENDING + CLAIMED);
    - batch_seconds: a batch's run time and its steps (numbered runs only);
    - dead_letters: messages a batch dead-lettered;
    - quality: per checked batch, its newest check: rows failing expectations, the expectations failed.
    Over MAX_POINTS runs (MAX_BARS batches) consecutive ones are merged: `runs` says how many each
    point holds; throughput is then their messages over their seconds, lag the largest, seconds the
    mean, dead letters and failing rows the sum.
    """
    start = now - WINDOWS[window]
    runs = sorted((r for r in runs if r.get("finished_at") is not None and _utc(r["finished_at"]) >= start),
                  key=lambda r: _utc(r["finished_at"]))

    def at(r: dict) -> float:
        return _utc(r["finished_at"]).timestamp()

    def iso(t: float) -> str:
        return datetime.fromtimestamp(t, UTC).isoformat()

    throughput, lag = [], []
    for group in _buckets(runs, at, MAX_POINTS):
        t = iso(sum(at(r) for r in group) / len(group))
        secs = sum(float(r.get("seconds") or 0) for r in group)
        rate: float | None
        if len(group) == 1 and group[0].get("rows_per_s") is not None:
            rate = float(group[0]["rows_per_s"])
        else:
            rate = round(sum(_handled(r) for r in group) / secs, 3) if secs > 0 else None
        if rate is not None:
            throughput.append({"t": t, "v": rate, "runs": len(group)})
        backlogs = [int(r["backlog"]) for r in group if r.get("backlog") is not None]
        if backlogs:
            lag.append({"t": t, "v": max(backlogs), "runs": len(group)})

    numbered = [r for r in runs if r.get("batch") is not None]
    batch_seconds, dead_letters = [], []
    for group in _buckets(numbered, at, MAX_BARS):
        first, last = group[0], group[-1]
        label = {"batch": int(last["batch"]), "first_batch": int(first["batch"]), "t": iso(at(last)),
                 "runs": len(group)}
        steps: dict[str, float] = {}
        for r in group:
            for step, s in _timings(r).items():
                steps[step] = steps.get(step, 0.0) + s
        total = sum(float(r.get("seconds") or 0) for r in group) / len(group)
        batch_seconds.append({**label, "v": round(total, 3),
                              "steps": {k: round(v / len(group), 3) for k, v in steps.items()},
                              "outcome": last.get("outcome") if len(group) == 1 else None})
        dead_letters.append({**label, "v": sum(int(r.get("dead") or 0) for r in group)})

    newest: dict[int, dict] = {}  # a batch checked again counts once: its newest check
    for c in checks:
        if c.get("checked_at") is None or _utc(c["checked_at"]) < start:
            continue
        b = int(c["batch"])
        if b not in newest or _utc(c["checked_at"]) >= _utc(newest[b]["checked_at"]):
            newest[b] = c
    checked = sorted(newest.values(), key=lambda c: int(c["batch"]))
    quality = []
    for group in _buckets(checked, lambda c: int(c["batch"]), MAX_BARS):
        failed = sorted({f for c in group for f in _failed(c)})
        quality.append({"batch": int(group[-1]["batch"]), "first_batch": int(group[0]["batch"]),
                        "t": _utc(group[-1]["checked_at"]).isoformat(), "runs": len(group),
                        "v": sum(int(c.get("unexpected_count") or 0) for c in group),
                        "failed_checks": sum(1 for c in group if not c.get("success")),
                        "failed": failed})
    return {"pipeline": pipeline, "window": window, "from": start.isoformat(), "to": now.isoformat(),
            "runs": len(runs), "series": {"throughput": throughput, "lag": lag, "batch_seconds": batch_seconds,
                                          "dead_letters": dead_letters, "quality": quality}}


def _failed(check: dict) -> list[str]:
    value = check.get("failed")
    if isinstance(value, str):
        try:
            value = json.loads(value or "[]")
        except ValueError:
            value = [value]
    return [str(v) for v in value or []]


# -- drawing (pure) ------------------------------------------------------------------------------------

W, H = 560, 210
PAD_L, PAD_R, PAD_T, PAD_B = 56, 14, 22, 34


def _nice(top: float, whole: bool = False) -> tuple[float, float]:
    """(axis maximum, tick step) for values up to `top`: 1, 2 or 5 times a power of ten, about 4 ticks;
    `whole`: counts, whose steps are whole numbers."""
    if top <= 0:
        return (1.0, 1.0) if whole else (1.0, 0.25)
    raw = top / 4
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    if whole:
        step = max(1.0, math.ceil(step))
    return step * math.ceil(top / step - 1e-9), step


def _num(v: float) -> str:
    if v >= 1_000_000:
        return f"{v / 1_000_000:g}M"
    if v >= 10_000:
        return f"{v / 1000:g}k"
    return f"{v:,.0f}" if v == int(v) else f"{v:g}"


TIME_STEPS = (1, 5, 10, 30, 60, 300, 600, 1800, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 86400)


def _time_ticks(t0: float, t1: float) -> list[tuple[float, str]]:
    """About 5 round instants between t0 and t1 (epoch seconds, UTC) with their labels."""
    span = max(t1 - t0, 1)
    step = next((s for s in TIME_STEPS if span / s <= 6), 86400 * math.ceil(span / 86400 / 6))
    fmt = "%H:%M:%S" if step < 60 else "%H:%M" if step < 86400 and span <= 86400 else "%m-%d %H:%M"
    if step >= 86400:
        fmt = "%a %m-%d"
    first = math.ceil(t0 / step) * step
    return [(t, datetime.fromtimestamp(t, UTC).strftime(fmt)) for t in range(int(first), int(t1) + 1, int(step))]


def _frame(title: str, unit: str, top: float, chart_id: str, whole: bool = False):
    """The SVG's opening, its y grid up to `top` and the y scale."""
    height = H - PAD_T - PAD_B
    axis_max, step = _nice(top, whole)

    def sy(v: float) -> float:
        return PAD_T + height - height * v / axis_max

    parts = [f'<svg class="chart" id="chart-{chart_id}" viewBox="0 0 {W} {H}" width="{W}" height="{H}" '
             f'role="img" aria-label="{html.escape(title)}" xmlns="http://www.w3.org/2000/svg">']
    ticks = int(round(axis_max / step))
    for i in range(ticks + 1):
        v = i * step
        parts.append(f'<line class="grid" x1="{PAD_L}" x2="{W - PAD_R}" y1="{sy(v):.1f}" y2="{sy(v):.1f}"/>'
                     f'<text class="tick" x="{PAD_L - 6}" y="{sy(v) + 4:.1f}" text-anchor="end">{_num(v)}</text>')
    parts.append(f'<text class="unit" x="{PAD_L - 6}" y="{PAD_T - 10}" text-anchor="end">{html.escape(unit)}</text>')
    return parts, axis_max, sy


def _empty(title: str, chart_id: str, why: str) -> str:
    return (f'<svg class="chart" id="chart-{chart_id}" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" '
            f'aria-label="{html.escape(title)}" xmlns="http://www.w3.org/2000/svg">'
            f'<rect class="frame" x="{PAD_L}" y="{PAD_T}" width="{W - PAD_L - PAD_R}" height="{H - PAD_T - PAD_B}"/>'
            f'<text class="none" x="{W / 2}" y="{H / 2}" text-anchor="middle">{html.escape(why)}</text></svg>')


def _when(t: str) -> str:
    return datetime.fromisoformat(t).strftime("%Y-%m-%d %H:%M:%S UTC")


def line_svg(title: str, unit: str, points: list[dict], chart_id: str, t0: float, t1: float,
             why_empty: str = "no runs in this window", whole: bool = False) -> str:
    """A line over time of points {t, v, runs} between t0 and t1 (epoch seconds)."""
    if not points:
        return _empty(title, chart_id, why_empty)
    times = [datetime.fromisoformat(p["t"]).timestamp() for p in points]
    # From the first point (a little before), not the window's start: a pipeline that ran for an
    # hour is not squeezed into the right edge of a week.
    t0 = max(t0, min(times) - max((t1 - min(times)) * 0.05, 30))
    parts, _, sy = _frame(title, unit, max(p["v"] for p in points), chart_id, whole)
    width = W - PAD_L - PAD_R

    def sx(t: float) -> float:
        return PAD_L + width * (t - t0) / (t1 - t0) if t1 > t0 else PAD_L + width / 2

    for t, label in _time_ticks(t0, t1):
        parts.append(f'<text class="tick" x="{sx(t):.1f}" y="{H - PAD_B + 16}" text-anchor="middle">{label}</text>')
    coords = " ".join(f"{sx(t):.1f},{sy(p['v']):.1f}" for t, p in zip(times, points, strict=True))
    parts.append(f'<polyline class="line" points="{coords}"/>')
    for t, p in zip(times, points, strict=True):
        runs = f" ({p['runs']} runs)" if p.get("runs", 1) > 1 else ""
        parts.append(f'<circle class="pt" cx="{sx(t):.1f}" cy="{sy(p["v"]):.1f}" r="2.5" data-v="{p["v"]}">'
                     f'<title>{_when(p["t"])}: {_num(p["v"])} {html.escape(unit)}{runs}</title></circle>')
    parts.append("</svg>")
    return "".join(parts)


def bars_svg(title: str, unit: str, bars: list[dict], chart_id: str, stacked: tuple[str, ...] = (),
             why_empty: str = "no batches in this window", note=None, whole: bool = False) -> str:
    """Bars per batch (or group of batches) {batch, first_batch, v[, steps]}; with `stacked`, each bar
    is split into those steps (what is left of v is drawn as "other")."""
    if not bars:
        return _empty(title, chart_id, why_empty)
    parts, _, sy = _frame(title, unit, max(b["v"] for b in bars), chart_id, whole)
    width = W - PAD_L - PAD_R
    slot = width / len(bars)
    bar_w = max(min(slot * 0.7, 28), 1)
    label_every = max(1, math.ceil(len(bars) / 8))
    for i, b in enumerate(bars):
        x = PAD_L + slot * i + (slot - bar_w) / 2
        name = f"batch {b['batch']}" if b["first_batch"] == b["batch"] else f"batches {b['first_batch']}-{b['batch']}"
        tip = f"{name}, {_when(b['t'])}: {_num(b['v'])} {unit}"
        if note:
            tip += note(b)
        if stacked:
            base = 0.0
            rest = b["v"] - sum(b.get("steps", {}).get(s, 0) for s in stacked)
            for k, (step, s) in enumerate([*((s, b.get("steps", {}).get(s, 0)) for s in stacked),
                                           ("other", max(rest, 0))]):
                if s <= 0:
                    continue
                parts.append(f'<rect class="bar s{k}" x="{x:.1f}" y="{sy(base + s):.1f}" width="{bar_w:.1f}" '
                             f'height="{sy(base) - sy(base + s):.1f}" data-v="{s}"><title>{html.escape(tip)}; '
                             f'{html.escape(step)} {s:g} s</title></rect>')
                base += s
        else:
            cls = "bar bad" if b.get("failed_checks") else "bar"
            parts.append(f'<rect class="{cls}" x="{x:.1f}" y="{sy(b["v"]):.1f}" width="{bar_w:.1f}" '
                         f'height="{max(sy(0) - sy(b["v"]), 0):.1f}" data-v="{b["v"]}"><title>{html.escape(tip)}'
                         f'</title></rect>')
            if b["v"] == 0:  # a zero is still a batch: a tick on the axis says it is there
                parts.append(f'<rect class="zero" x="{x:.1f}" y="{sy(0) - 1:.1f}" width="{bar_w:.1f}" height="2"/>')
        last = i == len(bars) - 1 and i % label_every >= label_every / 2  # not on top of the label before it
        if i % label_every == 0 or last:
            parts.append(f'<text class="tick" x="{x + bar_w / 2:.1f}" y="{H - PAD_B + 16}" '
                         f'text-anchor="middle">{b["batch"]}</text>')
    parts.append(f'<text class="unit" x="{W - PAD_R}" y="{H - 4}" text-anchor="end">batch</text></svg>')
    return "".join(parts)


def legend(steps: tuple[str, ...]) -> list[tuple[str, str]]:
    """(css class, label) of each stacked part, for the page's legend."""
    return [(f"s{k}", s) for k, s in enumerate((*steps, "other"))]


def charts_svg(data: dict) -> list[dict]:
    """The page's charts of `data` (chart_data): each {id, title, what, svg} (pure)."""
    t0 = datetime.fromisoformat(data["from"]).timestamp()
    t1 = datetime.fromisoformat(data["to"]).timestamp()
    s = data["series"]
    steps = tuple(st for st in STEPS if any(st in b.get("steps", {}) for b in s["batch_seconds"]))
    steps += tuple(sorted({k for b in s["batch_seconds"] for k in b.get("steps", {})} - set(steps)))

    def failures(b: dict) -> str:
        checks = f"; {b['failed_checks']} failed check{'s' if b['failed_checks'] != 1 else ''}" \
            if b["failed_checks"] else "; passed"
        return checks + (f": {', '.join(b['failed'])}" if b["failed"] else "")

    return [
        {"id": "throughput", "title": "Throughput", "unit": "msg/s",
         "what": "messages handled (written, duplicates, dead-lettered, filtered) per second of each run",
         "svg": line_svg("Throughput", "msg/s", s["throughput"], "throughput", t0, t1)},
        {"id": "lag", "title": "Lag", "unit": "messages",
         "what": "messages left in the source after each run (PENDING + CLAIMED)",
         "svg": line_svg("Lag", "msgs", s["lag"], "lag", t0, t1, whole=True)},
        {"id": "batch_seconds", "title": "Batch seconds", "unit": "s", "legend": legend(steps),
         "what": "each batch's run time, split into its steps",
         "svg": bars_svg("Batch seconds", "s", s["batch_seconds"], "batch_seconds", stacked=steps)},
        {"id": "dead_letters", "title": "Dead letters per batch", "unit": "messages",
         "what": "messages each batch sent to the dead-letter table",
         "svg": bars_svg("Dead letters per batch", "msgs", s["dead_letters"], "dead_letters", whole=True)},
        {"id": "quality", "title": "Quality failures per batch", "unit": "rows",
         "what": "rows failing expectations in each checked batch's newest check (red: the check failed)",
         "svg": bars_svg("Quality failures per batch", "rows", s["quality"], "quality",
                         why_empty="no batch checked in this window", note=failures, whole=True)},
    ]
