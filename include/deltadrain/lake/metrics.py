"""Per-run metrics: one row per drain run in `<lake>/_deltadrain/metrics`, and a chart of them.

The table is plain Delta so that users can plot it with anything; `render_chart` draws throughput
(rows/s) and backlog over time as a self-contained HTML page with inline SVG (no plotting library
is needed, and the page works offline).
"""

from __future__ import annotations

import html
import json
import logging
from datetime import UTC, datetime
from pathlib import Path

from deltadrain.config import DeltadrainConfig, PipelineConfig
from deltadrain.config.lakeurl import LakeUrl
from deltadrain.errors import DeltadrainError
from deltadrain.lake.delta import add_missing_columns, append_rows, ensure_table, is_table, retry_conflicts

log = logging.getLogger(__name__)

METRICS_SCHEMA = ("pipeline STRING NOT NULL, run_id STRING, batch BIGINT, outcome STRING, claimed BIGINT, "
                  "reclaimed BIGINT, written BIGINT, duplicates BIGINT, dead BIGINT, left_pending BIGINT, "
                  "acked BIGINT, released BIGINT, gaps BIGINT, seconds DOUBLE, rows_per_s DOUBLE, backlog BIGINT, "
                  "timings STRING, error STRING, finished_at TIMESTAMP, filtered BIGINT")
# `filtered` came later: it is last because a table an older deltadrain made gains it at the end.


def metrics_path(cfg: DeltadrainConfig) -> Path | LakeUrl:
    return cfg.metrics_path()


def metrics_row(summary, backlog: int | None, finished_at: datetime) -> tuple:
    """A RunSummary -> one row of METRICS_SCHEMA (pure)."""
    handled = summary.written + summary.duplicates_skipped + summary.dead_lettered + summary.filtered
    rate = round(handled / summary.seconds, 3) if summary.seconds > 0 else None
    return (summary.pipeline, summary.run_id, summary.batch, summary.outcome, summary.claimed, summary.reclaimed,
            summary.written, summary.duplicates_skipped, summary.dead_lettered, summary.left_pending, summary.acked,
            summary.released, summary.gaps, float(summary.seconds), rate, backlog,
            json.dumps(summary.timings, sort_keys=True), summary.error, finished_at, summary.filtered)


def record_run(spark, cfg: DeltadrainConfig, pipeline: PipelineConfig, summary, backlog: int | None = None) -> None:
    """Append one row for a finished run (`summary`: drain.RunSummary). `backlog`: messages left after it."""
    from pyspark.sql.types import _parse_datatype_string

    path = str(metrics_path(cfg))
    schema = _parse_datatype_string(METRICS_SCHEMA)
    row = metrics_row(summary, backlog, datetime.now(UTC))
    try:
        # One row from the driver: delta-rs appends it without a Spark job, and its first append
        # creates the table (through Spark, a query per run to ask whether it exists, and a job and
        # a commit to create it).
        append_rows(path, schema, [row])
    except Exception as exc:
        log.debug("metrics append with delta-rs failed (%s); appending with Spark", exc)
        ensure_table(spark, path, schema)
        add_missing_columns(spark, path, schema)  # delta-rs refuses a row with a column the table lacks
        df = spark.createDataFrame([row], schema)
        # Blind appends from different pipelines do not conflict; the retry covers table creation races.
        retry_conflicts(lambda: df.write.format("delta").mode("append").save(path))


def record_run_safely(spark, cfg: DeltadrainConfig, pipeline: PipelineConfig, summary, backlog=None) -> None:
    """record_run for the drain itself: never raises, so metrics can never fail a run.

    `backlog` may be a callable (evaluated here, inside the guard). Called from a `finally`, it
    marks a run that is failing with an exception as outcome "error".
    """
    import sys

    try:
        failing = sys.exc_info()[1]
        if failing is not None and summary.error is None:
            summary.error = f"{type(failing).__name__}: {str(failing).splitlines()[0][:300] if str(failing) else ''}"
        if failing is not None:
            summary.outcome = "error"
        left = backlog() if callable(backlog) else backlog
        record_run(spark, cfg, pipeline, summary, left)
    except Exception as exc:  # best effort by design
        log.warning("pipeline %s run %s: metrics not recorded: %s", summary.pipeline, summary.run_id,
                    str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__)


def last_runs(spark, cfg: DeltadrainConfig, pipeline: PipelineConfig, n: int = 10) -> list[dict]:
    """The pipeline's newest `n` runs, newest first."""
    from pyspark.sql import functions as F

    path = str(metrics_path(cfg))
    if not is_table(spark, path):
        return []
    df = spark.read.format("delta").load(path).where(F.col("pipeline") == F.lit(pipeline.name))
    rows = df.orderBy(F.col("finished_at").desc()).limit(n).collect()
    out = []
    for r in rows:
        item = r.asDict()
        item["timings"] = json.loads(item["timings"]) if item["timings"] else {}
        # PySpark gives timestamps as naive local times of this process; the chart and --json say UTC.
        out.append({k: v.astimezone(UTC) if isinstance(v, datetime) and v.tzinfo is None else v
                    for k, v in item.items()})
    return out


# -- the chart (pure functions, then the file) -----------------------------------------------------------


def batch_finished_at(spark, cfg: DeltadrainConfig, pipeline: PipelineConfig, batch: int) -> datetime | None:
    """When the drain run that committed `batch` finished (naive local, as collected), or None. The
    quality check's landing time for a batch whose commit file find_commit does not reach (it reads
    the newest 200 commits; log cleanup removes old ones)."""
    from pyspark.sql import functions as F

    path = str(metrics_path(cfg))
    if not is_table(spark, path):
        return None
    runs = spark.read.format("delta").load(path).where(
        (F.col("pipeline") == F.lit(pipeline.name)) & (F.col("batch") == F.lit(batch))
        & F.col("outcome").isin("committed", "already_committed"))
    return runs.agg(F.min("finished_at")).first()[0]


def _polyline(points: list[tuple[float, float]], box: tuple[int, int, int, int], color: str) -> str:
    """SVG for (x, y) points scaled into box = (left, top, width, height); y grows upwards."""
    left, top, width, height = box
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x0, x1 = min(xs), max(xs)
    y1 = max(ys) or 1.0

    def sx(x):
        return left + (width * (x - x0) / (x1 - x0) if x1 > x0 else width / 2)

    def sy(y):
        return top + height - height * y / y1

    coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in points)
    dots = "".join(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5" fill="{color}"/>' for x, y in points)
    return f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{coords}"/>{dots}'


def panel_svg(title: str, series: list[tuple[datetime, float]], color: str, unit: str,
              width: int = 760, height: int = 220) -> str:
    """One chart panel: a line of `series` over time with its axis labels (pure)."""
    pad_l, pad_r, pad_t, pad_b = 70, 20, 30, 40
    box = (pad_l, pad_t, width - pad_l - pad_r, height - pad_t - pad_b)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
             f'aria-label="{html.escape(title)}">',
             f'<text x="{pad_l}" y="18" font-size="14" font-family="sans-serif">{html.escape(title)}</text>',
             f'<rect x="{box[0]}" y="{box[1]}" width="{box[2]}" height="{box[3]}" fill="none" stroke="#ccc"/>']
    if not series:
        parts.append(f'<text x="{pad_l + 10}" y="{pad_t + 30}" font-size="12" fill="#666">no data</text>')
    else:
        points = [(t.timestamp(), float(v)) for t, v in series]
        top = max(v for _, v in points)
        parts.append(_polyline(points, box, color))
        parts.append(f'<text x="{pad_l - 6}" y="{pad_t + 4}" font-size="11" text-anchor="end" '
                     f'font-family="sans-serif">{top:,.0f} {html.escape(unit)}</text>')
        parts.append(f'<text x="{pad_l - 6}" y="{pad_t + box[3]}" font-size="11" text-anchor="end" '
                     f'font-family="sans-serif">0</text>')
        for t, anchor, x in ((series[0][0], "start", pad_l), (series[-1][0], "end", pad_l + box[2])):
            parts.append(f'<text x="{x}" y="{height - 12}" font-size="11" text-anchor="{anchor}" '
                         f'font-family="sans-serif">{t:%Y-%m-%d %H:%M:%S}</text>')
    parts.append("</svg>")
    return "".join(parts)


def chart_html(pipeline: str, runs: list[dict]) -> str:
    """A self-contained page with throughput and backlog per run, oldest first (pure)."""
    runs = sorted((r for r in runs if r.get("finished_at") is not None), key=lambda r: r["finished_at"])
    rate = [(r["finished_at"], r["rows_per_s"]) for r in runs if r.get("rows_per_s") is not None]
    left = [(r["finished_at"], r["backlog"]) for r in runs if r.get("backlog") is not None]
    rows = "".join(
        f"<tr><td>{r['finished_at']:%Y-%m-%d %H:%M:%S}</td><td>{r['batch']}</td><td>{html.escape(str(r['outcome']))}"
        f"</td><td>{r['claimed']}</td><td>{r['written']}</td><td>{r['dead']}</td><td>{r['seconds']}</td>"
        f"<td>{r['rows_per_s'] if r['rows_per_s'] is not None else ''}</td>"
        f"<td>{r['backlog'] if r['backlog'] is not None else ''}</td></tr>" for r in runs[-50:])
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>deltadrain {html.escape(pipeline)}"
            "</title></head><body style='font-family:sans-serif'>"
            f"<h1>deltadrain pipeline {html.escape(pipeline)}: {len(runs)} run(s)</h1>"
            + panel_svg("Throughput (rows handled per second of run)", rate, "#1f77b4", "rows/s")
            + panel_svg("Backlog after the run (messages pending or unread)", left, "#d62728", "msgs")
            + "<h2>Last runs</h2><table border='1' cellpadding='3' style='border-collapse:collapse'>"
            "<tr><th>finished (UTC)</th><th>batch</th><th>outcome</th><th>claimed</th><th>written</th>"
            f"<th>dead</th><th>seconds</th><th>rows/s</th><th>backlog</th></tr>{rows}</table></body></html>")


CHART_RUNS = 500  # the runs a chart draws


def render_chart(spark, cfg: DeltadrainConfig, pipeline: PipelineConfig, out_path: str | Path,
                 last: int = CHART_RUNS) -> Path:
    """Write the chart of the pipeline's last `last` runs to `out_path` (.html or .svg) and return the path."""
    return write_chart(pipeline.name, last_runs(spark, cfg, pipeline, last), out_path)


def write_chart(pipeline: str, runs: list[dict], out_path: str | Path) -> Path:
    """Write the chart of `runs` (metrics rows) of `pipeline` to `out_path` (.html or .svg) and return the path."""
    out = Path(out_path).expanduser()
    if out.suffix.lower() not in (".html", ".htm", ".svg"):
        raise DeltadrainError(f"chart for pipeline '{pipeline}': {out} must end in .html or .svg "
                              "(the chart is drawn as SVG; no plotting library is installed for PNG)")
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix.lower() == ".svg":
        ordered = sorted(runs, key=lambda r: r["finished_at"])
        out.write_text(panel_svg(f"{pipeline}: rows/s", [(r["finished_at"], r["rows_per_s"]) for r in ordered
                                                         if r["rows_per_s"] is not None], "#1f77b4", "rows/s"))
    else:
        out.write_text(chart_html(pipeline, runs))
    return out
