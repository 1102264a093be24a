"""Run one DAG with dag.test() in a process of its own and write its task states and XComs as JSON
to a result file (a file, not stdout: threads of the run print there too, into the middle of a line).

Tests call this in a subprocess: dag.test()'s in-process task supervisor closes descriptors of the
process it runs in, which takes down a PySpark gateway living there (the JVM exits when its stdin
pipe closes). Usage: python -m tests.integration.dagrun DAG_ID RESULT_FILE [CONF_JSON]

With --serve it is a fork server (tests.support.processes.run_dag starts one per test worker): it
imports once what every DAG run imports (Airflow with its in-process execution API, the providers
the DAG file uses, Great Expectations, PySpark's Connect client; most of a DAG run's start on a
busy machine) and forks a child for each DAG run a line on its stdin asks for. The child takes that
request's environment and working directory, writes its output to the request's log file, and exits:
each DAG run is still a process of its own, so dag.test() may close what it likes.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import traceback
from pathlib import Path

DAGS = Path(__file__).resolve().parents[2] / "dags"
# What a DAG run imports that reads no setting of the run's own at import time.
PRELOAD = ("airflow", "airflow.dag_processing.dagbag", "airflow.models.xcom", "airflow.utils.session",
           "airflow.sdk.execution_time.supervisor", "airflow.sdk.execution_time.task_runner",
           "airflow.api_fastapi.execution_api.app", "airflow.sdk", "airflow.triggers.base",
           "airflow.providers.apache.spark.operators.spark_submit", "airflow.providers.apache.spark.hooks.spark_connect",
           "airflow.providers.openlineage.extractors", "great_expectations", "pyspark.sql.connect.session")


def _decoded(value):
    """An XCom as stored: JSON text for most values, but a branch task's plain task id is not."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


def run(dag_id: str, conf: dict | None, result: str) -> None:
    from airflow.dag_processing.dagbag import DagBag
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    dag = DagBag(dag_folder=str(DAGS)).get_dag(dag_id)
    if dag is None:
        raise SystemExit(f"{dag_id} is not in the DagBag")
    run = dag.test(run_conf=conf)
    states, xcoms = {}, {}
    with create_session() as session:
        for ti in run.get_task_instances(session=session):
            states[ti.task_id] = str(ti.state.value if hasattr(ti.state, "value") else ti.state)
        for row in session.query(XComModel).filter_by(dag_id=dag_id, run_id=run.run_id, key="return_value"):
            xcoms[row.task_id] = _decoded(row.value)
    Path(result).write_text(json.dumps({"run_id": run.run_id, "state": str(run.state), "states": states,
                                        "xcoms": xcoms}, default=str))


def _child(request: dict) -> int:
    """A forked DAG run: the request's environment, directory and log, then `run`. Its exit code."""
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    from airflow import settings

    if settings.engine is not None:
        settings.engine.dispose(close=False)  # the server's pool, if any, stays the server's
    try:
        run(request["dag_id"], request["conf"], request["result"])
        return 0
    except SystemExit as exc:
        print(exc, file=sys.stderr)
        return exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
        return 1


def serve() -> None:
    """Preload, say READY, then for each request line: fork, answer {"pid"}, and once the child ended {"rc"}.
    The answers go out on the stdout it was started with; what the imports print goes to its stderr."""
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    for name in PRELOAD:
        importlib.import_module(name)

    def answer(text: str) -> None:
        answers.write(text + "\n")
        answers.flush()

    answer("READY")
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                answers.close()
                code = _child(request)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        answer(json.dumps({"pid": pid}))
        _, status = os.waitpid(pid, 0)
        answer(json.dumps({"rc": os.waitstatus_to_exitcode(status)}))


def main() -> None:
    if sys.argv[1:] == ["--serve"]:
        serve()
        return
    run(sys.argv[1], json.loads(sys.argv[3]) if len(sys.argv) > 3 else None, sys.argv[2])


if __name__ == "__main__":
    main()
