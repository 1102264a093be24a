"""The operator's view on a real `airflow standalone`: the plugin is mounted, every endpoint needs
Airflow's authentication, the counts are the real ones of a drained pipeline (read by delta-rs from
the Spark-written tables), payloads are escaped, and "Replay selected" creates real replay DAG runs
that turn the selected dead letters REPLAYED."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

from deltadrain.airflow_api import AirflowApi, embedded_api
from deltadrain.config.embedded import airflow_password_file
from deltadrain.dev import services
from deltadrain.dev.produce import VALKEY_FIELD, produce
from deltadrain.names import REPLAY_DAG, ingest_dag_id
from deltadrain.sources.valkey.client import valkey_client
from tests.integration.browser import Browser, artefacts_dir
from tests.support.lake import dlq_rows, target_ids
from tests.support.valkey import drain_until_done, make_pipeline

SCRIPT = b"<script>alert('dd')</script> is not JSON"


def http(method: str, url: str, *, token: str | None = None, cookie: str | None = None, body: bytes | None = None,
         headers: dict | None = None) -> tuple[int, str, dict]:
    req = urllib.request.Request(url, data=body, method=method, headers=dict(headers or {}))
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    if cookie:
        req.add_header("Cookie", f"_token={cookie}")

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    try:
        with urllib.request.build_opener(NoRedirect).open(req, timeout=60) as resp:
            return resp.status, resp.read().decode(), dict(resp.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace"), dict(exc.headers)


@pytest.mark.slow
def test_view_shows_real_counts_and_replays_selected(tmp_path, spark, valkey_server, spark_connect_server, monkeypatch):
    path, c, p = make_pipeline(tmp_path, max_retries=0, partitions=2)
    monkeypatch.setenv("DELTADRAIN_CONFIG", str(path))  # what the API server's view (and the DAGs) read
    client = valkey_client(c, p)
    result = produce(c, p, 80, seed=6, malformed_ratio=0.1, poison_ratio=0.03)
    assert result.poison_ids, "the seed must give at least one poison message (it has an id)"
    client.xadd(p.source.streams[0], {VALKEY_FIELD: SCRIPT})  # id-less, and HTML in the preview
    drain_until_done(c, p, spark, client)
    published, dead = len(target_ids(spark, c, p)), len(dlq_rows(spark, c, p))
    assert published == len(result.valid_ids) and dead >= 2

    try:
        services.up(c, ["airflow"])
        api = embedded_api(c)
        token = api.token()
        base = f"{api.base_url}/deltadrain"
        page, data = f"{base}/pipelines/{p.name}", f"{base}/api/pipelines/{p.name}"
        charts = f"{data}/charts"

        # Authentication is required everywhere: none -> 401, a forged token -> 403.
        for url in (f"{base}/", page, data, f"{base}/api/pipelines", f"{base}/api/overview", charts,
                    f"{base}/dags/{ingest_dag_id(p.name)}", f"{base}/static/theme.js"):
            assert http("GET", url)[0] == 401, url
            assert http("GET", url, token="not-a-jwt")[0] in (401, 403), url
        assert http("POST", f"{page}/replay", body=b"entry=x@1-0",
                    headers={"Content-Type": "application/x-www-form-urlencoded"})[0] == 401
        # The nav entry and the DAGs' tab are registered with the UI.
        plugins = api.call("GET", "/api/v2/plugins")["plugins"]
        ours = next(x for x in plugins if x["name"] == "deltadrain_view")
        assert {v["destination"]: v["href"] for v in ours["external_views"]} == {
            "nav": "/deltadrain/", "dag": "/deltadrain/dags/{DAG_ID}"} and ours["fastapi_apps"]

        began = time.monotonic()
        status, body, _ = http("GET", data, token=token)
        first = time.monotonic() - began
        assert status == 200, body
        view = json.loads(body)
        assert (view["PUBLISHED"], view["DEAD"], view["REPLAYED"]) == (published, dead, 0)
        assert (view["PENDING"], view["CLAIMED"], view["lag"]) == (0, 0, 0)
        assert {(d["partition"], d["position"]) for d in view["dead_letters"]} == {
            (r.partition, r.position) for r in dlq_rows(spark, c, p)}
        assert view["last_batches"] and view["last_batches"][0]["outcome"] in ("committed", "empty")
        # Drained with the CLI, no batch check has run: every committed batch shows as not checked,
        # and owed to no batch check (only the daily whole-table check reads them).
        committed = [b for b in view["last_batches"] if b["outcome"] == "committed"]
        assert committed and all(b["quality"] is None and b["owed"] is False for b in committed)
        assert view["last_commit"]["batch"] >= 1
        began = time.monotonic()
        assert http("GET", data, token=token)[0] == 200
        again = time.monotonic() - began
        print(f"view JSON: first {first:.3f}s (reads {view['read_seconds']}s), cached {again:.3f}s")

        # The page, with the bearer token and with the UI's cookie; the payload is escaped.
        for kwargs in ({"token": token}, {"cookie": token}):
            status, html, _ = http("GET", page, **kwargs)
            assert status == 200, html
            assert f'<td id="PUBLISHED">{published:,}</td>' in html and f'<td id="DEAD">{dead:,}</td>' in html
            assert "<script>alert" not in html and "&lt;script&gt;alert(&#39;dd&#39;)&lt;/script&gt;" in html
            assert html.count('name="entry"') == dead
            assert not [s for s in secrets_of_services() if s in html], "a secret in the page"
        # The index: the pipeline at a glance, from the same sources (lag 0, its dead letters, the last batch).
        row = http("GET", f"{base}/", token=token)[1].split(f'<tr id="pipeline-{p.name}">')[1].split("</tr>")[0]
        row = row.replace("\n", "")
        assert f'<td class="n">0</td><td class="n bad">{dead:,}</td><td class="bad"></td>' in row, row
        last = max(b["batch"] for b in view["last_batches"] if b["outcome"] == "committed")
        assert f'<td class="n">{last:,}</td><td title=' in row and row.split("</td>")[7].endswith(">not checked (whole-table check only)"), row
        # The same row as JSON, for scripts and alerts.
        status, body, _ = http("GET", f"{base}/api/overview", token=token)
        assert status == 200, body
        summary = next(r for r in json.loads(body)["pipelines"] if r["pipeline"] == p.name)
        assert (summary["lag"], summary["DEAD"], summary["source_note"], summary["lake_note"]) == (0, dead, None, None)
        assert (summary["last_committed"]["batch"], summary["last_committed"]["quality"]) == (last, None)

        # The charts' data: every run of the drains above, the dead letters they wrote per batch.
        status, body, _ = http("GET", f"{charts}?window=1d", token=token)
        assert status == 200, body
        series = json.loads(body)["series"]
        assert series["throughput"] and series["lag"] and series["batch_seconds"]
        assert sum(b["v"] for b in series["dead_letters"]) == dead, series["dead_letters"]
        assert all(b["steps"] for b in series["batch_seconds"] if b["outcome"] == "committed")
        see_in_a_browser(tmp_path, api, p, dead)

        rows = dlq_rows(spark, c, p)
        poison = next(r for r in rows if r.message_id == result.poison_ids[0])
        script = next(r for r in rows if r.original is not None and bytes(r.original) == SCRIPT)
        picked = [f"{poison.partition}@{poison.position}", f"{script.partition}@{script.position}"]
        form = urllib.parse.urlencode([("entry", e) for e in picked]).encode()
        form_headers = {"Content-Type": "application/x-www-form-urlencoded"}
        # A cookie-only form post from another origin (or none) is refused: the cookie alone is no consent.
        for origin in ({}, {"Origin": "http://evil.example"}):
            assert http("POST", f"{page}/replay", cookie=token, body=form, headers={**form_headers, **origin})[0] == 403
        # A form post from the page itself is parsed and checked against the DLQ (an unknown entry -> 400).
        host = urllib.parse.urlsplit(api.base_url).netloc
        status, body, _ = http("POST", f"{page}/replay", cookie=token,
                               body=urllib.parse.urlencode([("entry", "nope@1-0")]).encode(),
                               headers={**form_headers, "Origin": f"http://{host}"})
        assert status == 400 and "not DEAD" in body, body

        api.wait_for_dag(REPLAY_DAG, timeout=300)
        # Unpaused only once both runs exist. A task that starts while the view posts the second run
        # holds SQLite's write lock until the API server's event loop runs its session teardown, and
        # that loop is blocked by Airflow's audit-log commit for the post (async, with a sync session):
        # both wait out the 60 s lock timeout (ci73). SQLite-only: the embedded metadata DB.
        before = {r["dag_run_id"] for r in api.runs(REPLAY_DAG)}
        status, body, headers = http("POST", f"{page}/replay", cookie=token, body=form,
                                     headers={**form_headers, "Origin": f"http://{host}"})
        assert status == 303, body
        runs = urllib.parse.parse_qs(urllib.parse.urlsplit(headers["location"]).query)["triggered"][0].split(",")
        assert len(runs) == 2  # one by message id, one for the id-less entry
        assert set(runs) == {r["dag_run_id"] for r in api.runs(REPLAY_DAG)} - before
        confs = {r["dag_run_id"]: r["conf"] for r in api.runs(REPLAY_DAG)}
        assert any(confs[r].get("message_ids") == [poison.message_id] for r in runs), confs
        assert any(confs[r].get("position_from") == script.position for r in runs), confs
        assert all(confs[r]["requested_by"] == api.username for r in runs), confs  # who asked
        # A read-only user may see the page but not replay: Airflow's own permission on the replay DAG.
        viewer = AirflowApi(api.base_url, "viewer", json.loads(airflow_password_file().read_text())["viewer"])
        assert http("GET", page, token=viewer.token())[0] == 200
        status, body, _ = http("POST", f"{page}/replay", token=viewer.token(), body=json.dumps(
            {"entries": picked}).encode(), headers={"Content-Type": "application/json"})
        assert status == 403 and REPLAY_DAG in body, body
        assert {r["dag_run_id"] for r in api.runs(REPLAY_DAG)} - before == set(runs)
        api.unpause(REPLAY_DAG)
        for run in runs:
            assert api.wait_for_run(REPLAY_DAG, run, timeout=900) == "success", api.task_states(REPLAY_DAG, run)

        states = {(r.partition, r.position): r.state for r in dlq_rows(spark, c, p)}
        # Each replay's DLQ commit names its run and who asked.
        marks = [json.loads(info["userMetadata"]) for f in sorted((c.dlq_path(p) / "_delta_log").glob("*.json"))
                 for line in f.read_text().splitlines()
                 if (info := json.loads(line).get("commitInfo")) and "deltadrain_replay" in info.get("userMetadata", "")]
        replayed_by = {r.replay_run_id for r in dlq_rows(spark, c, p) if r.state == "REPLAYED"}
        assert len(marks) == len(runs) and {m["run_id"] for m in marks} == replayed_by, marks
        assert {m["requested_by"] for m in marks} == {api.username}, marks
        assert states[(poison.partition, poison.position)] == "REPLAYED"
        assert states[(script.partition, script.position)] == "REPLAYED"
        assert list(states.values()).count("REPLAYED") == 2
        view = json.loads(http("GET", data, token=token)[1])
        assert (view["DEAD"], view["REPLAYED"]) == (dead - 2, 2)
        # Replaying the same entries again is refused: they are no longer DEAD.
        status, body, _ = http("POST", f"{page}/replay", token=token, body=json.dumps({"entries": picked}).encode(),
                               headers={"Content-Type": "application/json"})
        assert status == 400 and "not DEAD" in body, body
    finally:
        services.down(c, ["airflow"])


def secrets_of_services() -> list[str]:
    """The embedded services' passwords (Valkey's users, Kafka's SCRAM user and keystore)."""
    from deltadrain.config.embedded import kafka_login, valkey_login

    valkey, kafka = valkey_login(), kafka_login()
    return [valkey["password"], valkey["admin_password"], kafka["password"], kafka["keystore_password"]]


def see_in_a_browser(tmp_path, api, p, dead: int) -> None:
    """The view as a user sees it in Airflow's UI, in a real headless Chromium: logged in through
    Airflow's login page, the index from the navigation entry and the pipeline from its ingest DAG's
    tab (light and dark), with their charts drawn; screenshots kept as the test's artefacts."""
    began, shots = time.monotonic(), artefacts_dir(tmp_path, "test_view")
    frame = "document.querySelector('iframe[title=\"deltadrain\"]')?.contentDocument"
    browser = Browser(tmp_path / "chromium")
    try:
        browser.log_in(api)

        # Airflow's navigation has a deltadrain entry: it opens the index inside Airflow's frame.
        entry = "document.querySelector('nav a[href$=\"/plugin/deltadrain\"], a[href$=\"/plugin/deltadrain\"]')"
        browser.wait_for(entry, what="a deltadrain entry in Airflow's navigation")
        browser.evaluate(f"{entry}.click()")
        browser.wait_for(f"{frame}?.querySelector('#pipeline-{p.name}')", what="the index in Airflow's frame")
        browser.screenshot(shots / "index_in_airflow.png")

        # The ingest DAG's tab shows the pipeline's page, its charts drawn with the drains' data.
        api.wait_for_dag(ingest_dag_id(p.name), timeout=300)
        tab = f"{api.base_url}/dags/{ingest_dag_id(p.name)}/plugin/deltadrain-pipeline"
        for theme in ("light", "dark"):
            browser.evaluate(f"localStorage.setItem('theme', '{theme}')")  # Airflow's own theme switch
            browser.go(tab)
            browser.wait_for(f"{frame}?.querySelector('#chart-throughput circle.pt')", what="the charts in the DAG's tab")
            points = browser.evaluate(f"{frame}.querySelectorAll('#chart-throughput circle.pt').length")
            bars = browser.evaluate(f"[...{frame}.querySelectorAll('#chart-dead_letters rect.bar')]"
                                    ".reduce((n, r) => n + Number(r.dataset.v), 0)")
            assert points >= 1 and bars == dead, (points, bars)
            # The frame follows Airflow's theme.
            assert browser.evaluate(f"{frame}.documentElement.dataset.theme") == theme
            browser.screenshot(shots / f"pipeline_in_dag_tab_{theme}.png")
        # The whole page on its own (the frame scrolls inside Airflow's).
        browser.go(f"{api.base_url}/deltadrain/pipelines/{p.name}")
        browser.wait_for("document.querySelector('#chart-lag circle.pt')", what="the pipeline page")
        browser.screenshot(shots / "pipeline_page.png", full_page=True)
        # Nothing was fetched from anywhere but Airflow.
        assert browser.requested_hosts() == {urllib.parse.urlsplit(api.base_url).netloc}, browser.requested_hosts()
        print(f"browser: {time.monotonic() - began:.1f}s, screenshots in {shots}")
    finally:
        browser.close()
