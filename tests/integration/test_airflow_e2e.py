"""End to end on a real `airflow standalone` (scheduler, triggerer, DAG processor, API server):
trigger the ingest DAG through the authenticated REST API v2, replay dead letters with conf, refuse
bad params, and heal a deleted row with a two-interval backfill run from the CLI, exactly once. Beside
it, a `@continuous` pipeline drains as its messages come, and its own quality DAG, started by the
drains' asset events, checks the batches they committed; a Valkey and a Kafka pipeline on `on_data` drain
from their sources' asset events, which the asset views show with the runs they made, and the asset
graph shows source -> ingest -> target -> quality in a browser."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from deltadrain.airflow_api import AirflowApi, embedded_api
from deltadrain.config.embedded import airflow_env
from deltadrain.dev import services
from deltadrain.dev.produce import MALFORMED_KINDS, produce
from deltadrain.lake.checkpoint import read_checkpoint
from deltadrain.names import REPLAY_DAG, batch_quality_dag_id, ingest_dag_id
from deltadrain.quality.results import last_results
from deltadrain.sources.valkey.client import valkey_client
from tests.support.lake import dlq_rows, target_ids
from tests.support.on_data import (
    check_on_data,
    create_topics,
    on_data_pipelines,
    produce_first,
    screenshot_asset_graph,
)
from tests.support.pipelines import ROOT
from tests.support.processes import held_at
from tests.support.valkey import assert_exactly_once, lag, make_pipeline, pending


def minute_floor(t: datetime) -> datetime:
    return t.replace(second=0, microsecond=0)


def services_secrets() -> dict[str, str]:
    """The embedded services' own secrets that exist in this home: the Valkey ACL users', the broker's
    SCRAM user's and keystore's, the S3 server's and the Spark cluster's shared one."""
    from deltadrain.config.embedded import (
        kafka_login_file,
        s3_login_file,
        spark_cluster_secret_file,
        valkey_login_file,
    )

    found = {}
    for name, path, keys in (("valkey", valkey_login_file(), ("password", "admin_password")),
                             ("kafka", kafka_login_file(), ("password", "keystore_password")),
                             ("s3", s3_login_file(), ("secret_access_key",))):
        if path.exists():
            login = json.loads(path.read_text())
            found.update({f"{name} {k}": login[k] for k in keys})
    if spark_cluster_secret_file().exists():
        found["spark_cluster secret"] = spark_cluster_secret_file().read_text().strip()
    return found


def xcom_values(api) -> list:
    """Every XCom of every DAG run of the embedded Airflow, its value as the REST API gives it."""
    entries: list = []
    while True:
        page = api.call("GET", f"/api/v2/dags/~/dagRuns/~/taskInstances/~/xcomEntries?limit=100&offset={len(entries)}")
        entries += page["xcom_entries"]
        if not page["xcom_entries"] or len(entries) >= page["total_entries"]:
            break
    assert entries, "no XCom at all"
    return [api.call("GET", f"/api/v2/dags/{api._q(e['dag_id'])}/dagRuns/{api._q(e['run_id'])}/taskInstances/"
                            f"{api._q(e['task_id'])}/xcomEntries/{api._q(e['key'])}?map_index={e['map_index']}"
                            f"&stringify=true") for e in entries]


@pytest.mark.slow
def test_airflow_end_to_end(tmp_path, monkeypatch, spark, valkey_server, kafka_broker, spark_connect_server,
                            s3_server):
    path, c, p = make_pipeline(tmp_path, schedule="* * * * *", max_retries=0)
    data = yaml.safe_load(path.read_text())
    data["pipelines"][0]["airflow"] = {"wait_timeout": "PT20S", "poll_interval": "PT2S", "retries": 0}
    example = next(q for q in yaml.safe_load((ROOT / "config" / "pipelines.yaml").read_text())["pipelines"]
                   if q["source"]["kind"] == "valkey")
    # Its sensor waits deferred for up to ten minutes: no run starts and ends empty every few seconds
    # while the rest of the test goes on.
    flowing = {**data["pipelines"][0], "name": f"{p.name}_c", "schedule": "@continuous",
               "quality": {**example["quality"], "on_failure": "warn"},
               "airflow": {**data["pipelines"][0]["airflow"], "wait_timeout": "PT10M"}}
    flowing["source"] = {**flowing["source"], "streams": [f"{p.name}_c:{{0}}"]}
    flowing["target"] = {**flowing["target"], "path": f"{p.name}_c"}
    data["pipelines"].append(flowing)
    data["pipelines"] += on_data_pipelines(p.name)
    path.write_text(yaml.safe_dump(data))
    c = type(c).model_validate(data).model_copy(update={"source_file": path})
    q = c.pipeline(flowing["name"])
    on_data = [c.pipeline(f"{p.name}_v"), c.pipeline(f"{p.name}_k")]
    create_topics(c, on_data)
    monkeypatch.setenv("DELTADRAIN_CONFIG", str(path))  # what the standalone's DAG processor parses
    # The drains the standalone runs go on at once while `release` exists; the on_data check takes it away to
    # hold a run before its commit while messages keep coming.
    release = tmp_path / "drains-go-on"
    release.touch()
    for key, value in held_at("before_commit", release).items():
        monkeypatch.setenv(key, value)
    client = valkey_client(c, p)
    dag_id = ingest_dag_id(p.name)
    try:
        services.up(c, ["airflow"])
        api = embedded_api(c)
        # Unauthenticated calls are refused.
        assert AirflowApi(api.base_url, "admin", "wrong")._request("GET", "/api/v2/dags", auth=False)[0] == 401

        produced_at = datetime.now(UTC)
        result = produce(c, p, 300, seed=111, malformed_ratio=0.05, poison_ratio=0.01)
        bad = result.bad_places((*MALFORMED_KINDS, "poison"))
        api.wait_for_dag(dag_id, timeout=300)
        api.wait_for_dag(REPLAY_DAG, timeout=120)
        for flowing_dag in [d for r in (q, *on_data) for d in (ingest_dag_id(r.name), batch_quality_dag_id(r.name))]:
            api.wait_for_dag(flowing_dag, timeout=120)
            api.unpause(flowing_dag)
        flow = produce(c, q, 40, seed=112)  # drained while the rest of the test runs
        firsts = [produce_first(c, r) for r in on_data]  # so are these, from their Assets' events
        api.unpause(dag_id)
        api.unpause(REPLAY_DAG)
        run_id = api.trigger(dag_id)  # no logical date: a normal drain
        assert api.wait_for_run(dag_id, run_id) == "success", api.task_states(dag_id, run_id)
        # Every component has run a task or a trigger by now: they all listen on 127.0.0.1 only.
        from tests.support.processes import beyond_loopback, listening_addresses

        listening = listening_addresses(services.FACTORIES["airflow"](c).pid())
        assert {int(a.split(":")[1], 16) for a in listening} >= {services.ports(c).airflow}, listening
        assert not beyond_loopback(listening), f"Airflow listens beyond 127.0.0.1: {listening}"
        # Unpausing also starts the schedule (every minute), and max_active_runs=1 lines the runs up:
        # whichever run found the messages drained them. Every finished run's summary is in XCom.
        summaries = []
        for run in api.runs(dag_id):
            if run["state"] == "success" and api.task_states(dag_id, run["dag_run_id"]).get("drain") == "success":
                summaries.append(api.xcom(dag_id, run["dag_run_id"], "drain"))
        assert summaries and {s["outcome"] for s in summaries} <= {"committed", "empty"}
        assert sum(s["written"] for s in summaries) == len(result.valid_ids)
        assert_exactly_once(spark, c, p, client, result.valid_ids, bad)

        # Replay the poison dead letters through the REST API with conf.
        conf = {"pipeline": p.name, "mode": "dlq", "error_contains": "poison message", "dry_run": False}
        replay_run = api.trigger(REPLAY_DAG, conf)
        assert api.wait_for_run(REPLAY_DAG, replay_run) == "success", api.task_states(REPLAY_DAG, replay_run)
        replayed = [r for r in dlq_rows(spark, c, p) if r.state == "REPLAYED"]
        assert {r.message_id for r in replayed} == set(result.poison_ids)
        assert len({r.replay_run_id for r in replayed}) == 1

        # Bad params are refused by the trigger itself (JSON schema of the Params) with a message.
        for wrong, word in (({"pipeline": "nope"}, "nope"), ({"pipeline": p.name, "limit": -1}, "limit")):
            status, body = api._request("POST", f"/api/v2/dags/{REPLAY_DAG}/dagRuns",
                                        {"logical_date": None, "conf": wrong})
            assert status == 400 and word in str(body), (status, body)
        inverted = api.trigger(REPLAY_DAG, {"pipeline": p.name, "since": "2026-05-02T00:00:00Z",
                                            "until": "2026-05-01T00:00:00Z"})
        assert api.wait_for_run(REPLAY_DAG, inverted) == "failed"
        assert api.task_states(REPLAY_DAG, inverted)["validate"] == "failed"

        # Backfill two one-minute intervals around the production time: a deleted row is healed once,
        # and the live checkpoint does not move.
        from delta.tables import DeltaTable
        from pyspark.sql import functions as F

        target, dlq = str(c.target_path(p)), str(c.dlq_path(p))
        # The replayed poison messages went back to the stream; the schedule drains them (dead again:
        # the transform still refuses them). Wait for that, so the checkpoint below is the settled one.
        deadline = time.monotonic() + 600
        while pending(client, p) or lag(client, p) or any(
                r["state"] in ("queued", "running") for r in api.runs(dag_id)):
            assert time.monotonic() < deadline, "the replayed messages were not drained"
            time.sleep(5)
        assert sum(r.state == "DEAD" for r in dlq_rows(spark, c, p)) == len(bad)
        lost = sorted(result.valid_ids)[:3]
        DeltaTable.forPath(spark, target).delete(F.col("event_id").isin(lost))
        before = read_checkpoint(spark, target, p.name, dlq)
        first = minute_floor(produced_at) - timedelta(minutes=1)
        last = minute_floor(produced_at)
        while datetime.now(UTC) < last + timedelta(minutes=1, seconds=5):
            time.sleep(2)  # the second interval must be over before it can be backfilled
        env = {**os.environ, **airflow_env(c)}
        airflow = str(Path(sys.executable).parent / "airflow")
        done = subprocess.run([airflow, "backfill", "create", "--dag-id", dag_id, "--from-date", first.isoformat(),
                               "--to-date", last.isoformat(), "--reprocess-behavior", "completed"],
                              env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        deadline = time.monotonic() + 900
        while True:
            runs = api.runs(dag_id, run_type="backfill")
            if len(runs) == 2 and all(r["state"] in ("success", "failed") for r in runs):
                break
            assert time.monotonic() < deadline, runs
            time.sleep(5)
        assert [r["state"] for r in runs] == ["success", "success"], runs
        sums = [api.xcom(dag_id, r["dag_run_id"], "drain") for r in runs]
        assert all(s["mode"] == "backfill" and s["acked"] == 0 for s in sums), sums
        assert sum(s["written"] for s in sums) == len(lost)
        ids = target_ids(spark, c, p)
        assert sorted(ids) == sorted(result.valid_ids)  # healed, and nothing else lost or doubled
        after = read_checkpoint(spark, target, p.name, dlq)
        assert (after.batch, after.positions) == (before.batch, before.positions)

        # The continuous pipeline drained its messages once without a trigger, and its quality DAG checked
        # every batch that committed them, outside the ingest runs (which have no quality task).
        flowing_dag = ingest_dag_id(q.name)
        deadline = time.monotonic() + 300
        while len(target_ids(spark, c, q)) < len(flow.valid_ids):
            assert time.monotonic() < deadline, api.runs(flowing_dag)[:5]
            time.sleep(5)
        assert sorted(target_ids(spark, c, q)) == sorted(flow.valid_ids)
        drains = [(r["dag_run_id"], api.xcom(flowing_dag, r["dag_run_id"], "drain")) for r in api.runs(flowing_dag)
                  if api.task_states(flowing_dag, r["dag_run_id"]).get("drain") == "success"]
        committed = {s["batch"]: run for run, s in drains if s["outcome"] == "committed"}
        assert committed and all("quality" not in api.task_states(flowing_dag, run) for run in committed.values())
        while not set(committed) <= {r["batch"] for r in last_results(spark, c, q, 50) if r["scope"] == "batch"}:
            assert time.monotonic() < deadline, (committed, last_results(spark, c, q, 50))
            time.sleep(5)
        checks = api.runs(batch_quality_dag_id(q.name))
        assert checks and all(r["state"] in ("success", "running", "queued") for r in checks), checks
        api.call("PATCH", f"/api/v2/dags/{flowing_dag}", {"is_paused": True})

        # on_data: runs from the source Assets' events only, in the asset views; messages that come during
        # a run make at most one more (the Valkey one); the asset graph, in a browser.
        began = time.monotonic()
        for r, first, bursts in zip(on_data, firsts, (True, False), strict=True):
            print("on_data:", check_on_data(api, spark, c, r, first, release if bursts else None))
        print("on_data: asset graph in", screenshot_asset_graph(tmp_path, api, c, on_data[0]),
              f"({time.monotonic() - began:.0f}s in all)")

        # The embedded services' secrets (Airflow hands the tasks the Valkey, Kafka and S3 ones as
        # connections) are in no task log, no component's log and no XCom of these runs.
        from deltadrain.config.embedded import airflow_home

        secrets = services_secrets()
        assert {"valkey password", "kafka password", "s3 secret_access_key"} <= set(secrets), sorted(secrets)
        logs = [f for f in (airflow_home() / "logs").rglob("*") if f.is_file()]
        assert any("task_id=drain" in str(f) for f in logs), "no task log of the drain"
        logs.append(services.FACTORIES["airflow"](c).log_file)
        texts = {str(f): f.read_text(errors="replace") for f in logs}
        texts["xcoms"] = json.dumps(xcom_values(api), default=str)
        assert "'written'" in texts["xcoms"]  # the drains' summaries (stringified) are among them
        leaks = [(name, where) for name, secret in secrets.items() for where, text in texts.items() if secret in text]
        assert not leaks, f"secrets found: {leaks}"
    finally:
        services.down(c, ["airflow"])
