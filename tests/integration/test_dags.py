"""The Airflow DAGs: they parse cleanly without touching anything, and dag.test() runs of ingest,
reaper and replay against the real embedded Valkey and Kafka, the embedded Spark Connect server (the
default executor; one ingest test through spark-submit) and Delta do what they say, judged by reading
the tables back."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
import warnings

import pytest
import yaml

from deltadrain.dev.produce import MALFORMED_KINDS, produce
from deltadrain.lake.checkpoint import read_checkpoint
from deltadrain.names import (
    ALERTS_TASK,
    MAINTENANCE_DAG,
    QUALITY_DAG,
    REAPER_DAG,
    REPLAY_DAG,
    ingest_dag_id,
    pool_name,
    replay_quality_task_id,
    replay_task_id,
)
from deltadrain.sources.valkey.client import valkey_client
from tests.support.lake import dlq_rows, target_ids
from tests.support.pipelines import ROOT
from tests.support.processes import run_dag
from tests.support.valkey import assert_exactly_once, make_pipeline, pending, valkey_admin

DAGS = ROOT / "dags"


def dagbag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(DAGS))


def test_dags_parse_without_errors_warnings_or_io(monkeypatch, airflow_db):
    def no_network(*args, **kwargs):
        raise AssertionError(f"a DAG file opened a connection at parse time: {args}")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket.socket, "connect_ex", no_network)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bag = dagbag()
    assert bag.import_errors == {}
    ours = [w for w in caught if "deltadrain" in str(w.filename) or "dags" in str(w.filename)]
    assert ours == [], [str(w.message) for w in ours]
    assert not getattr(bag, "captured_warnings", {}), bag.captured_warnings

    from deltadrain.config import load_config

    cfg = load_config()
    expected = {ingest_dag_id(p.name) for p in cfg.pipelines} | {REAPER_DAG, REPLAY_DAG, QUALITY_DAG, MAINTENANCE_DAG}
    assert set(bag.dag_ids) == expected
    for p in cfg.pipelines:
        dag = bag.get_dag(ingest_dag_id(p.name))
        assert dag.max_active_runs == 1 and not dag.catchup
        assert type(dag.timetable).__name__ == "CronDataIntervalTimetable"  # backfills get real intervals
        drain = dag.get_task("drain")
        assert drain.pool == pool_name(p.name) and drain.retries == p.airflow.retries
        assert drain.retry_exponential_backoff and drain.execution_timeout == p.airflow.execution_timeout
        assert [o.name for o in drain.outlets] == [f"deltadrain.{p.name}", f"deltadrain.{p.name}.dlq"]
        sensor = dag.get_task("wait_for_work")
        assert sensor.deferrable and sensor.soft_fail
        assert dag.get_task("quality").upstream_task_ids == {"drain"}
    # Daily: a pipeline's owed batches, then its whole table, in its pool; both leaves, so that
    # either failing fails the run.
    daily = bag.get_dag(QUALITY_DAG)
    assert {t.task_id for t in daily.tasks} == {f"{k}_{p.name}" for p in cfg.pipelines for k in ("owed", "check")}
    assert {t.task_id for t in daily.leaves} == {t.task_id for t in daily.tasks}
    for p in cfg.pipelines:
        owed, whole = daily.get_task(f"owed_{p.name}"), daily.get_task(f"check_{p.name}")
        assert (owed.owed, owed.settle_s, whole.whole_table) == (True, 3600, True)
        assert owed.pool == whole.pool == pool_name(p.name) and owed.priority_weight > whole.priority_weight
    # A pipeline's maintenance runs in its pool, between its drains; the shared tables' task does not.
    maintenance = {t.task_id: t.pool for t in bag.get_dag(MAINTENANCE_DAG).tasks}
    assert maintenance == {**{f"maintain_{p.name}": pool_name(p.name) for p in cfg.pipelines},
                           "maintain_shared_tables": "default_pool"}
    replay = bag.get_dag(REPLAY_DAG)
    assert type(replay.timetable).__name__ == "NullTimetable"  # manual only
    # Pipelines' replays run side by side; one pipeline's go one at a time (two runs over the same
    # DEAD entries would both send them), whatever its pool's slots.
    assert replay.max_active_runs > 1
    assert {replay.get_task(replay_task_id(p.name)).max_active_tis_per_dag for p in cfg.pipelines} == {1}
    assert replay.params.get_param("pipeline").schema["enum"] == [p.name for p in cfg.pipelines]
    assert replay.params.get_param("limit").schema["minimum"] == 1
    # Each pipeline's replay runs in its pool, between its drains, quality checks and maintenance,
    # and so does the check of the batches a reprocess rewrote, right after it.
    assert {t.task_id: t.pool for t in replay.tasks} == {
        "validate": "default_pool", "route": "default_pool",
        **{replay_task_id(p.name): pool_name(p.name) for p in cfg.pipelines},
        **{replay_quality_task_id(p.name): pool_name(p.name) for p in cfg.pipelines}}
    assert replay.get_task("route").downstream_task_ids == {replay_task_id(p.name) for p in cfg.pipelines}
    for p in cfg.pipelines:
        check = replay.get_task(replay_quality_task_id(p.name))
        assert check.upstream_task_ids == {replay_task_id(p.name)} and check.drain_task == replay_task_id(p.name)
        assert (check.catch_up, check.retries) == (False, 1)
        assert replay.get_task(replay_task_id(p.name)).priority_weight == check.priority_weight == 10


@pytest.fixture
def pipeline_dags(tmp_path, monkeypatch, airflow_db, valkey_server, spark_connect_server):
    """A pipeline of its own, with the DAG files parsed against its config; its jobs run on the session's
    Connect server unless `executor="submit"`."""
    def make(**overrides):
        path, c, p = make_pipeline(tmp_path, **overrides)
        monkeypatch.setenv("DELTADRAIN_CONFIG", str(path))
        return path, c, p

    return make


@pytest.mark.slow
def test_ingest_dag_drains_through_spark_submit(pipeline_dags, spark):
    # 40 messages, batches of 15: one drain task catches up in three batches (two full ones).
    path, c, p = pipeline_dags(batch_cap=15, executor="submit")
    client = valkey_client(c, p)
    result = produce(c, p, 40, seed=91, malformed_ratio=0.1)
    run = run_dag(ingest_dag_id(p.name))
    assert run["states"] == {"wait_for_work": "success", "drain": "success", "quality": "success"}, \
        run["log"][-3000:]
    summary = run["xcoms"]["drain"]
    assert summary["batches"] == [1, 2, 3] and [r["claimed"] for r in summary["runs"]] == [15, 15, 10]
    assert summary["claimed"] == 40 and "not full" in summary["stopped"]
    report = run["xcoms"]["quality"]  # the default suite on every batch the drain committed
    assert report["batches"] == [1, 2, 3] and [r["batch"] for r in report["reports"]] == [1, 2, 3]
    assert report["success"] and report["rows_checked"] == summary["written"]
    assert (report["caught_up"], report["still_owed"]) == ([], 0)  # submitted with --owed: none owed
    assert "Data Docs: file://" in run["log"]
    assert summary["outcome"] == "committed" and summary["written"] == len(result.valid_ids)
    assert "deltadrain drain summary:" in run["log"]  # the summary is shown in the task log too
    assert_exactly_once(spark, c, p, client, result.valid_ids, result.bad_places(MALFORMED_KINDS))
    # (A run that finds nothing new is skipped, not failed: the gap test's last run, on the Connect server.)


@pytest.mark.slow
def test_ingest_dag_reads_a_connection_kept_only_in_airflows_metadata_db(pipeline_dags, spark, monkeypatch):
    # A connection made in the Airflow UI lives in the metadata DB, which the Spark driver (a child of
    # the task, with no way to ask Airflow) cannot read: the task hands it over. Valkey user `ui_<name>`
    # exists only with this password, so a run that did not get it could not drain.
    conn_id = f"valkey_{uuid.uuid4().hex[:8]}"
    monkeypatch.delenv(f"AIRFLOW_CONN_{conn_id.upper()}", raising=False)
    path, c, p = pipeline_dags(partitions=1, source={"connection_id": conn_id})
    from airflow.models.connection import Connection
    from airflow.utils.session import create_session

    admin = valkey_admin()
    user, secret = f"ui_{p.name}", uuid.uuid4().hex
    admin.execute_command("ACL", "SETUSER", user, "on", f">{secret}", "~*", "&*", "+@all")
    with create_session() as session:
        session.add(Connection(conn_id=conn_id, conn_type="generic", login=user, password=secret))
    try:
        with monkeypatch.context() as env:  # the test's own client and producer; gone before the DAG runs
            env.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", f"redis://{user}:{secret}@127.0.0.1")
            client = valkey_client(c, p)
            result = produce(c, p, 60, seed=17)
        run = run_dag(ingest_dag_id(p.name))
        assert run["states"] == {"wait_for_work": "success", "drain": "success", "quality": "success"}, \
            run["log"][-3000:]
        assert secret not in run["log"]  # handed over in the environment, never printed
        assert secret not in json.dumps(run["xcoms"], default=str)  # nor in what the tasks returned
        assert_exactly_once(spark, c, p, client, result.valid_ids, 0)
    finally:
        admin.execute_command("ACL", "DELUSER", user)


@pytest.mark.slow
def test_ingest_dag_failure_carries_the_drains_own_error(pipeline_dags, spark):
    path, c, p = pipeline_dags(transform="deltadrain.transforms.no_such_transform")
    data = yaml.safe_load(path.read_text())
    data["pipelines"][0]["airflow"] = {"retries": 0}
    path.write_text(yaml.safe_dump(data))
    produce(c, p, 10, seed=92)
    run = run_dag(ingest_dag_id(p.name))
    assert run["states"]["drain"] == "failed"
    assert "DeltadrainJobFailed" in run["log"]
    assert (f"{path.resolve()}: pipeline '{p.name}', field 'transform': transform "
            "'deltadrain.transforms.no_such_transform' cannot be imported") in run["log"]
    assert "drain" not in run["xcoms"]


@pytest.mark.slow
def test_an_ingest_run_stops_on_a_gap_with_nothing_after_it_and_says_how_to_go_on(pipeline_dags, spark):
    # Entries trimmed before any run read them, and nothing new: the sensor still wakes the drain, whose
    # failure under on_gap: fail (the default) names the gap in the task log. Before, the run was skipped.
    path, c, p = pipeline_dags(partitions=1, airflow={"retries": 0, "wait_timeout": "PT3S", "poll_interval": "PT1S"})
    produce(c, p, 20, seed=190)
    assert valkey_admin().xtrim(p.source.streams[0], maxlen=0, approximate=False) == 20
    run = run_dag(ingest_dag_id(p.name))
    assert run["states"] == {"wait_for_work": "success", "drain": "failed", "quality": "upstream_failed"}, \
        run["log"][-3000:]
    assert "(20 entries, removed before the group read them). Nothing was committed. To go on past them" \
        in run["log"] and "trigger one run with Accept gaps" in run["log"]
    # The operator triggers a run with Accept gaps: it goes on past the gap, and its commit records it.
    run = run_dag(ingest_dag_id(p.name), {"accept_gaps": True})
    assert run["states"] == {"wait_for_work": "success", "drain": "success", "quality": "success"}, \
        run["log"][-3000:]
    summary = run["xcoms"]["drain"]
    assert (summary["outcome"], summary["written"], summary["gaps"]) == ("committed", 0, 20), summary
    assert read_checkpoint(spark, str(c.target_path(p)), p.name).meta["gaps"] == summary["gap_ranges"]
    # The scheduled runs, under on_gap: fail still, find no work: the sensor waits (deferred) and the run
    # is skipped, not failed.
    run = run_dag(ingest_dag_id(p.name))
    assert run["states"] == {"wait_for_work": "skipped", "drain": "skipped", "quality": "skipped"}, \
        run["log"][-3000:]


@pytest.mark.slow
def test_reaper_dag_takes_over_stuck_claims_and_removes_dead_consumers(pipeline_dags, spark):
    from deltadrain.sources.valkey.drain import ensure_groups

    path, c, p = pipeline_dags(min_idle_ms=0)
    client = valkey_client(c, p)
    produce(c, p, 40, seed=93)
    ensure_groups(client, p.source)
    stream = p.source.streams[0]
    client.xreadgroup(p.source.group, "drain-gone", {stream: ">"}, count=5)
    assert pending(client, p) == 5
    run = run_dag(REAPER_DAG)
    assert run["states"] == {"find_stuck_claims": "success", "reap": "success"}, run["log"][-3000:]
    assert run["xcoms"]["find_stuck_claims"] == [p.name]
    assert run["xcoms"]["reap"]["taken_over"] == 5
    consumers = {(x["name"].decode() if isinstance(x["name"], bytes) else x["name"]): int(x["pending"])
                 for x in client.xinfo_consumers(stream, p.source.group)}
    assert "drain-gone" not in consumers and consumers.get("deltadrain-reaper") == 5
    assert pending(client, p) == 5  # moved, not acknowledged: the next drain takes them


@pytest.mark.slow
def test_maintenance_dag_compacts_and_vacuums_through_spark_connect(pipeline_dags, spark):
    from deltadrain.catchup import drain
    from deltadrain.lake.maintain import files_on_disk, snapshot_files

    path, c, p = pipeline_dags(batch_cap=40)
    data = yaml.safe_load(path.read_text())
    data["maintenance"] = {"retain": "PT0S"}  # VACUUM deletes what OPTIMIZE replaced at once
    path.write_text(yaml.safe_dump(data))
    client = valkey_client(c, p)
    result = produce(c, p, 120, seed=95, malformed_ratio=0.1)
    for _ in range(3):
        assert drain(c, p, spark=spark).outcome == "committed"
    target = str(c.target_path(p))
    files = snapshot_files(spark, target)
    assert files >= 3
    run = run_dag(MAINTENANCE_DAG)
    assert run["states"] == {f"maintain_{p.name}": "success", "maintain_shared_tables": "success"}, \
        run["log"][-3000:]
    mine = run["xcoms"][f"maintain_{p.name}"]
    tables = {t["table"]: t for t in mine["tables"]}
    assert (tables["target"]["files_before"], tables["target"]["files_after"]) == (files, 1)
    assert tables["target"]["vacuumed"] >= files and files_on_disk(target) == 1
    shared = {t["table"]: t for t in run["xcoms"]["maintain_shared_tables"]["tables"]}
    assert shared["metrics"]["files_before"] == 3 and shared["metrics"]["files_after"] == 1
    assert f"maintained {p.name}: " in run["log"]  # what it did, in the task log
    assert_exactly_once(spark, c, p, client, result.valid_ids, result.bad_places(MALFORMED_KINDS))


@pytest.mark.slow
def test_replay_dag_sends_dead_letters_back_once(pipeline_dags, spark):
    # max_retries 0: the poison message is dead at its first failure. Any new dead letter is an alert.
    # Two poison messages among 40: the drain bisects its batch for each culprit, a few Spark jobs per
    # halving, so a longer batch would only cost more of them.
    path, c, p = pipeline_dags(max_retries=0, alerts={"max_dead_rise": 0, "max_lag": 0})
    result = produce(c, p, 40, seed=98, poison_ratio=0.05)
    poison = result.poison_ids
    assert len(poison) == 2 and len(result.valid_ids) == 38
    run = run_dag(ingest_dag_id(p.name))
    assert run["states"]["drain"] == "success", run["log"][-3000:]
    dead = [r for r in dlq_rows(spark, c, p) if r.state == "DEAD"]
    assert {r.message_id for r in dead} == set(poison)
    # The alerts task after the drain fails the run with the figure and the threshold; the lag is in.
    assert (run["states"][ALERTS_TASK], run["state"]) == ("failed", "failed"), run["log"][-3000:]
    assert (f"pipeline '{p.name}': 1 alert(s): DEAD dead letters rose by +{len(poison)} since the previous "
            f"check (0 -> {len(poison)}), above the threshold 0 (alerts.max_dead_rise)") in run["log"]
    assert "deltadrain alert: lag 0 messages within the threshold 0 (alerts.max_lag)" in run["log"]
    from deltadrain.orchestration.view.runs import last_alert_check

    shown = last_alert_check(p)  # what the pipeline's page shows, from the metadata DB
    assert (shown["state"], shown["run_id"], shown["task_id"]) == ("failed", run["run_id"], ALERTS_TASK), shown

    # (A dry run, the form's default, is tested in-process: test_backfill_replay.py; a DAG run here
    # costs the suite most of a minute.)
    conf = {"pipeline": p.name, "mode": "dlq", "error_contains": "poison message", "dry_run": False}
    replay = replay_task_id(p.name)

    # The handler is fixed (here: the identity transform), then the dead letters are replayed.
    data = yaml.safe_load(path.read_text())
    data["pipelines"][0]["transform"] = "deltadrain.transforms.identity"
    path.write_text(yaml.safe_dump(data))
    run = run_dag(REPLAY_DAG, conf)
    # Sent back, the dead letters are checked with the batch that drains them: no check here.
    assert run["states"] == {"validate": "success", "route": "success", replay: "success",
                             replay_quality_task_id(p.name): "skipped"}, run["log"][-3000:]
    shown = run["xcoms"][replay]
    assert (shown["selected"], shown["replayed"], shown["dry_run"]) == (len(poison), len(poison), False)
    rows = dlq_rows(spark, c, p)
    assert {r.state for r in rows} == {"REPLAYED"} and {r.replay_run_id for r in rows} == {
        run["xcoms"][replay]["run_id"]}
    # (That replaying them again selects nothing, as they are REPLAYED, is tested in-process:
    # test_backfill_replay.py; a DAG run here costs the suite most of a minute.)
    run = run_dag(ingest_dag_id(p.name))
    assert run["states"]["drain"] == "success"
    # Replayed before this run started, drained in it: no new dead letter, nothing left, the check passes.
    assert run["states"][ALERTS_TASK] == "success", run["log"][-3000:]
    assert [(f["check"], f["figure"], f["breached"]) for f in run["xcoms"][ALERTS_TASK]["findings"]] == [
        ("max_lag", 0, False), ("max_dead_rise", 0, False)]
    ids = target_ids(spark, c, p)
    assert len(ids) == len(set(ids)) and set(ids) == set(result.valid_ids) | set(poison)

    # A reprocess rewrites rows of drained batch 1: the batch is checked again right after it.
    again = sorted(result.valid_ids)[:2]
    run = run_dag(REPLAY_DAG, {"pipeline": p.name, "mode": "reprocess", "message_ids": again, "dry_run": False})
    check = replay_quality_task_id(p.name)
    assert run["states"] == {"validate": "success", "route": "success", replay: "success", check: "success"}, \
        run["log"][-3000:]
    assert (run["xcoms"][replay]["written"], run["xcoms"][replay]["batches"]) == (2, [1])
    report = run["xcoms"][check]
    assert (report["scope"], report["batch"], report["success"]) == ("batch", 1, True) and "caught_up" not in report
    assert sorted(target_ids(spark, c, p)) == sorted(ids)


@pytest.mark.slow
def test_replay_dag_refuses_bad_params_with_a_clear_message(pipeline_dags):
    path, c, p = pipeline_dags()
    bad = {"pipeline": p.name, "since": "2026-05-02T00:00:00Z", "until": "2026-05-01T00:00:00Z"}
    run = run_dag(REPLAY_DAG, bad)
    assert run["states"] == {"validate": "failed", "route": "upstream_failed", replay_task_id(p.name): "upstream_failed",
                             replay_quality_task_id(p.name): "upstream_failed"}, run["log"][-3000:]
    assert "time range is inverted" in run["log"]


def test_an_airflow_cli_call_waits_for_a_busy_metadata_db_instead_of_failing(airflow_db):
    """The scheduler and a CLI call (`airflow backfill create` in the end-to-end test) share one SQLite
    file; a writer holding it longer than SQLite's default 5 s must not fail the other one."""
    import sqlite3
    import time
    from pathlib import Path

    airflow = str(Path(sys.executable).parent / "airflow")
    holder = sqlite3.connect(Path(airflow_db) / "airflow.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # the write lock, as a scheduler loop holds it
    try:
        call = subprocess.Popen([airflow, "pools", "set", "deltadrain_lock_probe", "1", "waits for the lock"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(15)  # CLI start-up (a few seconds) plus well over the 5 s it used to wait
        assert call.poll() is None, call.communicate()  # still waiting, not failed
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    out, err = call.communicate(timeout=120)
    assert call.returncode == 0, err[-2000:]
    with sqlite3.connect(Path(airflow_db) / "airflow.db") as db:
        assert db.execute("SELECT slots FROM slot_pool WHERE pool = 'deltadrain_lock_probe'").fetchall() == [(1,)]


# A savepoint that reads and then writes, as `airflow backfill create` clears a finished run, while
# another process commits a write in between (the scheduler, in the end-to-end test's CI failure).
READ_THEN_WRITE_IN_A_SAVEPOINT = """
import sqlite3, sys, threading
from sqlalchemy import select, update
from airflow.models.pool import Pool
from airflow.utils.session import create_session

def other_process_writes():
    with sqlite3.connect(sys.argv[1], timeout=60) as other:
        # A write that changes the file (SQLite skips an UPDATE that changes nothing).
        other.execute("UPDATE slot_pool SET description = 'probe ' || random() WHERE pool = 'default_pool'")

with create_session() as session:
    with session.begin_nested():
        session.scalars(select(Pool)).all()
        other = threading.Thread(target=other_process_writes)
        other.start()
        other.join(3)
        session.execute(update(Pool).where(Pool.pool == "default_pool").values(slots=Pool.slots))
other.join()
print("written")
"""


def test_a_savepoint_that_writes_holds_the_metadata_dbs_write_lock_from_its_start(airflow_db):
    from pathlib import Path

    db = str(Path(airflow_db) / "airflow.db")
    assert os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_SESSION_MAKER"] == "deltadrain.orchestration.airflow_db.session_maker"
    run = [sys.executable, "-c", READ_THEN_WRITE_IN_A_SAVEPOINT, db]
    done = subprocess.run(run, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "written" in done.stdout, done.stderr[-3000:]
    # Airflow's own session factory: the write fails at once, although the lock timeout is 60 s.
    plain = {k: v for k, v in os.environ.items() if k != "AIRFLOW__DATABASE__SQL_ALCHEMY_SESSION_MAKER"}
    done = subprocess.run(run, capture_output=True, text=True, timeout=300, env=plain)
    assert done.returncode != 0 and "database is locked" in done.stderr, (done.stdout, done.stderr[-3000:])


def test_deltadrain_pools_creates_the_pool_of_every_pipeline_and_of_one_added_later(tmp_path, airflow_db):
    """The drain and quality tasks sit in `deltadrain_<pipeline>`; Airflow never schedules a task whose
    pool does not exist, so `deltadrain pools` (run by `services up` and Compose's start, and by hand
    after adding a pipeline) must create them in the metadata DB, with one slot, idempotently."""
    import sqlite3
    from pathlib import Path

    path, c, p = make_pipeline(tmp_path)
    db = Path(airflow_db) / "airflow.db"

    def pools() -> dict[str, int]:
        with sqlite3.connect(db) as conn:
            return dict(conn.execute("SELECT pool, slots FROM slot_pool WHERE pool LIKE 'deltadrain_t%'"))

    def run_pools(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "deltadrain.cli", "--config", str(path), "pools", "--json",
                               *args], capture_output=True, text=True, timeout=300, env={**os.environ})

    # Each call starts `airflow pools` (a few seconds each): every step below also sets up the next one.
    data = yaml.safe_load(path.read_text())
    other = {**data["pipelines"][0], "name": f"{p.name}_x", "target": {"path": f"{p.name}_x"}}
    data["pipelines"].append(other)
    path.write_text(yaml.safe_dump(data))
    assert pool_name(p.name) not in pools() and pool_name(other["name"]) not in pools()
    done = run_pools()
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout) == [{"pool": pool_name(p.name), "slots": 1},
                                       {"pool": pool_name(other["name"]), "slots": 1}]
    assert pools()[pool_name(p.name)] == pools()[pool_name(other["name"])] == 1

    # A pipeline added to the config gets its pool; a pool widened by hand is set back to one slot; the
    # pool of a pipeline removed from the config stays without --prune.
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE slot_pool SET slots = 4 WHERE pool = ?", (pool_name(p.name),))
    added = {**data["pipelines"][0], "name": f"{p.name}_b", "target": {"path": f"{p.name}_b"}}
    data["pipelines"] = [data["pipelines"][0], added]
    path.write_text(yaml.safe_dump(data))
    assert pool_name(added["name"]) not in pools()
    done = run_pools()
    assert done.returncode == 0, done.stderr[-3000:]
    assert {k: v for k, v in pools().items() if k in (pool_name(p.name), pool_name(added["name"]))} == {
        pool_name(p.name): 1, pool_name(added["name"]): 1}
    assert pools()[pool_name(other["name"])] == 1

    # --prune deletes the pools of the pipelines removed from the config, and leaves a pool of the same
    # prefix that deltadrain did not make.
    foreign = f"deltadrain_t{p.name}_mine"
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO slot_pool (pool, slots, description, include_deferred) VALUES (?, 2, ?, 0)",
                     (foreign, "an operator's own pool"))
    data["pipelines"] = [q for q in data["pipelines"] if q["name"] != p.name]
    path.write_text(yaml.safe_dump(data))
    done = run_pools("--prune")
    assert done.returncode == 0, done.stderr[-3000:]
    # The worker's metadata DB also holds other tests' pipelines' pools, which this config does not name either.
    deleted = [r["pool"] for r in json.loads(done.stdout) if r.get("deleted") and r["pool"].startswith(pool_name(p.name))]
    assert sorted(deleted) == sorted([pool_name(p.name), pool_name(other["name"])])
    assert pool_name(p.name) not in pools() and pool_name(other["name"]) not in pools()
    assert pools()[pool_name(added["name"])] == 1 and pools()[foreign] == 2


def test_deltadrain_pools_on_an_unmigrated_metadata_db_names_the_fix(tmp_path):
    home = tmp_path / "airflow-home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"}
    done = subprocess.run([sys.executable, "-m", "deltadrain.cli", "pools"], capture_output=True, text=True,
                          timeout=300, env={**env, "AIRFLOW_HOME": str(home)})
    assert done.returncode == 1, (done.stdout, done.stderr[-3000:])
    err = done.stderr
    assert "creating the Airflow pools" in err and "airflow db migrate" in err and "Traceback" not in err, err[-3000:]


def test_a_replay_trigger_without_a_pipeline_is_refused_by_airflows_param_validation(airflow_db):
    """The REST API and the trigger form validate a run's conf with the serialized DAG's Params
    (`params.deep_merge(conf).validate()` in create_dagrun): a conf that names no pipeline must be
    refused there, not replayed on whichever pipeline comes first in the YAML."""
    from airflow.exceptions import ParamValidationError
    from airflow.serialization.serialized_objects import DagSerialization

    from deltadrain.config import load_config

    names = [p.name for p in load_config().pipelines]
    assert len(names) > 1  # with one pipeline a default could not be told from the choice
    dag = DagSerialization.from_dict(DagSerialization.to_dict(dagbag().get_dag(REPLAY_DAG)))
    for conf in ({}, {"mode": "dlq", "dry_run": False}):
        with pytest.raises(ParamValidationError, match="pipeline"):
            dag.params.deep_merge(conf).validate()
    with pytest.raises(ParamValidationError, match="pipeline"):
        dag.params.deep_merge({"pipeline": "nope"}).validate()
    for name in names:
        assert dag.params.deep_merge({"pipeline": name}).validate()["pipeline"] == name
    # The form starts as a dry run (what it would replay; a dry run's replay is tested in-process).
    assert dag.params.deep_merge({"pipeline": names[0]}).validate()["dry_run"] is True
    # The partition field proposes the YAML's stream keys, kept through serialization; a Kafka
    # partition number (not among them) is taken as well.
    keys = [k for p in load_config().pipelines if p.source.kind == "valkey" for k in p.source.streams]
    assert dag.params.get_param("partition").schema["examples"] == keys
    for partition in (keys[0], "3"):
        assert dag.params.deep_merge({"pipeline": names[0], "partition": partition}).validate()["partition"] == partition


# The drain task's execution_timeout in the hanging runs. The first run only has to put its claim notice
# out (as its read starts): its drain task is in the hang ~5 s after it starts, with the other test
# workers busy. The second commits a batch of one message first (~15 s, the target table's first MERGE),
# starts its next batch before max_drain_time, and puts that batch's notice out within a second or two.
FIRST_TIMEOUT_S, SECOND_TIMEOUT_S, SECOND_DRAIN_S = 20, 40, 34


@pytest.mark.slow
def test_kafka_drains_airflow_times_out_in_a_hanging_transform_are_counted_and_the_message_ends_dead(
        tmp_path, monkeypatch, airflow_db, kafka_broker, spark_connect_server, spark):
    """The whole path through Airflow and Spark Connect: a message hangs the transform (in the server's
    Python worker), the drain task hits its execution_timeout, the run ends as a killed one and the
    operator interrupts its query on the server. The next DAG run counts that run as dead and reads half
    of what it read; once runs that read the message alone died max_retries times it is a dead letter,
    alone, and the pipeline goes on. (spark-submit's kill: tests/integration/test_kafka_drain.py.)"""

    from deltadrain.dev.produce import generate
    from deltadrain.sources.kafka.client import kafka_client_conf
    from deltadrain.sources.kafka.offsets import committed, read_notice
    from tests.integration.hang_transform import HANG_MARKER
    from tests.support.kafka import lake_checkpoint, make_kafka_pipeline, send_marked

    # Batches of 2 with the second message hanging: each timed-out run costs its whole execution_timeout,
    # so the test lets as few die as show the protocol (the first run, then the half's other message),
    # and gives each no more time than it needs to get past its claim notice while the other test
    # workers are busy: the hang holds the run from there until Airflow's timeout, however late that is.
    path, c, p = make_kafka_pipeline(tmp_path, partitions=1, batch_cap=2, max_retries=1, min_idle_ms=0,
                                     transform="tests.integration.hang_transform.hang_on_marker",
                                     airflow={"retries": 0, "execution_timeout": FIRST_TIMEOUT_S,
                                              "max_drain_time": FIRST_TIMEOUT_S - 1})
    monkeypatch.setenv("DELTADRAIN_CONFIG", str(path))
    messages = [m for m in generate(p, 30, seed=95) if m.kind == "valid"][:4]
    hangs = 1
    payloads = send_marked(c, p, messages, hangs, HANG_MARKER)
    conf, group, topic = kafka_client_conf(c, p), p.source.group, p.source.topic

    def timed_out() -> list[int]:
        """One DAG run whose drain Airflow times out: the range of the claim notice it left."""
        run = run_dag(ingest_dag_id(p.name))
        assert run["states"]["drain"] == "failed", run["log"][-3000:]
        assert "AirflowTaskTimeout" in run["log"], run["log"][-3000:]  # the timeout, not another failure
        notice = read_notice(committed(conf, group, topic, [0])[0][1])
        assert notice is not None, "the timed-out run's claim notice was taken off"
        return notice["range"]

    ranges = [timed_out()]
    # The next run must finish a whole batch before it hangs: it counts the first run dead and reads
    # half of its range, [0, 1), which does not hang and commits; the rest of [0, 2) is the hanging
    # message alone, which stops the run once more. (Without the halving it would read [0, 2) again.)
    data = yaml.safe_load(path.read_text())
    data["pipelines"][0]["airflow"].update(execution_timeout=SECOND_TIMEOUT_S, max_drain_time=SECOND_DRAIN_S)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    ranges.append(timed_out())
    assert ranges == [[0, 2], [1, 2]], ranges
    assert lake_checkpoint(spark, c, p).positions == {"0": "1"} and not dlq_rows(spark, c, p)
    # Runs that read it alone died max_retries (1) times: the next run makes it a dead letter and drains on.
    # No hang is left to time out: it gets the default execution_timeout and max_drain_time, so that a
    # batch it starts late on a busy machine still ends in the task.
    data["pipelines"][0]["airflow"] = {"retries": 0}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    states = []
    while lake_checkpoint(spark, c, p).positions != {"0": "4"}:
        assert len(states) < 3, states
        states.append(run_dag(ingest_dag_id(p.name))["states"]["drain"])
    assert states[0] == "success", states
    dead = {int(r.position): r for r in dlq_rows(spark, c, p)}
    assert sorted(dead) == [hangs] and dead[hangs].error_type == "max_retries"
    assert bytes(dead[hangs].original) == payloads[hangs]
    assert sorted(target_ids(spark, c, p)) == sorted(m.key for i, m in enumerate(messages) if i != hangs)
