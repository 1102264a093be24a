"""Pure decisions of the Airflow glue: which runs are backfills, and what the drain job is told."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest

from deltadrain.names import ingest_dag_id, pool_name


def test_backfill_runs_are_told_apart_by_the_run_type_value():
    from airflow.sdk.api.datamodels._generated import DagRunType

    from deltadrain.orchestration.sensors import is_backfill

    assert is_backfill({"dag_run": SimpleNamespace(run_type=DagRunType.BACKFILL)})
    assert is_backfill({"dag_run": SimpleNamespace(run_type="backfill")})
    assert not is_backfill({"dag_run": SimpleNamespace(run_type=DagRunType.MANUAL)})
    assert not is_backfill({"dag_run": SimpleNamespace(run_type=DagRunType.SCHEDULED)})
    assert not is_backfill({})


def context(run_type: str, start=None, end=None) -> dict:
    ti = SimpleNamespace(dag_id="deltadrain__orders__ingest", run_id=f"{run_type}__2026-05-01T00:00:00+00:00",
                         try_number=2)
    return {"ti": ti, "dag_run": SimpleNamespace(run_type=run_type), "data_interval_start": start,
            "data_interval_end": end}


def test_the_drain_job_gets_the_interval_only_in_a_backfill():
    from deltadrain.orchestration.operators import DeltadrainJobFailed, DrainOperator

    op = DrainOperator(task_id="drain", pipeline="orders", config="/etc/dd.yaml")
    start, end = datetime(2026, 5, 1, tzinfo=UTC), datetime(2026, 5, 1, 0, 5, tzinfo=UTC)
    args = op.job_args(context("backfill", start, end))
    assert args[:3] == ["orders", "--config", "/etc/dd.yaml"]
    assert args[-4:] == ["--backfill-start", start.isoformat(), "--backfill-end", end.isoformat()]
    run_id = args[args.index("--run-id") + 1]
    assert run_id.endswith("-try2") and ":" not in run_id and "+" not in run_id
    assert "--backfill-start" not in op.job_args(context("scheduled", start, end))
    assert "--backfill-start" not in op.job_args(context("manual"))
    with pytest.raises(DeltadrainJobFailed, match="data interval"):
        op.job_args(context("backfill"))


def test_run_ids_of_long_dag_ids_stay_apart_and_short_ones_read_as_they_are():
    # Cut to 110 characters, two scheduled runs of a pipeline with a long name shared a run id (and a
    # Valkey consumer): the timestamps that tell them apart were past the cut.
    from deltadrain.names import ingest_dag_id, ingest_run_prefix
    from deltadrain.orchestration.operators import deltadrain_run_id

    def run_id(dag_id, airflow_run_id):
        return deltadrain_run_id({"ti": SimpleNamespace(dag_id=dag_id, run_id=airflow_run_id, try_number=1)})

    long_dag = f"deltadrain__{'p' * 60}__ingest"
    first = run_id(long_dag, "scheduled__2026-05-01T00:00:00+00:00")
    second = run_id(long_dag, "scheduled__2026-05-01T00:05:00+00:00")
    assert first != second and len(first) == len(second) == 110 + len("-try1")
    # The longest pipeline name keeps its ingest DAG's whole prefix (quality.owed.first_scheduled reads it).
    longest = run_id(ingest_dag_id("p" * 63), "scheduled__2026-05-01T00:00:00+00:00")
    assert len(longest) == len(first) and longest.startswith(ingest_run_prefix("p" * 63))
    assert run_id("deltadrain__orders__ingest", "manual__2026-05-01T00:00:00+00:00") == \
        "af-deltadrain__orders__ingest-manual__2026-05-01T00_00_00_00_00-try1"


def test_the_drain_job_accepts_gaps_only_when_a_run_asks():
    from deltadrain.orchestration.operators import DrainOperator

    op = DrainOperator(task_id="drain", pipeline="orders")
    start, end = datetime(2026, 5, 1, tzinfo=UTC), datetime(2026, 5, 1, 0, 5, tzinfo=UTC)
    asked = {**context("manual"), "params": {"accept_gaps": True}}
    assert op.job_args(asked)[-1] == "--accept-gaps"
    assert "--accept-gaps" not in op.job_args({**context("scheduled"), "params": {"accept_gaps": False}})
    assert "--accept-gaps" not in op.job_args(context("manual"))
    # A backfill re-reads history and reports gaps whatever the policy: the flag has nothing to do there.
    assert "--accept-gaps" not in op.job_args({**context("backfill", start, end), "params": {"accept_gaps": True}})


def test_names():
    assert ingest_dag_id("orders") == "deltadrain__orders__ingest" and pool_name("orders") == "deltadrain_orders"


def test_only_pools_deltadrain_made_for_pipelines_gone_from_the_config_are_stale():
    from pathlib import Path

    from deltadrain.config import load_config
    from deltadrain.orchestration.pools import pool_specs, stale_pools

    cfg = load_config(Path(__file__).resolve().parents[2] / "config" / "pipelines.yaml")
    listed = [{"pool": name, "slots": 1, "description": spec["description"]} for name, spec in pool_specs(cfg).items()]
    listed += [{"pool": "deltadrain_gone", "slots": 1, "description": "deltadrain: drains of gone"},
               {"pool": "deltadrain_mine", "slots": 3, "description": "an operator's own"},
               {"pool": "default_pool", "slots": 128, "description": None}]
    assert stale_pools(listed, cfg) == ["deltadrain_gone"]


def test_the_quality_job_gets_every_batch_the_drain_task_committed():
    from airflow.sdk.exceptions import AirflowSkipException

    from deltadrain.orchestration.operators import QualityOperator

    op = QualityOperator(task_id="quality", pipeline="orders", drain_task="drain")

    def ctx(summary):
        c = context("scheduled")
        c["ti"].xcom_pull = lambda task_ids: summary
        return c

    args = op.job_args(ctx({"outcome": "committed", "batch": 6, "batches": [4, 5, 6]}))
    assert args[args.index("--batch"):] == ["--batch", "4", "5", "6", "--owed"]
    args = op.job_args(ctx({"outcome": "committed", "batch": 2}))
    assert args[args.index("--batch"):] == ["--batch", "2", "--owed"]
    with pytest.raises(AirflowSkipException, match="no batch to check"):
        op.job_args(ctx({"outcome": "empty", "batch": 3, "batches": []}))
    # The replay DAG's quality task: the batches a reprocess rewrote; a dlq replay's rows are
    # checked with the batch that drains them again.
    op = QualityOperator(task_id="quality_orders", pipeline="orders", drain_task="replay_orders", catch_up=False)
    args = op.job_args(ctx({"mode": "reprocess", "written": 3, "batches": [2, 7]}))
    assert args[args.index("--batch"):] == ["--batch", "2", "7"]  # not the owed ones: they are the ingest DAG's
    for summary in ({"mode": "dlq", "replayed": 4, "batches": None}, {"mode": "reprocess", "batches": []}):
        with pytest.raises(AirflowSkipException, match="no batch to check"):
            op.job_args(ctx(summary))
    # The daily DAG's tasks: the owed batches alone, then the whole table; one scope per task.
    daily = context("scheduled")
    assert QualityOperator(task_id="o", pipeline="orders", owed=True).job_args(daily)[-1] == "--owed"
    settled = QualityOperator(task_id="o", pipeline="orders", owed=True, settle_s=3600).job_args(daily)
    assert settled[-3:] == ["--owed", "--settle", "3600"]
    assert QualityOperator(task_id="t", pipeline="orders", whole_table=True).job_args(daily)[-1] == "--table"
    for scopes in ({}, {"owed": True, "whole_table": True}, {"drain_task": "drain", "owed": True}):
        with pytest.raises(ValueError, match="checks one of"):
            QualityOperator(task_id="q", pipeline="orders", **scopes)
    for scopes in ({"owed": True, "settle_s": -1}, {"whole_table": True, "settle_s": 60}):
        with pytest.raises(ValueError, match="settle_s"):
            QualityOperator(task_id="q", pipeline="orders", **scopes)


def test_a_failed_replay_names_the_pipeline_it_was_asked_for(monkeypatch):
    """The replay operator takes its pipeline from the request: its errors name the pipeline of the request."""
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    from deltadrain.jobs import ERROR_PREFIX
    from deltadrain.orchestration.operators import DeltadrainJobFailed, ReplayOperator
    from deltadrain.runtime import session as spark

    def failing_submit(self, context):
        list(self._watch([f"{ERROR_PREFIX}no DLQ table yet"]))  # what spark-submit's output carries
        raise RuntimeError("spark-submit exited with 1")

    monkeypatch.setattr(spark, "spark_conf", lambda **_: {})
    monkeypatch.setattr(SparkSubmitOperator, "execute", failing_submit)
    op = ReplayOperator(task_id="replay", request_task="validate", executor="submit")
    ctx = context("manual")
    ctx["ti"].xcom_pull = lambda task_ids: {"pipeline": "clicks", "mode": "dlq"}
    with pytest.raises(DeltadrainJobFailed) as failed:
        op.execute(ctx)
    assert str(failed.value) == "deltadrain replay of 'clicks' failed: no DLQ table yet"


def test_a_quality_task_whose_data_failed_is_not_retried_but_one_that_could_not_check_is(monkeypatch):
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
    from airflow.sdk.exceptions import AirflowFailException

    from deltadrain.jobs import ERROR_PREFIX, SUMMARY_PREFIX
    from deltadrain.orchestration.operators import DeltadrainJobFailed, QualityOperator
    from deltadrain.runtime import session as spark

    lines: list[str] = []

    def failing_submit(self, context):
        list(self._watch(lines))
        raise RuntimeError("spark-submit exited with 1")

    monkeypatch.setattr(spark, "spark_conf", lambda **_: {})
    monkeypatch.setattr(SparkSubmitOperator, "execute", failing_submit)
    ctx = context("scheduled")
    ctx["ti"].xcom_pull = lambda task_ids: {"outcome": "committed", "batch": 3}
    report = {"pipeline": "orders", "batch": 3, "success": False, "policy": "fail", "data_docs": "/d/index.html"}
    lines[:] = [SUMMARY_PREFIX + json.dumps(report), f"{ERROR_PREFIX}batch 3 failed data quality: amount between"]
    with pytest.raises(AirflowFailException, match="batch 3 failed data quality"):
        QualityOperator(task_id="quality", pipeline="orders", drain_task="drain", executor="submit").execute(ctx)
    # No summary: the check could not run (no table yet, GX broke); Airflow may retry that.
    lines[:] = [f"{ERROR_PREFIX}pipeline 'orders': no target table"]
    with pytest.raises(DeltadrainJobFailed, match="no target table") as failed:
        QualityOperator(task_id="quality", pipeline="orders", drain_task="drain", executor="submit").execute(ctx)
    assert not isinstance(failed.value, AirflowFailException)


class FakeSession:
    """Stands in for a Spark Connect session: what the operator asks of one (interrupt, stop)."""

    def __init__(self):
        self.stopped = self.interrupted = False

    def interruptAll(self):  # pyspark's name
        self.interrupted = True

    def stop(self):
        self.stopped = True


def test_through_spark_connect_a_job_runs_in_the_task_on_a_session_of_its_own(monkeypatch):
    """executor connect: the job's result is the task's, as through spark-submit: the summary is the XCom,
    an error fails the task with the job's words, a quality failure under `fail` is not retried; the
    session is stopped either way."""
    from airflow.sdk.exceptions import AirflowFailException

    from deltadrain import jobs
    from deltadrain.orchestration import connections
    from deltadrain.orchestration.operators import DeltadrainJobFailed, DrainOperator, QualityOperator
    from deltadrain.runtime import session as spark

    sessions, calls = [], []
    monkeypatch.setattr(connections, "connect_url", lambda conn_id: f"sc://127.0.0.1:1/;conn={conn_id}")

    def new_session(url, **kwargs):
        sessions.append(FakeSession())
        return sessions[-1]

    monkeypatch.setattr(spark, "connect_session", new_session)
    results: list[jobs.JobResult] = []

    def run(job, session, argv):
        calls.append((job, session, argv))
        return results.pop(0)

    monkeypatch.setattr(jobs, "run", run)
    ctx = context("scheduled")
    results.append(jobs.JobResult({"outcome": "committed", "batch": 4, "batches": [4]}))
    assert DrainOperator(task_id="drain", pipeline="orders").execute(ctx)["batch"] == 4
    (job, session, argv), = calls
    assert job == "drain" and session is sessions[0] and argv[0] == "orders" and "--run-id" in argv
    assert sessions[0].stopped
    results.append(jobs.JobResult(error="pipeline 'orders': no target table"))
    with pytest.raises(DeltadrainJobFailed, match="deltadrain drain of 'orders' failed: pipeline 'orders': no target"):
        DrainOperator(task_id="drain", pipeline="orders").execute(ctx)
    assert sessions[1].stopped
    ctx["ti"].xcom_pull = lambda task_ids: {"outcome": "committed", "batch": 3}
    report = {"pipeline": "orders", "batch": 3, "success": False, "policy": "fail", "data_docs": "/d/index.html"}
    results.append(jobs.JobResult(report, "batch 3 failed data quality: amount between"))
    with pytest.raises(AirflowFailException, match="batch 3 failed data quality"):
        QualityOperator(task_id="quality", pipeline="orders", drain_task="drain").execute(ctx)


def test_a_killed_connect_task_interrupts_its_operations_on_the_server(monkeypatch):
    """Airflow's on_kill (a timeout, a task marked failed): the server would run a hung transform on."""
    import threading

    from deltadrain import jobs
    from deltadrain.orchestration import connections
    from deltadrain.orchestration.operators import DrainOperator
    from deltadrain.run import drain
    from deltadrain.runtime import session as spark

    monkeypatch.setattr(drain, "_KILLED", threading.Event())  # this process's mark, taken back after the test
    assert not drain.ended_as_killed(RuntimeError("a MERGE failed"))
    op = DrainOperator(task_id="drain", pipeline="orders")
    seen = {}
    monkeypatch.setattr(connections, "connect_url", lambda conn_id: "sc://127.0.0.1:1")
    monkeypatch.setattr(spark, "connect_session", lambda url, **kwargs: FakeSession())

    def run(job, session, argv):
        op.on_kill()  # what Airflow calls while the job runs
        seen["interrupted"] = session.interrupted
        return jobs.JobResult({"outcome": "committed", "batch": 1})

    monkeypatch.setattr(jobs, "run", run)
    op.execute(context("scheduled"))
    assert seen["interrupted"]
    # The drain under way ends as a killed one: its claims stay for the next run to count.
    assert drain.ended_as_killed(RuntimeError("[OPERATION_CANCELED]"))


def test_a_run_stopped_by_an_order_to_stop_ends_as_killed():
    """Airflow's execution_timeout raises AirflowTaskTimeout, a BaseException, inside the task."""
    from airflow.sdk.exceptions import AirflowTaskTimeout

    from deltadrain.run.drain import ended_as_killed

    assert ended_as_killed(AirflowTaskTimeout()) and ended_as_killed(KeyboardInterrupt())
    assert not ended_as_killed(ValueError("bad row"))


def test_a_connect_session_to_a_server_that_does_not_answer_names_the_fix():
    from deltadrain.errors import PrerequisiteError
    from deltadrain.runtime.session import connect_session
    from tests.conftest import free_port

    port = free_port()
    with pytest.raises(PrerequisiteError) as refused:
        connect_session(f"sc://127.0.0.1:{port}", purpose="deltadrain drain of 'orders'", conn_id="spark_connect")
    text = str(refused.value)
    assert f"127.0.0.1:{port} (Airflow connection 'spark_connect') does not answer" in text
    assert " deltadrain services up`" in text and "spark.executor: submit" in text


def test_the_ingest_sensor_defers_through_a_source_outage_but_not_through_a_config_error(monkeypatch, tmp_path):
    """Nothing listens at the Valkey port: the first probe (in the worker) fails to connect. The run
    must then wait in the triggerer, as the trigger does through outages, not fail."""
    from airflow.sdk.exceptions import TaskDeferred

    from deltadrain.errors import ConfigError
    from deltadrain.orchestration.sensors import SourceWorkSensor
    from deltadrain.orchestration.triggers import SourceWorkTrigger
    from tests.conftest import free_port

    monkeypatch.setenv("DELTADRAIN_VALKEY_PORT", str(free_port()))
    sensor = SourceWorkSensor(task_id="wait_for_work", pipeline="orders", timeout=60, poke_interval=1)
    assert not sensor.poke({})
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute({})
    assert isinstance(deferred.value.trigger, SourceWorkTrigger) and deferred.value.trigger.pipeline == "orders"
    broken = SourceWorkSensor(task_id="wait_for_work", pipeline="orders", config=str(tmp_path / "missing.yaml"),
                              timeout=60, poke_interval=1)
    with pytest.raises(ConfigError, match="config file not found"):
        broken.execute({})


def events_of(trigger) -> list:
    import asyncio

    async def collect():
        return [event.payload async for event in trigger.run()]

    return asyncio.run(collect())


def test_a_source_never_reached_in_the_whole_wait_fails_the_run_and_one_reached_with_nothing_skips_it(monkeypatch):
    # Before, every probe failure counted as "no work": a wrong password or a source down for good was a
    # green, skipped run every five minutes.
    import time

    from airflow.sdk.exceptions import AirflowSkipException

    from deltadrain.orchestration.sensors import SourceUnreachable, SourceWorkSensor
    from deltadrain.orchestration.triggers import SourceWorkTrigger

    def refused():
        raise ConnectionError("invalid username-password pair or user is disabled")

    down = SourceWorkTrigger("orders", poll_seconds=0.01, deadline=time.time() + 0.1)
    monkeypatch.setattr(down, "_probe", refused)
    (event,) = events_of(down)
    assert event == {"status": "unreachable",
                     "error": "ConnectionError: invalid username-password pair or user is disabled"}
    sensor = SourceWorkSensor(task_id="wait_for_work", pipeline="orders", timeout=240, soft_fail=True)
    with pytest.raises(SourceUnreachable, match="could not probe the source of orders for 240s; last error: "
                                                  "ConnectionError: invalid username-password pair"):
        sensor.resume_execution("execute_complete", {"event": event}, {})  # soft_fail does not make it a skip

    probes = []

    def reached_once():  # refused, reached with nothing to do, then refused again until the deadline
        probes.append(1)
        return {"has_work": False} if len(probes) == 2 else refused()

    flaky = SourceWorkTrigger("orders", poll_seconds=0.01, deadline=time.time() + 0.2)
    monkeypatch.setattr(flaky, "_probe", reached_once)
    (event,) = events_of(flaky)
    assert event == {"status": "timeout"} and len(probes) > 2
    with pytest.raises(AirflowSkipException) as skipped:
        sensor.resume_execution("execute_complete", {"event": event}, {})
    assert "no new messages, stuck claims or gaps in orders" in str(skipped.value.__cause__)


def test_a_poking_sensor_that_never_reached_the_source_fails_too_and_one_that_did_skips(monkeypatch):
    from airflow.sdk.exceptions import AirflowSkipException

    from deltadrain.orchestration.sensors import SourceUnreachable, SourceWorkSensor

    probes = []

    def refused():
        probes.append(1)
        raise ConnectionError("invalid username-password pair or user is disabled")

    sensor = SourceWorkSensor(task_id="wait_for_work", pipeline="orders", timeout=0.3, poke_interval=0.05,
                              soft_fail=True, deferrable=False)
    monkeypatch.setattr(sensor, "_probe", refused)
    with pytest.raises(SourceUnreachable, match="last error: ConnectionError: invalid username-password pair"):
        sensor.execute({})
    assert len(probes) > 1

    probes.clear()

    def reached_once():  # refused, reached with nothing to do, then refused until the timeout
        if len(probes) == 1:
            probes.append(1)
            return {"has_work": False, "new": 0, "reclaimable": 0, "gaps": 0}
        return refused()

    monkeypatch.setattr(sensor, "_probe", reached_once)
    with pytest.raises(AirflowSkipException):  # reached once with nothing to do: no outage to report
        sensor.execute({})


def test_one_unreachable_valkey_source_does_not_stop_the_reaping_of_the_others(monkeypatch, tmp_path):
    import copy

    import yaml

    from deltadrain.observe import probe
    from deltadrain.orchestration.sensors import StuckClaimsSensor
    from deltadrain.paths import PROJECT_ROOT

    data = yaml.safe_load((PROJECT_ROOT / "config" / "pipelines.yaml").read_text())
    other = copy.deepcopy(data["pipelines"][0])
    other.update(name="refunds", target={"path": "refunds"})
    other["source"]["streams"] = ["refunds:{0}"]
    data["pipelines"] = [data["pipelines"][0], other]
    path = tmp_path / "pipelines.yaml"
    path.write_text(yaml.safe_dump(data))

    def fake_probe(cfg, pipeline):
        if pipeline.name == "orders":
            raise ConnectionError("Error 111 connecting to valkey-a:6379")
        return SimpleNamespace(reclaimable=3, idle_consumers=0)

    monkeypatch.setattr(probe, "probe", fake_probe)
    found = StuckClaimsSensor(task_id="find_stuck_claims", config=str(path)).poke({})
    assert bool(found) and found.xcom_value == ["refunds"]


def test_the_maintenance_job_gets_its_pipeline_or_the_shared_tables():
    from deltadrain.orchestration.operators import MaintainOperator

    one = MaintainOperator(task_id="maintain_orders", pipeline="orders", config="/etc/dd.yaml")
    args = one.job_args(context("scheduled"))
    assert args[:3] == ["orders", "--config", "/etc/dd.yaml"] and "--shared" not in args
    shared = MaintainOperator(task_id="maintain_shared_tables", config="/etc/dd.yaml")
    args = shared.job_args(context("scheduled"))
    assert args[:3] == ["--shared", "--config", "/etc/dd.yaml"] and args[-2] == "--run-id"
    assert shared.application.endswith("spark_jobs/maintain.py")
    assert (one.subject, shared.subject) == ("'orders'", "the shared tables")  # in a failed task's message


def test_source_credentials_never_reach_the_spark_submit_command_line(monkeypatch):
    """Without spark_default the provider's hook falls back to YARN and, deciding so when it is made,
    puts env_vars on the command line as spark.yarn.appMasterEnv.* (readable in `ps` by any user): the
    operator decides the master first, `local[*]`, and hands the hook that connection. A real YARN or
    Kubernetes master would do the same: the operator refuses to hand secrets to those."""
    from deltadrain.orchestration.operators import DeltadrainJobFailed, DrainOperator
    from deltadrain.orchestration.submit import DEFAULT_MASTER

    handed = {"AIRFLOW_CONN_SRC": '{"conn_type": "generic", "login": "u", "password": "hunter2"}'}
    monkeypatch.delenv("AIRFLOW_CONN_SPARK_DEFAULT", raising=False)
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_YARN", '{"conn_type": "spark", "host": "yarn"}')
    for conn_id in ("spark_default", "spark_yarn"):
        op = DrainOperator(task_id=f"drain_{conn_id}", pipeline="orders", conn_id=conn_id)
        op._handed, op.env_vars = handed, {**handed, "PATH": "/usr/bin"}
        if conn_id == "spark_default":  # local: the secret goes only into the child's environment
            hook = op._get_hook()
            command = hook._build_spark_submit_command("job.py")
            assert command[command.index("--master") + 1] == DEFAULT_MASTER
            assert not any("hunter2" in arg or "AIRFLOW_CONN" in arg for arg in command), command
            assert hook._env["AIRFLOW_CONN_SRC"] == handed["AIRFLOW_CONN_SRC"]
        else:
            with pytest.raises(DeltadrainJobFailed, match="the Spark master yarn would get the source's credentials "
                                                          r"\(AIRFLOW_CONN_SRC\) on the spark-submit command line"):
                op._get_hook()


@pytest.mark.parametrize("conn", [
    "spark://127.0.0.1:7077", "yarn", "local[2]", "mesos://10.0.0.1:5050",
    '{"conn_type": "spark", "host": "local[*]"}', '{"conn_type": "spark", "host": "spark://h", "port": 7077}',
    '{"conn_type": "spark", "host": "spark://h1:7077,h2:7077"}', '{"conn_type": "spark", "host": "h", "port": 7077}',
    '{"conn_type": "spark", "host": "yarn", "extra": {"deploy-mode": "cluster", "queue": "etl"}}',
])
def test_the_master_decided_before_the_hook_is_the_one_the_hook_submits_to(conn, monkeypatch):
    """The operator derives the conf, the properties file and the refusal above from the master it reads
    off the connection; the provider's hook must submit to that same master, whatever form the connection
    takes (a URI, JSON with the whole URL in the host, or the host and port apart)."""
    from deltadrain.orchestration.submit import SubmitHook, master_of, spark_connection

    monkeypatch.setenv("AIRFLOW_CONN_SPARK_UNDER_TEST", conn)
    connection, defined = spark_connection("spark_under_test")
    assert defined
    hook = SubmitHook(connection=connection, watch=iter, conn_id="spark_under_test")
    command = hook._build_spark_submit_command("job.py")
    assert command[command.index("--master") + 1] == master_of(connection)
    # The rest of the connection still counts: its deploy mode and queue reach spark-submit.
    if "cluster" in conn:
        assert command[command.index("--deploy-mode") + 1] == "cluster" and "etl" in command


def test_the_operator_sees_the_lines_spark_submit_prints_and_the_hook_still_logs_them(monkeypatch, capsys):
    """The summary line reaches the operator through the hook's own processing of spark-submit's output;
    the hook's arguments the operator was given (here executor_memory) reach spark-submit."""
    from deltadrain.jobs import SUMMARY_PREFIX
    from deltadrain.orchestration.operators import DrainOperator

    monkeypatch.delenv("AIRFLOW_CONN_SPARK_DEFAULT", raising=False)
    op = DrainOperator(task_id="drain", pipeline="orders", executor_memory="3g")
    hook = op._get_hook()
    assert "--executor-memory" in (command := hook._build_spark_submit_command("job.py")) and "3g" in command
    lines = ["starting\n", SUMMARY_PREFIX + json.dumps({"outcome": "committed"}) + "\n"]
    capsys.readouterr()
    hook._process_spark_submit_log(iter(lines))
    assert op._summary == {"outcome": "committed"} and op._tail[0] == "starting"
    assert "starting" in capsys.readouterr().out  # Airflow's task log


def test_a_submit_to_the_embedded_cluster_ships_no_jars_and_keeps_its_secrets_in_a_private_file(
        tmp_path, monkeypatch):
    """The master spark_default names decides it: the workers' jar cache replaces spark.jars, and the
    store's login and the cluster's secret go in the run's own file."""
    from pathlib import Path

    from deltadrain.config import load_config
    from deltadrain.config.embedded import spark_cluster_secret_file
    from deltadrain.dev.services.spark_cluster import spark_cluster_service
    from deltadrain.lake.objectstore import S3Settings
    from deltadrain.orchestration.operators import DrainOperator
    from deltadrain.runtime.session import spark_conf

    monkeypatch.setenv("DELTADRAIN_HOME", str(tmp_path))
    monkeypatch.setenv("DELTADRAIN_SPARK_CLUSTER_PORT", "17998")
    monkeypatch.delenv("DELTADRAIN_WORKER_JARS", raising=False)
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", "spark://127.0.0.1:17998")
    spark_cluster_service(load_config()).prepare()  # makes the cluster's secret
    secret = spark_cluster_secret_file().read_text().strip()
    store = S3Settings("key", "s3-secret", "http://127.0.0.1:9000")
    op = DrainOperator(task_id="drain", pipeline="orders", executor="submit")
    op.conf = spark_conf(object_store=store, with_login=False)
    op._private = (tmp_path, store)
    command = op._get_hook()._build_spark_submit_command("job.py")
    assert command[command.index("--master") + 1] == "spark://127.0.0.1:17998"
    assert not any(secret in arg or "s3-secret" in arg for arg in command), command
    assert not any(arg.startswith("spark.jars=") for arg in command)
    assert any(arg.startswith("spark.executor.extraClassPath=") and "hadoop-aws" in arg for arg in command)
    props = Path(command[command.index("--properties-file") + 1])
    assert props.parent == tmp_path and props.stat().st_mode & 0o077 == 0
    assert {f"spark.authenticate.secret={secret}", "spark.hadoop.fs.s3a.secret.key=s3-secret"} <= \
        set(props.read_text().splitlines())


def test_the_replay_form_proposes_the_stream_keys_and_nothing_without_valkey_pipelines(cfg):
    from deltadrain.orchestration.factory import replay_params

    keys = [k for p in cfg.pipelines if p.source.kind == "valkey" for k in p.source.streams]
    assert keys and replay_params(cfg)["partition"].schema["examples"] == keys
    kafka_only = cfg.model_copy(update={"pipelines": [p for p in cfg.pipelines if p.source.kind == "kafka"]})
    assert "examples" not in replay_params(kafka_only)["partition"].schema  # an empty list shows an empty menu


def test_a_jobs_bad_arguments_are_its_error_not_an_exit():
    """A Connect task parses the job's arguments in its own process: argparse must not exit it."""
    from deltadrain import jobs

    for argv, words in ((["orders", "--owed", "--table"], "--owed goes with --batch"),
                        (["orders"], "one of --batch, --table or --owed is required"),
                        (["orders", "--settle", "60", "--batch", "1"], "--settle takes")):
        result = jobs.run("quality", None, argv)
        assert result.summary is None and words in result.error, result
    assert "the following arguments are required: pipeline" in jobs.run("drain", None, []).error
