"""Operators: deltadrain's Spark jobs (deltadrain.jobs), run the way the config's `spark.executor` says.

- connect (the default): the task is a Spark Connect client of the server behind the `spark_connect`
  Airflow connection (the apache-spark provider's type), in a session of its own; no JVM starts.
- submit: the Spark provider's SparkSubmitOperator starts a driver for spark_jobs/<job>.py. The job
  prints one `deltadrain-summary: {json}` line when it succeeds and one `deltadrain: error: ...` line
  when it fails, and the operator reads both from spark-submit's output.

Either way the summary becomes the task's XCom (and a readable block in its log), and a failure carries
the job's own error instead of only "exit code 1".
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import BaseOperator

from deltadrain.jobs import ERROR_PREFIX, SUMMARY_PREFIX
from deltadrain.names import AIRFLOW_RUN_PREFIX
from deltadrain.orchestration.submit import SubmitHook, master_of, puts_env_on_command_line, spark_connection
from deltadrain.paths import PROJECT_ROOT

SPARK_JOBS = PROJECT_ROOT / "spark_jobs"
# The spark-submit hook's arguments: those the operator keeps as template fields are taken from it once
# rendered, the others as the operator was given them.
_HOOK_ARGS = frozenset(inspect.signature(SparkSubmitHook.__init__).parameters) - {"self", "conn_id"}


class DeltadrainJobFailed(Exception):
    """A deltadrain Spark job exited with an error; the message is the job's own."""


def deltadrain_run_id(context) -> str:
    """A run id that names the Airflow run and try, safe in Valkey consumer names and file paths."""
    ti = context["ti"]
    base = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{AIRFLOW_RUN_PREFIX}{ti.dag_id}-{ti.run_id}")
    if len(base) > 110:  # cut, ending in a hash of the whole: two runs of a long DAG id stay apart
        base = f"{base[:101]}-{hashlib.sha256(base.encode()).hexdigest()[:8]}"
    # The try number is always kept: two tries of one task are two runs for the commit protocol.
    return f"{base}-try{ti.try_number}"


class DeltadrainSparkOperator(SparkSubmitOperator):
    """Runs deltadrain's job `job` through the Spark Connect server (executor `connect`), or submits
    spark_jobs/<job>.py with deltadrain's Spark conf (Delta and the Kafka source from the jar cache, the
    environment's Python) on the `spark_default` connection's master (executor `submit`).

    Subclasses say which arguments the job gets (`job_args`). Everything that touches the disk (the
    jar cache, the config) happens in execute(), never when the DAG file is parsed. `executor` and the
    connection ids default to the config's `spark` settings.
    """

    ui_color = "#d7ecff"
    job = "drain"
    reads_source = True  # the job reads or writes the pipeline's source: it needs its connection

    def __init__(self, *, pipeline: str | None = None, config: str | None = None, conn_id: str | None = None,
                 executor: str | None = None, connect_conn_id: str | None = None, **kwargs):
        super().__init__(application=str(SPARK_JOBS / f"{self.job}.py"), conn_id=conn_id or "spark_default",
                         name=f"deltadrain-{self.job}-{pipeline or 'all'}", **kwargs)
        self.pipeline, self.config = pipeline, config
        self.executor, self.connect_conn_id, self.submit_conn_id = executor, connect_conn_id, conn_id
        self.spark_conn_id = conn_id or "spark_default"  # execute() decides it from the config when not given
        self.submit_options = {k: v for k, v in kwargs.items() if k in _HOOK_ARGS and k not in self.template_fields}
        self._summary: dict | None = None
        self._error: str | None = None
        self._tail: list[str] = []
        self._handed: dict[str, str] = {}  # AIRFLOW_CONN_* this run hands the job (execute)
        self._session: Any = None  # the Connect session while a connect run is under way (on_kill interrupts it)
        self._private: tuple[Path, Any] | None = None  # a submit run's private directory and object store
        self._via_connect = False
        self._lineage: Any = None  # the OperatorLineage the provider's listener asks for (_note_lineage)

    # -- what the job gets ------------------------------------------------------------------------

    def job_args(self, context) -> list[str]:
        args = [self.pipeline] if self.pipeline else []
        if self.config:
            args += ["--config", self.config]
        return [*args, "--run-id", deltadrain_run_id(context)]

    @property
    def subject(self) -> str:
        """What the job acts on, for messages: the pipeline, or the shared tables when none is named."""
        return f"'{self.pipeline}'" if self.pipeline else "the shared tables"

    def source_connections(self) -> dict[str, str]:
        """The source's Airflow connections, handed to the job in its environment (secrets.handed_over):
        one made in the Airflow UI lives in the metadata DB, which the job's process cannot read."""
        if not (self.reads_source and self.pipeline):
            return {}
        from deltadrain.config import load_config
        from deltadrain.secrets import handed_over

        return handed_over(load_config(self.config).pipeline(self.pipeline).connection_ids())

    # -- submit -----------------------------------------------------------------------------------

    def _get_hook(self) -> SubmitHook:
        """The provider's operator makes its hook here; ours is made from what is decided first: the
        connection (`local[*]` when Airflow has none) and, from its master, the conf and the properties
        file. Credentials are refused to a master that would put them on the command line."""
        connection, defined = spark_connection(self.spark_conn_id)
        master = master_of(connection)
        if not defined:
            self.log.info("deltadrain: connection %r is not defined; using master %s", self.spark_conn_id, master)
        handed = sorted(self._handed)
        if handed and puts_env_on_command_line(master):
            # Those masters get env_vars as --conf spark.yarn.appMasterEnv.* / spark.kubernetes.driverEnv.*:
            # in the spark-submit command line, readable by anyone on the worker, and in the app's conf.
            raise DeltadrainJobFailed(
                f"deltadrain {self.job} of {self.subject}: the Spark master {master} would get "
                f"the source's credentials ({', '.join(handed)}) on the spark-submit command line. Define "
                "them in the driver's environment on the cluster (a Kubernetes secret, the YARN application "
                "environment) under the same names; a connection already in the worker's environment is "
                "not handed over")
        self._for_master(master)
        templated = {name: getattr(self, name) for name in self.template_fields if name in _HOOK_ARGS}
        return SubmitHook(connection=connection, watch=self._watch, **self.submit_options, **templated,
                          conn_id=self.spark_conn_id)

    def _for_master(self, master: str) -> None:
        """What depends on the master: a cluster whose workers hold the jar cache gets no jars shipped
        (spark.jars_on_workers); the object store's login and the embedded cluster's secret go in a
        properties file of this run's own, never on the command line."""
        from deltadrain.lake.objectstore import login_conf, private_properties
        from deltadrain.runtime.session import cluster_conf, jars_on_workers

        self.conf = jars_on_workers(self.conf or {}, master)
        if self._private is None:
            return
        where, store = self._private
        secret = {**(login_conf(store) if store is not None else {}), **cluster_conf(master)}
        if secret:
            self.properties_file = str(private_properties(secret, where / "private.properties"))

    def _watch(self, lines) -> Iterator[str]:
        for line in lines:
            text = line.strip()
            if text.startswith(SUMMARY_PREFIX):
                self._summary = json.loads(text[len(SUMMARY_PREFIX):])
            elif text.startswith(ERROR_PREFIX):
                self._error = text[len(ERROR_PREFIX):]
            self._tail = (self._tail + [text])[-20:]
            yield line

    def execute(self, context) -> Any:
        try:
            return self._execute(context)
        finally:
            self._note_lineage()

    def _execute(self, context) -> Any:
        from deltadrain.config import load_config

        settings = load_config(self.config).spark
        executor = self.executor or settings.executor
        argv = self.job_args(context)
        if executor == "connect":
            self._run_connect(argv, self.connect_conn_id or settings.connect_conn_id)
        else:
            self.spark_conn_id = self.submit_conn_id or settings.submit_conn_id
            self._run_submit(context, argv)
        return self._report()

    def _run_submit(self, context, argv: list[str]) -> None:
        import tempfile

        from deltadrain.config import load_config
        from deltadrain.lake.objectstore import CONNECTION_ID, as_connection, for_config
        from deltadrain.runtime.session import spark_conf
        from deltadrain.secrets import env_name

        self.application_args = argv
        store = for_config(load_config(self.config))
        self.conf = {**spark_conf(object_store=store, with_login=False), **(self.conf or {})}
        with tempfile.TemporaryDirectory(prefix="deltadrain-submit-") as private:
            # The login (and a cluster's secret) go in a file there once the master is known (_for_master).
            self._private = (Path(private), store)
            handed = {}
            if store is not None and not os.environ.get(env_name(CONNECTION_ID)):
                handed[env_name(CONNECTION_ID)] = as_connection(store)  # the driver's delta-rs and pyarrow need it
            try:
                self._submit(context, handed)
            finally:
                self._private = None

    def _submit(self, context, handed: dict[str, str]) -> None:
        bindir = str(Path(sys.executable).parent)
        # The environment's spark-submit and python come first, whatever PATH the worker has.
        self._handed = {**self.source_connections(), **handed}
        self.env_vars = {**(self.env_vars or {}), **self._handed,
                         "PATH": bindir + os.pathsep + os.environ.get("PATH", "")}
        try:
            super().execute(context)
        except Exception as exc:  # the task is going anyway
            if self._error:
                raise DeltadrainJobFailed(f"deltadrain {self.job} of {self.subject} failed: {self._error}") from exc
            raise

    def _run_connect(self, argv: list[str], conn_id: str) -> None:
        """The job in this task's process, a Spark Connect client in a session of its own: its confs (the
        commit's app transaction) and temp views are never another run's. The source's connections are
        read here, where Airflow's are; what the server's Python workers need of them travels with the
        job's functions."""
        from deltadrain.jobs import run
        from deltadrain.orchestration.connections import connect_url
        from deltadrain.runtime.session import connect_session

        self._via_connect = True
        url = connect_url(conn_id)
        self.log.info("deltadrain: %s of %s through Spark Connect (connection %r)", self.job, self.subject, conn_id)
        self._session = connect_session(url, purpose=f"deltadrain {self.job} of {self.subject}",
                                        conn_id=conn_id)
        try:
            result = run(self.job, self._session, argv)
        except BaseException:
            # Airflow's timeout (raised in here) or a kill: the server would run the job's query on.
            self._interrupt()
            raise
        finally:
            session, self._session = self._session, None
            session.stop()
        for note in result.notes:
            self.log.info("%s", note)
        self._summary = result.summary
        if result.error is not None:
            self._error = result.error
            raise DeltadrainJobFailed(f"deltadrain {self.job} of {self.subject} failed: {result.error}")

    # -- lineage (Airflow's openlineage provider asks for it when the task ends) -------------------

    def lineage_request(self) -> dict | None:
        """What the task was asked beyond its pipeline (a replay's request)."""
        return None

    def _note_lineage(self) -> None:
        """The task's lineage, made when its job ends, in the task's own process: the provider's listener
        asks for it in a process forked from this one, where delta-rs (the tables' schemas) cannot run.
        On a failure: what the task meant to read and write, with row counts only from a summary it had."""
        from deltadrain.orchestration.lineage import lineage_on, task_lineage

        try:
            if lineage_on():
                self._lineage = task_lineage(self.job, self.config, self.pipeline, self._summary,
                                             self.lineage_request())
        except Exception as exc:  # lineage never fails the task
            self.log.warning("deltadrain: no lineage for this %s task: %s", self.job, exc)

    def get_openlineage_facets_on_complete(self, task_instance):
        return self._lineage

    def get_openlineage_facets_on_failure(self, task_instance):
        return self._lineage

    def on_kill(self) -> None:
        if not self._via_connect:
            super().on_kill()  # SparkSubmitHook: SIGKILL to spark-submit
            return
        from deltadrain.run.drain import stop_as_killed

        stop_as_killed()  # the drain under way leaves its claims as a killed one does
        self._interrupt()

    def _interrupt(self) -> None:
        session = self._session
        if session is None:
            return
        try:
            session.interruptAll()
        except Exception as exc:
            self.log.warning("deltadrain: could not interrupt the Connect session's operations: %s", exc)

    def _report(self) -> dict:
        if self._summary is None:
            raise DeltadrainJobFailed(f"deltadrain {self.job} of {self.subject} printed no summary; "
                                      f"last lines: {' | '.join(self._tail[-5:])}")
        if self._summary.get("error") and self._summary.get("outcome") not in (None, "ahead"):
            raise DeltadrainJobFailed(f"deltadrain {self.job} of {self.subject}: {self._summary['error']}")
        if self._summary.get("later_error"):
            self.log.warning("deltadrain %s of %s stopped after batches %s: %s (the next run meets it first)",
                             self.job, self.subject, self._summary.get("batches"), self._summary["later_error"])
        self.log.info("deltadrain %s summary:\n%s", self.job, json.dumps(self._summary, indent=2, default=str))
        return self._summary


class DrainOperator(DeltadrainSparkOperator):
    """One drain run; in a backfill DAG run, a backfill of the run's data interval instead. A drain's
    figures go to Airflow's metrics backend when one is on (deltadrain.orchestration.metrics)."""

    job = "drain"

    def execute(self, context) -> Any:
        summary = super().execute(context)
        if self.pipeline and summary.get("mode") != "backfill":
            from deltadrain.orchestration.metrics import send_drain_metrics

            send_drain_metrics(self.config, self.pipeline, summary)
        return summary

    def job_args(self, context) -> list[str]:
        from deltadrain.orchestration.sensors import is_backfill

        args = super().job_args(context)
        start, end = context.get("data_interval_start"), context.get("data_interval_end")
        if is_backfill(context):
            if start is None or end is None or start >= end:
                raise DeltadrainJobFailed("a backfill run needs a data interval; the ingest DAG's interval "
                                          "timetable gives one to every scheduled or backfilled run")
            args += ["--backfill-start", start.isoformat(), "--backfill-end", end.isoformat()]
        elif (context.get("params") or {}).get("accept_gaps"):
            args.append("--accept-gaps")
        return args


class ReplayOperator(DeltadrainSparkOperator):
    """The replay job with the validated request of the upstream task (a JSON argument, never a shell string)."""

    job = "replay"

    def __init__(self, *, request_task: str, **kwargs):
        super().__init__(**kwargs)
        self.request_task = request_task
        self._request: dict | None = None

    def lineage_request(self) -> dict | None:
        return self._request

    def job_args(self, context) -> list[str]:
        request = context["ti"].xcom_pull(task_ids=self.request_task)
        self._request = request
        # The pipeline comes with the request: errors and the log name the one asked for.
        self.pipeline = (request or {}).get("pipeline") or self.pipeline
        args = ["--request", json.dumps(request)]
        if self.config:
            args += ["--config", self.config]
        return [*args, "--run-id", deltadrain_run_id(context)]


class MaintainOperator(DeltadrainSparkOperator):
    """OPTIMIZE and VACUUM of one pipeline's tables, or with no pipeline of the shared tables."""

    job = "maintain"
    reads_source = False

    def job_args(self, context) -> list[str]:
        args = super().job_args(context)
        return args if self.pipeline else ["--shared", *args]


class QualityOperator(DeltadrainSparkOperator):
    """Great Expectations on the batch the upstream drain committed (`drain_task`), on the committed
    batches no check has a result for (`owed=True`), or on the whole table (`whole_table=True`).
    The pipeline's policy decides: fail the task, warn, or quarantine."""

    job = "quality"
    reads_source = False

    def __init__(self, *, drain_task: str | None = None, whole_table: bool = False, owed: bool = False,
                 catch_up: bool = True, settle_s: int = 0, **kwargs):
        """`catch_up`: with `drain_task`, the owed batches too (the ingest DAG); the replay DAG
        checks only the batches its reprocess rewrote. `settle_s`: with `owed`, leave out the batches
        committed less than that many seconds ago (the daily DAG: their ingest run checks them)."""
        super().__init__(**kwargs)
        if sum((drain_task is not None, whole_table, owed)) != 1:
            raise ValueError("QualityOperator checks one of: drain_task's batches, whole_table, owed")
        if settle_s < 0 or (settle_s and not owed):
            raise ValueError("QualityOperator: settle_s is a number of seconds >= 0, for owed=True")
        self.drain_task, self.whole_table, self.owed, self.catch_up = drain_task, whole_table, owed, catch_up
        self.settle_s = settle_s

    def job_args(self, context) -> list[str]:
        args = super().job_args(context)
        if self.whole_table:
            return [*args, "--table"]
        if self.owed:
            return [*args, "--owed", *(["--settle", str(self.settle_s)] if self.settle_s else [])]
        from airflow.sdk.exceptions import AirflowSkipException

        from deltadrain.quality.owed import batches_to_check

        summary = context["ti"].xcom_pull(task_ids=self.drain_task) or {}
        batches = batches_to_check(summary)
        if not batches:
            # A backfill commits no batch (its rows carry batch 0): the daily whole-table check covers them.
            raise AirflowSkipException(f"no batch to check (drain outcome: {summary.get('outcome', summary.get('mode'))})")
        # --owed: also the batches an earlier drain try committed and then failed, which no summary named.
        return [*args, "--batch", *map(str, batches), *(["--owed"] if self.catch_up else [])]

    def execute(self, context) -> Any:
        from airflow.sdk.exceptions import AirflowFailException

        try:
            report = super().execute(context)
        except DeltadrainJobFailed as exc:
            summary = self._summary or {}
            if summary.get("success") is False and summary.get("policy") == "fail":
                # The data failed its suite: a retry would check the same rows and fail the same way
                # (adding a results row each time). A check that could not run has no summary: retried.
                self.log.error("deltadrain: Data Docs: file://%s", summary.get("data_docs"))
                raise AirflowFailException(str(exc)) from exc
            raise
        self.log.info("deltadrain: Data Docs: file://%s", report.get("data_docs"))
        if not report.get("success", True):
            self.log.warning("deltadrain: %s failed data quality (policy %s): %s", self.pipeline,
                             report.get("policy"), "; ".join(report.get("failed") or []))
        return report


class AlertsOperator(BaseOperator):
    """The pipeline's `alerts:` thresholds checked after the drain (deltadrain.observe.alerts): the figures in the
    log, and a failure that names each one passed with its threshold. It reads what the view reads
    (the source's counts, the lake through delta-rs): no Spark job, no pool slot."""

    ui_color = "#ffe7c7"

    def __init__(self, *, pipeline: str, config: str | None = None, **kwargs):
        super().__init__(**kwargs)
        self.pipeline, self.config = pipeline, config

    def execute(self, context) -> dict:
        from airflow.sdk.exceptions import AirflowFailException

        from deltadrain.config import load_config
        from deltadrain.observe.alerts import check

        cfg = load_config(self.config)
        # The previous check ran at the end of the previous run of this DAG (max_active_runs=1), before
        # this one started: the DLQ as of this run's start is what it saw.
        since = getattr(context.get("dag_run"), "start_date", None)
        report = check(cfg, cfg.pipeline(self.pipeline), since)
        for finding in report["findings"]:
            (self.log.error if finding["breached"] else self.log.info)("deltadrain alert: %s", finding["text"])
        if report["failure"]:
            # Measured, not flaky: a retry would measure the same thing. The next run checks again.
            raise AirflowFailException(report["failure"])
        return report
