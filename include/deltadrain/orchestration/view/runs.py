"""What the view shows of Airflow's own records: the last alerts check of a pipeline's ingest DAG (its
task's state, run and time), read from the metadata DB the API server already holds."""

from __future__ import annotations

from deltadrain.config import PipelineConfig
from deltadrain.names import ALERTS_TASK, ingest_dag_id


def thresholds(pipeline: PipelineConfig) -> dict:
    """The pipeline's alert thresholds that are set, as the page and the JSON show them (pure)."""
    settings = pipeline.alerts
    out = {}
    if settings.max_lag is not None:
        out["max_lag"] = f"{settings.max_lag:,} messages"
    if settings.max_pending_age is not None:
        out["max_pending_age"] = f"{int(settings.max_pending_age.total_seconds()):,} s"
    if settings.max_dead_rise is not None:
        out["max_dead_rise"] = f"{settings.max_dead_rise:,} dead letters"
    return out


def last_alert_check(pipeline: PipelineConfig) -> dict | None:
    """The newest finished `alerts` task of the pipeline's ingest DAG: {state, run_id, at, dag_id}, or
    None when it has none (no thresholds, or no run yet)."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import select

    dag_id = ingest_dag_id(pipeline.name)
    with create_session() as session:
        row = session.execute(
            select(TaskInstance.state, TaskInstance.run_id, TaskInstance.end_date)
            .where(TaskInstance.dag_id == dag_id, TaskInstance.task_id == ALERTS_TASK,
                   TaskInstance.end_date.is_not(None))
            .order_by(TaskInstance.end_date.desc()).limit(1)).first()
    if row is None:
        return None
    state = getattr(row.state, "value", row.state)
    return {"state": str(state), "run_id": row.run_id, "at": row.end_date, "dag_id": dag_id, "task_id": ALERTS_TASK}


def alerts_of(pipeline: PipelineConfig) -> dict | None:
    """The page's alerts block: the thresholds and the last check (None: the pipeline sets none). A
    metadata DB that cannot be read leaves the check out, never the page."""
    import logging

    if not pipeline.alerts.enabled:
        return None
    try:
        last = last_alert_check(pipeline)
    except Exception:
        logging.getLogger(__name__).exception("deltadrain view: the last alerts check of %s could not be read",
                                              pipeline.name)
        last = None
    return {"thresholds": thresholds(pipeline), "last": last}
