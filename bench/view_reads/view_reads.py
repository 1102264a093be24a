"""What the view's quality column and index row cost a page (bench/view_reads/README.md).

Reads the lake bench/quarantine_check/quarantine_check.py leaves behind (its DELTADRAIN_HOME: the sample `orders`
target with 10 batches, each checked, a results row each, metrics rows), with delta-rs only, as the
Airflow API server does. Side by side, interleaved, ROUNDS times: the page's lake reads without the
quality column (the reads before it), the quality column alone (`with_checks` over the last 10 runs),
the page's lake reads with the column as separate opens of each table (`page_apart`) and within
`lakeview.one_read` (`page_shared`, what pipeline_view does), and the index row of one pipeline
(`pipeline_summary`, its source not running: refused at once). Each read is timed cold (the view's
per-version query cache emptied first) and warm (a reload).

Usage: DELTADRAIN_HOME=/tmp/ddqcost DELTADRAIN_VALKEY_PORT=26962 .venv/bin/python bench/quarantine_check/quarantine_check.py   (once: the lake)
       DELTADRAIN_HOME=/tmp/ddqcost DELTADRAIN_VALKEY_PORT=26962 .venv/bin/python bench/view_reads/view_reads.py [ROUNDS]
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))  # bench/common: shared helpers

from timing import median_ms

from deltadrain.config import load_config
from deltadrain.observe import tables as lakeview
from deltadrain.orchestration.view.data import pipeline_summary, with_checks


def page_reads(cfg, p) -> list:
    """pipeline_view's lake reads as they were before the quality column."""
    return [lakeview.published_count(cfg, p), lakeview.dlq_counts(cfg, p), lakeview.last_commit(cfg, p),
            lakeview.data_files(cfg, p), lakeview.recorded_gaps(cfg, p), lakeview.last_batches(cfg, p, 10),
            lakeview.dead_letters(cfg, p, "DEAD", 100)]


def main(rounds: int = 15) -> dict:
    cfg = load_config()
    p = cfg.pipeline("orders")
    runs = lakeview.last_batches(cfg, p, 10)
    checked = [r for r in with_checks(cfg, p, [dict(r) for r in runs]) if r.get("quality")]
    assert len(checked) == 10, f"expected 10 checked batches in {cfg.lake_dir()}: run bench/quarantine_check/quarantine_check.py first"
    def column():
        return with_checks(cfg, p, [dict(r) for r in lakeview.last_batches(cfg, p, 10)])

    def shared():
        with lakeview.one_read():
            return page_reads(cfg, p), column()

    sides = {"page_before": lambda: page_reads(cfg, p), "quality_column": column,
             "page_apart": lambda: (page_reads(cfg, p), column()), "page_shared": shared,
             "index_row": lambda: pipeline_summary(cfg, p)}
    times: dict[str, list[float]] = {f"{k}_{w}": [] for k in sides for w in ("cold", "warm")}
    for _ in range(rounds + 1):  # the first round warms DataFusion up and is left out
        for name, read in sides.items():
            lakeview._cache.clear()
            for warmth in ("cold", "warm"):
                began = time.perf_counter()
                read()
                times[f"{name}_{warmth}"].append(time.perf_counter() - began)
    medians = {k: median_ms(v[1:]) for k, v in times.items()}
    out = {"rounds": rounds, "lake": str(cfg.lake_dir()), "median_ms": medians,
           "quality_column_over_page_cold": round(medians["quality_column_cold"] / medians["page_before_cold"], 2),
           "quality_column_over_page_warm": round(medians["quality_column_warm"] / medians["page_before_warm"], 2),
           "shared_over_apart_cold": round(medians["page_shared_cold"] / medians["page_apart_cold"], 2),
           "shared_over_apart_warm": round(medians["page_shared_warm"] / medians["page_apart_warm"], 2)}
    print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:2]))
