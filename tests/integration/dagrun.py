"""Run one DAG with dag.test() in a process of its own and print its task states and XComs as JSON.

Tests call this in a subprocess: dag.test()'s in-process task supervisor closes descriptors of the
process it runs in, which takes down a PySpark gateway living there (the JVM exits when its stdin
pipe closes). Usage: python -m tests.integration.dagrun DAG_ID [CONF_JSON]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

DAGS = Path(__file__).resolve().parents[2] / "dags"


def _decoded(value):
    """An XCom as stored: JSON text for most values, but a branch task's plain task id is not."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


def main() -> None:
    from airflow.dag_processing.dagbag import DagBag
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    dag_id = sys.argv[1]
    conf = json.loads(sys.argv[2]) if len(sys.argv) > 2 else None
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
    print("DAGRUN-RESULT " + json.dumps({"run_id": run.run_id, "state": str(run.state), "states": states,
                                         "xcoms": xcoms}, default=str), flush=True)


if __name__ == "__main__":
    main()
