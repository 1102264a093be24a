"""The view's charts: series from metrics and quality rows (pure), drawn as inline SVG (pure), read
with delta-rs from real Delta tables, and served by the page and the JSON endpoint."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

import pytest

from deltadrain.orchestration.view.charts import MAX_POINTS, chart_data, charts_svg, line_svg, window_of
from tests.support.view import FakeAuth

NOW = datetime(2026, 11, 28, 12, tzinfo=UTC)


def run(minutes_ago: float, batch: int | None, *, written=10, dead=0, seconds=2.0, backlog=5, timings=None,
        outcome="committed") -> dict:
    return {"batch": batch, "outcome": outcome, "claimed": written + dead, "written": written, "duplicates": 0,
            "dead": dead, "filtered": 0, "seconds": seconds,
            "rows_per_s": round((written + dead) / seconds, 3) if seconds else None, "backlog": backlog,
            "timings": json.dumps(timings or {"claim": 0.5, "commit": 1.0}),
            "finished_at": NOW - timedelta(minutes=minutes_ago)}


def check(batch: int, minutes_ago: float, *, success=True, unexpected=0, failed=()) -> dict:
    return {"batch": batch, "success": success, "unexpected_count": unexpected, "failed": json.dumps(list(failed)),
            "quarantined": 0, "checked_at": NOW - timedelta(minutes=minutes_ago)}


def test_windows_have_names_and_aliases():
    assert (window_of("1d"), window_of("7d"), window_of("1w"), window_of("week"), window_of("1y")) == (
        "1d", "7d", "7d", "7d", None)


def test_series_per_run_and_per_batch_within_the_window():
    runs = [run(60 * 30, 1), run(90, 2, dead=3, seconds=4.0, backlog=40),  # 30 h ago: only in the week
            run(60, None, written=0, seconds=0.5, backlog=0, outcome="empty"),
            run(30, 3, timings={"claim": 1.0, "transform": 0.5, "commit": 0.25}, seconds=2.0, backlog=0)]
    checks = [check(2, 80, success=False, unexpected=4, failed=["id_not_null"]), check(2, 20, unexpected=1),
              check(3, 10)]
    day = chart_data("orders", "1d", runs, checks, NOW)
    s = day["series"]
    assert day["runs"] == 3 and day["from"] == (NOW - timedelta(days=1)).isoformat()
    assert [p["v"] for p in s["throughput"]] == [3.25, 0.0, 5.0]
    assert [p["v"] for p in s["lag"]] == [40, 0, 0]
    # Numbered runs only: the empty run has no batch.
    assert [(b["batch"], b["v"]) for b in s["batch_seconds"]] == [(2, 4.0), (3, 2.0)]
    assert s["batch_seconds"][1]["steps"] == {"claim": 1.0, "transform": 0.5, "commit": 0.25}
    assert [(b["batch"], b["v"]) for b in s["dead_letters"]] == [(2, 3), (3, 0)]
    # A batch checked twice counts once, with its newest check.
    assert [(q["batch"], q["v"], q["failed_checks"]) for q in s["quality"]] == [(2, 1, 0), (3, 0, 0)]
    week = chart_data("orders", "7d", runs, checks, NOW)
    assert week["runs"] == 4 and [b["batch"] for b in week["series"]["dead_letters"]] == [1, 2, 3]


def test_many_runs_are_merged_into_buckets_that_keep_the_totals():
    runs = [run(1000 - i * 0.5, i, written=10, dead=1, seconds=1.0, backlog=i) for i in range(2 * MAX_POINTS)]
    s = chart_data("orders", "1d", runs, [], NOW)["series"]
    assert len(s["throughput"]) <= MAX_POINTS and sum(p["runs"] for p in s["throughput"]) == 2 * MAX_POINTS
    assert all(p["v"] == 11.0 for p in s["throughput"])  # messages over seconds, merged
    assert max(p["v"] for p in s["lag"]) == 2 * MAX_POINTS - 1
    assert sum(b["v"] for b in s["dead_letters"]) == 2 * MAX_POINTS  # summed, none lost
    assert all(b["first_batch"] <= b["batch"] for b in s["dead_letters"])


def test_the_charts_draw_a_point_or_bar_per_value_and_say_when_there_is_none():
    runs = [run(30, 1, dead=2, backlog=0), run(20, 2, backlog=0),
            run(10, 3, timings={"claim": 0.5, "weird step": 0.2}, backlog=0)]
    charts = {c["id"]: c for c in charts_svg(chart_data("orders", "1d", runs, [check(1, 5, success=False,
                                                                                        unexpected=3)], NOW))}
    assert list(charts) == ["throughput", "lag", "batch_seconds", "dead_letters", "quality"]
    assert charts["throughput"]["svg"].count('<circle class="pt"') == 3
    assert charts["lag"]["svg"].count('<circle class="pt"') == 3
    assert charts["dead_letters"]["svg"].count('<rect class="bar"') == 3
    assert '<rect class="bar bad"' in charts["quality"]["svg"]  # a failed check is drawn as such
    # Steps stacked in the drain's order, unknown ones after them, the unaccounted rest as "other".
    assert [label for _, label in charts["batch_seconds"]["legend"]] == ["claim", "commit", "weird step", "other"]
    assert "weird step 0.2 s" in charts["batch_seconds"]["svg"]
    # Colours come from the page's CSS (light or dark): no colour is written into the SVG.
    assert not re.search(r'(fill|stroke)="#', "".join(c["svg"] for c in charts.values()))
    # Counts are ticked in whole numbers, even when they are all 0.
    assert re.findall(r'class="tick" x="50" y="[\d.]+" text-anchor="end">([^<]+)<', charts["lag"]["svg"]) == ["0", "1"]
    empty = line_svg("Lag", "msgs", [], "lag", 0, 1)
    assert "no runs in this window" in empty and "<circle" not in empty


def test_titles_are_escaped():
    svg = line_svg("<b>x</b>", "<i>", [{"t": NOW.isoformat(), "v": 1.0}], "x", NOW.timestamp() - 60,
                   NOW.timestamp())
    assert "<b>" not in svg and "&lt;i&gt;" in svg


def _tables(c, p):
    import pyarrow as pa
    from deltalake import write_deltalake

    from deltadrain.lake.metrics import metrics_path
    from deltadrain.quality.results import results_path

    now = datetime.now(UTC)
    rows = [run(60 * 30, 1), run(30, 2, dead=4), run(10, 3)]
    metrics = pa.table({"pipeline": [p.name] * 3 + ["other"],
                        **{k: [r[k] for r in rows] + [rows[0][k]] for k in
                           ("batch", "outcome", "claimed", "written", "duplicates", "dead", "filtered", "seconds",
                            "rows_per_s", "backlog", "timings")},
                        "finished_at": pa.array([now - (NOW - r["finished_at"]) for r in rows] + [now],
                                                pa.timestamp("us", "UTC"))})
    write_deltalake(str(metrics_path(c)), metrics)
    write_deltalake(str(results_path(c)), pa.table({
        "pipeline": [p.name, p.name], "scope": ["batch", "table"], "batch": pa.array([2, None], pa.int64()),
        "success": [False, True], "unexpected_count": pa.array([7, 0], pa.int64()),
        "failed": ['["amount_positive"]', "[]"], "quarantined": pa.array([0, 0], pa.int64()),
        "checked_at": pa.array([now - timedelta(minutes=5)] * 2, pa.timestamp("us", "UTC"))}))


def test_rows_are_read_from_real_delta_tables_of_the_window_and_pipeline(tmp_path, cfg):
    from deltadrain.orchestration.view.charts import pipeline_charts

    c = cfg.model_copy(update={"data_dir": str(tmp_path / "lake")})
    p = c.pipelines[0]
    assert pipeline_charts(c, p, "1d")["series"]["throughput"] == []  # no tables yet
    _tables(c, p)
    day = pipeline_charts(c, p, "1d")
    assert [b["batch"] for b in day["series"]["dead_letters"]] == [2, 3]
    assert [(q["batch"], q["v"], q["failed"]) for q in day["series"]["quality"]] == [(2, 7, ["amount_positive"])]
    assert [b["batch"] for b in pipeline_charts(c, p, "7d")["series"]["dead_letters"]] == [1, 2, 3]


@pytest.fixture
def charted(client_for, cfg, tmp_path, monkeypatch):
    monkeypatch.setattr("deltadrain.orchestration.view.data.SOURCE_WAIT_S", 1)
    c = cfg.model_copy(update={"data_dir": str(tmp_path / "lake")})
    _tables(c, c.pipelines[0])
    monkeypatch.setattr("deltadrain.orchestration.view.app.load_cfg", lambda: c)
    return c


def test_the_page_and_the_json_endpoint_serve_the_charts(charted, client_for):
    client = client_for(FakeAuth())
    name = charted.pipelines[0].name
    data = client.get(f"/api/pipelines/{name}/charts?window=7d").json()
    assert data["window"] == "7d" and len(data["series"]["throughput"]) == 3
    assert client.get(f"/api/pipelines/{name}/charts").json()["window"] == "1d"
    assert client.get(f"/api/pipelines/{name}/charts?window=1y").status_code == 400
    page = client.get(f"/pipelines/{name}?window=1d").text
    assert all(f'id="chart-{i}"' in page for i in ("throughput", "lag", "batch_seconds", "dead_letters", "quality"))
    assert page.count('<circle class="pt"') == 4  # two runs in the day, on two line charts
    assert '<script src="../static/theme.js">' in page and "http" not in page.split("<body>")[0]
    assert client.get("/static/theme.js").headers["content-type"].startswith("text/javascript")
    assert client.get("/static/icon.svg").headers["content-type"].startswith("image/svg+xml")
    assert client.get("/static/app.py").status_code == 404  # only the files it names
    assert client_for(FakeAuth(allow_read=False)).get(f"/api/pipelines/{name}/charts").status_code == 403


def test_a_dags_tab_shows_its_pipeline_or_says_it_drains_none(charted, client_for):
    from deltadrain.names import ingest_dag_id
    from deltadrain.orchestration.view.app import EXTERNAL_VIEWS
    client = client_for(FakeAuth())
    name = charted.pipelines[0].name
    r = client.get(f"/dags/{ingest_dag_id(name)}", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == f"../pipelines/{name}"
    other = client.get("/dags/deltadrain__replay")
    assert other.status_code == 200 and 'id="not-ingest"' in other.text and f'href="../pipelines/{name}"' in other.text
    assert client_for(FakeAuth(allow_read=False)).get(f"/dags/{ingest_dag_id(name)}").status_code == 403
    assert {v["destination"]: v["href"] for v in EXTERNAL_VIEWS} == {"nav": "/deltadrain/",
                                                                     "dag": "/deltadrain/dags/{DAG_ID}"}
    assert len({v["url_route"] for v in EXTERNAL_VIEWS}) == 2  # Airflow drops a view whose route is taken
