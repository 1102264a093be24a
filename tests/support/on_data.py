"""`schedule: on_data` on the end-to-end test's `airflow standalone`: a Valkey and a Kafka pipeline whose
ingest DAGs run from their source's asset events, what the REST API's asset views say of those runs,
and the asset graph in a real browser."""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path

from deltadrain.config import DeltadrainConfig, PipelineConfig
from deltadrain.dev.produce import produce
from deltadrain.names import ingest_dag_id
from deltadrain.orchestration.assets import watched
from tests.support.lake import target_ids
from tests.support.pipelines import example_config

FAST = {"wait_timeout": "PT60S", "poll_interval": "PT2S", "retries": 0}


def on_data_pipelines(base: str) -> list[dict]:
    """A Valkey pipeline (one stream) and a Kafka one (its own topic and group), both `on_data`, for the
    end-to-end test's config."""
    example = {p["source"]["kind"]: p for p in example_config()["pipelines"]}
    valkey, kafka = dict(example["valkey"]), dict(example["kafka"])
    valkey.update(name=f"{base}_v", schedule="on_data", airflow=FAST,
                  source={**valkey["source"], "streams": [f"{base}_v:{{0}}"]}, target={"path": f"{base}_v"})
    kafka.update(name=f"{base}_k", schedule="on_data", airflow=FAST, target={"path": f"{base}_k"},
                 source={**kafka["source"], "topic": f"{base}_k", "partitions": 2, "group": f"{base}_k-group",
                         "id_from": "field_or_offset"})
    for pipe in (valkey, kafka):
        pipe.pop("quality", None)
    return [valkey, kafka]


def create_topics(c: DeltadrainConfig, pipelines: list[PipelineConfig]) -> None:
    from deltadrain.dev.produce import ensure_topic
    from deltadrain.sources.kafka.client import kafka_client_conf

    for p in pipelines:
        if p.source.kind == "kafka":
            ensure_topic(kafka_client_conf(c, p), p.source.topic, p.source.partitions)


def stamp(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def asset(api, uri: str) -> dict:
    (found,) = [a for a in api.call("GET", f"/api/v2/assets?uri_pattern={api._q(uri)}&limit=100")["assets"]
                if a["uri"] == uri]
    return found


def asset_events(api, asset_id: int) -> list[dict]:
    return api.call("GET", f"/api/v2/assets/events?asset_id={asset_id}&limit=100&order_by=timestamp")["asset_events"]


def wait_drained(spark, c, p, ids: set[str], api, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not ids <= set(target_ids(spark, c, p)):
        assert time.monotonic() < deadline, (p.name, api.runs(ingest_dag_id(p.name))[:5])
        time.sleep(2)


def wait_settled(api, dag_id: str, timeout: float = 300) -> list[dict]:
    """The DAG's runs once none is queued or running and no asset event waits for it."""
    deadline = time.monotonic() + timeout
    while True:
        runs = api.runs(dag_id)
        queued = api.call("GET", f"/api/v2/dags/{api._q(dag_id)}/assets/queuedEvents")["total_entries"]
        if not queued and not any(r["state"] in ("queued", "running") for r in runs):
            return runs
        assert time.monotonic() < deadline, (runs[:5], queued)
        time.sleep(2)


def why_no_run(api, c: DeltadrainConfig, p: PipelineConfig) -> dict:
    """What an assertion that waited for an `on_data` run shows: the pipeline's runs, its source Assets'
    last events, the events queued for it, and the standalone's last log lines that name it."""
    from deltadrain.dev import services

    dag_id = ingest_dag_id(p.name)
    log = services.FACTORIES["airflow"](c).log_file
    lines = [line for line in log.read_text(errors="replace").splitlines() if p.name in line] if log.exists() else []
    return {"runs": api.runs(dag_id)[:3],
            "source_events": [e for uri, _ in watched(c, p) for e in asset_events(api, asset(api, uri)["id"])][-3:],
            "queued": api.call("GET", f"/api/v2/dags/{api._q(dag_id)}/assets/queuedEvents"),
            "log": lines[-15:]}


def produce_first(c: DeltadrainConfig, p: PipelineConfig):
    """The first messages of an `on_data` pipeline, produced early: its runs drain them while the rest of
    the test goes on."""
    return produce(c, p, 20, seed=301, start=0)


def check_on_data(api, spark, c: DeltadrainConfig, p: PipelineConfig, first, release: Path | None) -> dict:
    """The `first` messages (produce_first) reached an `on_data` pipeline's table through asset-triggered runs
    only, each woken by its source Assets' events, which the asset views list with the runs they made; its
    runs put events on the target's and the dead letters' Assets. With `release` (the file whose absence holds
    the standalone's drains before their commit), messages that come while a run drains make at most one more
    run. Returns figures for the test's log."""
    dag_id = ingest_dag_id(p.name)
    began = time.monotonic()
    wait_drained(spark, c, p, set(first.valid_ids), api)
    latency = time.monotonic() - began
    extra: list[str] = []
    n, during = 0, []
    if release is not None:
        # While a run drains, more messages in several bursts: each changes the work the watcher sees, so
        # it marks the Asset again, but Airflow holds one queued run per DAG at max_active_runs=1. The run
        # is held before its commit meanwhile: a warm drain of a few messages can end before the watcher's
        # next poll, and then no burst comes while it runs.
        before = {r["dag_run_id"] for r in wait_settled(api, dag_id)}
        release.unlink()
        try:
            extra += produce(c, p, 5, seed=302, start=1000).valid_ids
            # As long as the other waits: the standalone's components, on one SQLite database, have stalled
            # together for a minute on a loaded machine.
            deadline = time.monotonic() + 300
            while not (running := [r["dag_run_id"] for r in api.runs(dag_id)
                                   if r["dag_run_id"] not in before and r["state"] == "running"]):
                assert time.monotonic() < deadline, why_no_run(api, c, p)
                time.sleep(0.5)
            n = 0
            while api.run_state(dag_id, running[0]) == "running" and n < 4:  # only while that first run drains
                n += 1
                extra += produce(c, p, 5, seed=303 + n, start=2000 + 100 * n).valid_ids
                time.sleep(2.5)
        finally:
            release.touch()
        wait_drained(spark, c, p, set(extra), api)
        wait_settled(api, dag_id)
        assert n >= 1, "the run ended before a burst came"
        # Airflow creates no run while one is active (max_active_runs=1): however many events the bursts
        # marked while the first run drained, at most one run was queued before it ended. The next run takes
        # the events marked after the running one's triggered time (`run_after`) up to its own (when the first
        # of them was queued); an event marked after that waits for a later event's run.
        runs = {r["dag_run_id"]: r for r in api.runs(dag_id)}
        later = sorted((r for i, r in runs.items() if i not in before and i != running[0]),
                       key=lambda r: stamp(r["run_after"]))
        assert later, ("the bursts made no run", why_no_run(api, c, p))
        ended = stamp(runs[running[0]]["end_date"])
        assert len([r for r in later if stamp(r["queued_at"]) < ended]) <= 1, (runs[running[0]], later)
        start, end = stamp(runs[running[0]]["run_after"]), stamp(later[0]["run_after"])
        during = [e for uri, _ in watched(c, p) for e in asset_events(api, asset(api, uri)["id"])
                  if start < stamp(e["timestamp"]) <= end]
        assert during, (n, start, end)
        made_by = {r["run_id"] for e in during for r in e["created_dagruns"]}
        assert made_by == {later[0]["dag_run_id"]}, (running[0], made_by)
    runs = wait_settled(api, dag_id)
    assert runs and all(r["run_type"] == "asset_triggered" and r["state"] == "success" for r in runs), runs
    # Idle: no run without work (an event per change of work, none for the same work seen again).
    time.sleep(3 * p.airflow.poll_interval.total_seconds())
    assert len(api.runs(dag_id)) == len(runs)
    # The asset views: each run came from events of the source's Assets, which carry counts and the pipeline.
    made: dict[str, list[dict]] = {}
    for uri, _ in watched(c, p):
        for event in asset_events(api, asset(api, uri)["id"]):
            assert event["extra"]["from_trigger"] is True and event["extra"]["payload"]["pipeline"] == p.name, event
            for run in event["created_dagruns"]:
                made.setdefault(run["run_id"], []).append(event)
    assert {r["dag_run_id"] for r in runs} <= set(made), (sorted(made), [r["dag_run_id"] for r in runs])
    for run in runs:
        upstream = api.call("GET", f"/api/v2/dags/{api._q(dag_id)}/dagRuns/{api._q(run['dag_run_id'])}/"
                                   "upstreamAssetEvents")["asset_events"]
        assert {e["id"] for e in upstream} == {e["id"] for e in made[run["dag_run_id"]]}
    # ... and each run updated the target's and the dead letters' Assets (the drain's outlets).
    for uri in (c.target_path(p).as_uri(), c.dlq_path(p).as_uri()):
        sources = {e["source_run_id"] for e in asset_events(api, asset(api, uri)["id"]) if e["source_dag_id"] == dag_id}
        assert sources == {r["dag_run_id"] for r in runs}, (uri, sources)
    assert sorted(target_ids(spark, c, p)) == sorted(set(first.valid_ids) | set(extra))  # once each
    events = sum(len(v) for v in made.values())
    return {"pipeline": p.name, "runs": len(runs), "source_events": events, "bursts": n,
            "events_during_one_run": len(during), "waited_for_first_s": round(latency, 1)}


def screenshot_asset_graph(tmp_path: Path, api, c: DeltadrainConfig, p: PipelineConfig) -> Path:
    """The target Asset's page in Airflow's UI, in a real headless Chromium: its graph shows the source
    Asset, the ingest DAG, the target and the quality DAG. The screenshot is kept as the test's artefact."""
    from tests.integration.browser import Browser, artefacts_dir

    shots = artefacts_dir(tmp_path, "test_airflow_e2e")
    browser = Browser(tmp_path / "chromium-assets", width=1600, height=1000)
    try:
        browser.log_in(api)
        target = asset(api, c.target_path(p).as_uri())
        browser.go(f"{api.base_url}/assets/{target['id']}")
        names = [watched(c, p)[0][0], ingest_dag_id(p.name), f"deltadrain.{p.name}", f"deltadrain__{p.name}__quality"]
        text = "[...document.querySelectorAll('.react-flow__node')].map(n => n.textContent).join('\\n')"
        shown = browser.wait_for(f"(() => {{ const t = {text}; return {names!r}.every(n => t.includes(n)) && t; }})()",
                                 what=f"the asset graph with {names}")
        time.sleep(1)  # the graph's layout animates into place
        path = browser.screenshot(shots / f"asset_graph_{p.source.kind}.png")
        assert all(n in shown for n in names), shown
        return path
    finally:
        browser.close()
