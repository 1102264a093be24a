"""The view's routes in-process (FastAPI TestClient): wiring, rendering on an empty lake, the
authorization checks. Airflow's real authentication is tested end to end in
tests/integration/test_view.py; here the user and the auth manager are stand-ins."""

from __future__ import annotations

from tests.support.pipelines import alerts_config
from tests.support.view import FakeAuth


def test_pages_render_on_an_empty_lake(client_for, cfg, monkeypatch):
    monkeypatch.setattr("deltadrain.orchestration.view.data.SOURCE_WAIT_S", 1)  # no broker runs here: each page would wait 10 s for it
    client = client_for(FakeAuth())
    names = [p.name for p in cfg.pipelines]
    assert client.get("/api/pipelines").json() == {"pipelines": names}
    index = client.get("/")
    assert index.status_code == 200 and all(f'href="pipelines/{n}"' in index.text for n in names)
    # The index as JSON: one row per pipeline, nothing run and nothing dead yet.
    rows = client.get("/api/overview").json()["pipelines"]
    assert [r["pipeline"] for r in rows] == names
    assert all((r["DEAD"], r["last_run"], r["last_committed"], r["lake_note"]) == (0, None, None, None) for r in rows)
    for name in names:
        data = client.get(f"/api/pipelines/{name}").json()
        assert (data["PUBLISHED"], data["DEAD"], data["REPLAYED"]) == (0, 0, 0)
        assert data["dead_letters"] == [] and data["last_batches"] == []
        page = client.get(f"/pipelines/{name}")
        assert page.status_code == 200 and "no dead letters" in page.text
    assert client.get("/pipelines/nope").status_code == 404
    assert client.get(f"/pipelines/{names[0]}?state=bogus").status_code == 400


def test_reading_and_replaying_need_the_permissions(client_for, cfg):
    name = cfg.pipelines[0].name
    assert client_for(FakeAuth(allow_read=False)).get(f"/api/pipelines/{name}").status_code == 403
    assert client_for(FakeAuth(allow_read=False)).get("/api/pipelines").json() == {"pipelines": []}
    assert client_for(FakeAuth(allow_read=False)).get("/api/overview").json() == {"pipelines": []}
    no_run = client_for(FakeAuth(allow_run=False))
    r = no_run.post(f"/pipelines/{name}/replay", json={"entries": ["s@1-0"]}, headers={"Authorization": "Bearer x"})
    assert r.status_code == 403 and "deltadrain__replay" in r.text
    # Cookie-only form posts need the same origin.
    ok = client_for(FakeAuth())
    ok.cookies.set("_token", "x")
    assert ok.post(f"/pipelines/{name}/replay", data={"entry": "s@1-0"}).status_code == 403
    r = ok.post(f"/pipelines/{name}/replay", data={"entry": "s@1-0"}, headers={"Origin": "http://testserver"})
    assert r.status_code == 400 and "not DEAD" in r.text


def test_the_page_names_who_holds_claims_and_flags_stale_ones():
    from deltadrain.orchestration.view.app import _templates

    v = {"pipeline": "orders", "source": "valkey", "partitions": ["s0"], "PENDING": 0, "CLAIMED": 12,
         "oldest_claim_idle_ms": 90_000, "stale_after_ms": 60_000, "last_batches": [], "dead_letters": [],
         "claimed_by": {"drain-live": {"claimed": 5, "idle_ms": 100, "stale": False},
                        "<b>drain-gone</b>": {"claimed": 7, "idle_ms": 90_000, "stale": True}}}
    page = _templates().get_template("pipeline.html.j2").render(v=v, state="DEAD", triggered=[], replay_dag="r")
    assert 'id="claim-drain-live"' in page and "drain-live\n(5, idle 100 ms)" in page
    stale = page.split('id="claim-&lt;b&gt;drain-gone&lt;/b&gt;"')[1].split("</span>")[0]
    assert 'class="bad"' in stale and "(7, idle 90,000 ms, stale)" in stale and "or the reaper" in stale
    assert "<b>drain-gone" not in page  # names are escaped


def test_open_gaps_say_whether_runs_stop_on_them_and_how_to_go_on():
    from deltadrain.orchestration.view.app import _templates

    gap = {"partition": "s0", "kind": "unread", "range": "1-0 to 9-0", "missing": 40, "reason": "trimmed"}
    v = {"pipeline": "orders", "source": "valkey", "partitions": ["s0"], "PENDING": 0, "CLAIMED": 0,
         "last_batches": [], "dead_letters": [], "gaps": [], "open_gaps": [gap], "ingest_dag": "deltadrain__orders__ingest"}
    render = _templates().get_template("pipeline.html.j2").render
    stops = render(v={**v, "on_gap": "fail"}, state="DEAD", triggered=[], replay_dag="r")
    assert "open: the runs stop on it" in stops and 'id="accept-gaps"' in stops
    assert 'href="../../dags/deltadrain__orders__ingest"' in stops and "<b>Accept gaps</b> on" in stops
    goes_on = render(v={**v, "on_gap": "continue"}, state="DEAD", triggered=[], replay_dag="r")
    assert "open: the next commit records it" in goes_on and 'id="accept-gaps"' not in goes_on
    closed = render(v={**v, "on_gap": "fail", "open_gaps": []}, state="DEAD", triggered=[], replay_dag="r")
    assert 'id="accept-gaps"' not in closed


def test_links_to_airflows_pages_stay_under_the_path_airflow_is_served_at():
    """The page is {base_url}/deltadrain/pipelines/<name>; Airflow's own pages are under the same
    base_url path, which may be a prefix behind a proxy (/airflow/...), so the links are relative."""
    import re
    from urllib.parse import urljoin

    from deltadrain.orchestration.view.app import _templates

    v = {"pipeline": "orders", "source": "valkey", "partitions": ["s0"], "PENDING": 0, "CLAIMED": 0,
         "last_batches": [], "dead_letters": [], "gaps": [], "on_gap": "fail", "ingest_dag": "deltadrain__orders__ingest",
         "open_gaps": [{"partition": "s0", "kind": "unread", "range": "1-0 to 9-0", "missing": 4, "reason": "x"}],
         "data_files": {"target": 9, "dlq": 3}, "maintenance_dag": "deltadrain__maintenance"}
    page = _templates().get_template("pipeline.html.j2").render(v=v, state="DEAD", triggered=["manual__1"],
                                                                 replay_dag="deltadrain__replay")
    links = re.findall(r'target="_top" href="([^"]+)"', page)
    for here in ("http://h:8080/deltadrain/pipelines/orders", "https://h/airflow/deltadrain/pipelines/orders"):
        root = here.split("deltadrain/pipelines")[0]
        assert sorted(urljoin(here, link) for link in links) == [
            f"{root}dags/deltadrain__maintenance", f"{root}dags/deltadrain__orders__ingest",  # the crumbs' DAG link
            f"{root}dags/deltadrain__orders__ingest", f"{root}dags/deltadrain__replay/runs/manual__1"]


def test_a_replay_that_cannot_reach_airflow_is_a_502_with_the_reason(client_for, cfg, monkeypatch):
    """The view triggers the replay DAG through Airflow's REST API; nothing listens at the API's port
    here, so the call is refused: the user gets 502 naming the address and the reason, not a bare 500."""
    from deltadrain.observe import tables as lakeview
    from tests.conftest import free_port

    name = cfg.pipelines[0].name
    port = free_port()
    monkeypatch.setenv("AIRFLOW__API__HOST", "0.0.0.0")
    monkeypatch.setenv("AIRFLOW__API__PORT", str(port))
    monkeypatch.setattr(lakeview, "dead_letter_keys", lambda c, p: {("s", "1-0"): "a"})
    r = client_for(FakeAuth()).post(f"/pipelines/{name}/replay", json={"entries": ["s@1-0"]},
                                    headers={"Authorization": "Bearer x"})
    assert r.status_code == 502, r.text
    assert f"cannot reach Airflow's REST API at http://127.0.0.1:{port}" in r.json()["detail"]
    assert "refused" in r.json()["detail"].lower()


def test_the_page_shows_the_tables_data_files_and_links_the_maintenance_dag():
    from deltadrain.orchestration.view.app import _templates

    v = {"pipeline": "orders", "source": "valkey", "partitions": ["s0"], "PENDING": 0, "CLAIMED": 0,
         "last_batches": [], "dead_letters": [], "data_files": {"target": 1234, "dlq": None},
         "maintenance_dag": "deltadrain__maintenance"}
    page = _templates().get_template("pipeline.html.j2").render(v=v, state="DEAD", triggered=[], replay_dag="r")
    files = page.split('id="data-files"')[1].split("</span>")[0]
    assert "target 1,234, dead letters\n—" in files and 'href="../../dags/deltadrain__maintenance"' in files


def test_the_page_names_the_offsets_runs_died_reading():
    from deltadrain.orchestration.view.app import _templates

    v = {"pipeline": "clicks", "source": "kafka", "partitions": ["0", "1"], "PENDING": 0, "CLAIMED": 0,
         "last_batches": [], "dead_letters": [],
         "dead_runs": [{"partition": 0, "offsets": [16, 24], "runs": 2, "alone": 0},
                       {"partition": 1, "offsets": [3, 5000], "runs": 1, "alone": 0},
                       {"partition": 1, "offsets": [5000, 5001], "runs": 5, "alone": 2}]}
    render = _templates().get_template("pipeline.html.j2").render
    died = render(v=v, state="DEAD", triggered=[], replay_dag="r").split('id="dead-runs"')[1].split("</span>")[0]
    assert ("Under suspicion: partition\n0 offsets [16, 24) (8 wide,\n2 runs died reading it), partition\n1 offsets "
            "[3, 5,000) (4,997 wide,\n1 run died reading it), partition\n1 offsets [5,000, 5,001) (1 wide,\n5 runs "
            "died reading it, 2 with one message alone).") in died
    assert "Nothing is dead-lettered for that; a message alone in max_retries runs that died is." in died
    assert 'id="dead-runs"' not in render(v={**v, "dead_runs": []}, state="DEAD", triggered=[], replay_dag="r")


def test_the_page_names_the_entries_valkey_runs_died_on():
    from deltadrain.orchestration.view.app import _templates

    v = {"pipeline": "orders", "source": "valkey", "partitions": ["s0"], "PENDING": 0, "CLAIMED": 12,
         "last_batches": [], "dead_letters": [],
         "splits": [{"partition": "s0", "ids": ["5-0", "8-0"], "entries": 4, "deliveries": 4, "kind": "suspect"},
                    {"partition": "s0", "ids": ["9-0", "17-0"], "entries": 8, "deliveries": 2, "kind": "rest"},
                    {"partition": "s0", "ids": ["20-0", "20-0"], "entries": 1, "deliveries": 7, "kind": "suspect",
                     "alone": 3}]}
    render = _templates().get_template("pipeline.html.j2").render
    left = render(v=v, state="DEAD", triggered=[], replay_dag="r").split('id="splits"')[1].split("</span>")[0]
    assert ("Under suspicion: stream\ns0 ids 5-0 .. 8-0 (4 entries, delivered 4 times), stream\ns0 ids 9-0 .. 17-0 "
            "(8 entries, delivered 2 times, the untried half of a split), stream\ns0 ids 20-0 .. 20-0 (1 entries, "
            "delivered 7 times, 3 runs died reading one alone).") in left
    assert "a message alone in max_retries runs that died is" in left
    assert 'id="splits"' not in render(v={**v, "splits": []}, state="DEAD", triggered=[], replay_dag="r")


def test_last_batches_show_what_the_transform_filtered_and_a_dash_for_runs_before_the_count():
    from datetime import datetime

    from deltadrain.orchestration.view.app import _templates

    def batch(run: int, **more) -> dict:
        return {"finished_at": datetime(2026, 11, 27, 12, run), "batch": run, "outcome": "committed", "claimed": 1200,
                "written": 1000, "duplicates": 0, "dead": 0, "seconds": 2.0, "rows_per_s": 600, "backlog": 0, **more}

    v = {"pipeline": "orders", "source": "valkey", "partitions": ["s0"], "PENDING": 0, "CLAIMED": 0,
         "dead_letters": [], "last_batches": [batch(2, filtered=200), batch(1, filtered=None), batch(0)]}
    page = _templates().get_template("pipeline.html.j2").render(v=v, state="DEAD", triggered=[], replay_dag="r")
    table = page.split('<table id="batches">')[1].split("</table>")[0]
    assert "<th>dead</th><th>filtered</th>" in table
    cells = [row.split('<td class="n">') for row in table.split("<tr>")[2:]]
    assert [row[6].split("<")[0] for row in cells] == ["200", "—", "—"]


def test_last_batches_show_each_committed_batch_check():
    from datetime import UTC, datetime

    from deltadrain.orchestration.view.app import _templates

    def batch(run: int, outcome: str = "committed", **more) -> dict:
        return {"finished_at": datetime(2026, 11, 27, 12, run), "batch": run, "outcome": outcome, "claimed": 10,
                "written": 10, "duplicates": 0, "dead": 0, "seconds": 1.0, "rows_per_s": 10, "backlog": 0, **more}

    at = datetime(2026, 11, 27, 13, 5, tzinfo=UTC)
    failed = {"success": False, "failed": ["amount_between", "id_unique"], "quarantined": 3, "policy": "quarantine",
              "checked_at": at}
    v = {"pipeline": "orders", "source": "valkey", "partitions": ["s0"], "PENDING": 0, "CLAIMED": 0,
         "dead_letters": [], "last_batches": [
             batch(4, quality=None, owed=True), batch(3, quality=failed),
             batch(2, quality={**failed, "success": True, "failed": [], "quarantined": 0}),
             batch(2, outcome="failed"),  # no check is of a run that committed nothing: no "quality" key
             batch(1, quality={**failed, "success": True, "failed": [], "quarantined": 1}),
             batch(0, quality=None, owed=False)]}  # drained with the CLI before the first check
    page = _templates().get_template("pipeline.html.j2").render(v=v, state="DEAD", triggered=[], replay_dag="r")
    table = page.split('<table id="batches">')[1].split("</table>")[0]
    assert "<th>outcome</th><th>quality</th>" in table
    cells = [row.split("</td>")[3].strip() for row in table.split("<tr>")[2:]]
    assert cells[0].startswith("<td title=") and cells[0].endswith(">not checked")
    assert cells[1] == ('<td class="bad" title="checked 2026-11-27 13:05:00 UTC, on_failure: quarantine">'
                        "failed: amount_between, id_unique (3 rows quarantined)")
    assert cells[2] == '<td title="checked 2026-11-27 13:05:00 UTC">passed' and cells[3] == "<td>"
    assert cells[4].endswith(">passed (1 row quarantined by an earlier check)")
    assert cells[5].endswith(">not checked (whole-table check only)")


def test_the_index_shows_each_pipeline_at_a_glance():
    from datetime import UTC, datetime

    from deltadrain.orchestration.view.app import _templates

    run = {"finished_at": datetime(2026, 11, 27, 12, 30), "batch": 7, "outcome": "committed", "error": None,
           "quality": {"success": True, "failed": [], "quarantined": 0, "policy": "fail",
                       "checked_at": datetime(2026, 11, 27, 12, 31, tzinfo=UTC)}}
    failed_run = {"finished_at": datetime(2026, 11, 27, 12, 40), "batch": 8, "outcome": "failed",
                  "error": "DrainError: boom"}
    healthy = {"pipeline": "orders", "source": "valkey", "lag": 1200, "DEAD": 0, "source_note": None,
               "lake_note": None, "stale_messages": 0, "open_gaps": 0, "last_run": run, "last_committed": run}
    troubled = {"pipeline": "clicks", "source": "kafka", "lag": None, "DEAD": 3,
                "source_note": "source unreachable (KafkaException)", "lake_note": None, "stale_messages": 2500,
                "open_gaps": 1, "last_run": failed_run, "last_committed": {**run, "quality": None, "owed": True}}
    new = {"pipeline": "fresh", "source": "valkey", "lag": 0, "DEAD": 0, "source_note": None, "lake_note": None,
           "stale_messages": 0, "open_gaps": 0, "last_run": None, "last_committed": None}
    long_error = {**failed_run, "error": "GapError: " + "x" * 300}
    broken = {**new, "pipeline": "broken", "DEAD": None, "lake_note": "lake unreadable (OSError)",
              "last_run": long_error}
    page = _templates().get_template("index.html.j2").render(pipelines=[healthy, troubled, new, broken])
    rows = {r.split('"')[0]: r.replace("\n", "") for r in page.split('<tr id="pipeline-')[1:]}
    assert '<td class="n">1,200</td><td class="n">0</td><td class="bad"></td>' in rows["orders"]
    assert "<td>2026-11-27 12:30:00 committed</td><td class=\"n\">7</td><td title=" in rows["orders"]
    assert rows["orders"].split("</td>")[7].endswith(">passed")
    assert ('<td class="n">—</td><td class="n bad">3</td><td class="bad">source unreachable (KafkaException); '
            "1 open gap; 2,500 messages in stale claims; last run: DrainError: boom</td>") in rows["clicks"]
    assert rows["clicks"].split("</td>")[7].endswith(">not checked")
    assert "<td>no runs recorded yet</td><td></td><td></td>" in rows["fresh"]
    # A lake that cannot be read is said in its row; a long error is cut, in full in the cell's title.
    assert f'<td class="bad" title="GapError: {"x" * 300}">lake unreadable (OSError); last run: GapError: x' in rows["broken"]
    assert "x" * 120 not in rows["broken"].split(">lake unreadable")[1]
    assert _templates().get_template("index.html.j2").render(pipelines=[]).count("no pipeline you may read") == 1


def test_states_are_grey_notes_on_the_page_and_in_the_index_not_red():
    from deltadrain.orchestration.view.app import _templates

    notes = [{"state": "never_run", "note": "never run: <no> target table yet"},
             {"state": "no_topic", "note": "topic 'clicks' does not exist yet"}]
    v = {"pipeline": "clicks", "source": "kafka", "partitions": ["clicks"], "PENDING": 0, "CLAIMED": 0,
         "last_batches": [], "dead_letters": [], "notes": notes}
    page = _templates().get_template("pipeline.html.j2").render(v=v, state="DEAD", triggered=[], replay_dag="r")
    assert '<p class="note" id="note-never_run">never run: &lt;no&gt; target table yet.</p>' in page
    assert '<p class="note" id="note-no_topic">topic &#39;clicks&#39; does not exist yet.</p>' in page
    assert 'class="bad"' not in page.split("<h2>Last batches</h2>")[0]
    row = {"pipeline": "clicks", "source": "kafka", "lag": 0, "DEAD": 0, "source_note": None, "lake_note": None,
           "stale_messages": 0, "open_gaps": 1, "last_run": None, "last_committed": None, "notes": notes}
    index = _templates().get_template("index.html.j2").render(pipelines=[row]).replace("\n", "")
    assert ('<td class="bad">1 open gap<span class="note">; never run: &lt;no&gt; target table yet</span>'
            '<span class="note">; topic &#39;clicks&#39; does not exist yet</span></td>') in index


def test_the_page_shows_the_last_alerts_check_red_when_it_failed_with_a_link_to_its_task(tmp_path):
    from datetime import UTC, datetime

    from deltadrain.orchestration.view.app import _templates
    from deltadrain.orchestration.view.runs import alerts_of, thresholds

    base = {"pipeline": "orders", "source": "valkey", "partitions": ["s0"], "PENDING": 0, "CLAIMED": 0,
            "last_batches": [], "dead_letters": []}
    shown = {"max_lag": "5,000 messages", "max_pending_age": "900 s", "max_dead_rise": "0 dead letters"}

    def render(alerts):
        page = _templates().get_template("pipeline.html.j2").render(v={**base, "alerts": alerts}, state="DEAD",
                                                                   triggered=[], replay_dag="r")
        return page.split('id="alerts"')[1].split("</p>")[0] if 'id="alerts"' in page else None

    last = {"state": "failed", "run_id": "manual__2026-05-01T12:00:00+00:00", "at": datetime(2026, 5, 1, 12, 1, tzinfo=UTC),
            "dag_id": "deltadrain__orders__ingest", "task_id": "alerts"}
    failed = render({"thresholds": shown, "last": last})
    assert failed.startswith(' class="bad"') and "max_lag 5,000 messages, max_pending_age 900 s" in failed
    assert ('href="../../dags/deltadrain__orders__ingest/runs/manual__2026-05-01T12%3A00%3A00%2B00%3A00/tasks/alerts"'
            ">failed</a>") in failed and "2026-05-01 12:01:00 UTC" in failed
    passed = render({"thresholds": shown, "last": {**last, "state": "success"}})
    assert passed.startswith(' class="note"') and ">success</a>" in passed
    assert "no check has run yet" in render({"thresholds": shown, "last": None})
    assert render(None) is None  # no thresholds: nothing to say

    cfg = alerts_config(tmp_path, {"max_lag": 5000, "max_pending_age": "PT15M", "max_dead_rise": 0})
    assert thresholds(cfg.pipelines[0]) == shown
    assert alerts_of(cfg.pipelines[1]) is None  # sets none: the metadata DB is not asked
