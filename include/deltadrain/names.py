"""Names of deltadrain's Airflow objects, importable without Airflow (CLI, services, demo, tests)."""

REAPER_DAG = "deltadrain__reaper"
REPLAY_DAG = "deltadrain__replay"
QUALITY_DAG = "deltadrain__quality"
MAINTENANCE_DAG = "deltadrain__maintenance"
ALERTS_TASK = "alerts"  # the ingest DAG's SLA-like check (deltadrain.observe.alerts), when the pipeline sets thresholds
AIRFLOW_RUN_PREFIX = "af-"  # how the run ids of Airflow's tasks start (operators.deltadrain_run_id)


def ingest_dag_id(pipeline: str) -> str:
    return f"deltadrain__{pipeline}__ingest"


def batch_quality_dag_id(pipeline: str) -> str:
    """The DAG that checks a continuous pipeline's batches, started by its drains' asset events."""
    return f"deltadrain__{pipeline}__quality"


def ingest_run_prefix(pipeline: str) -> str:
    """How the run id of each drain of the pipeline's ingest DAG starts: such a drain is followed by its
    DAG run's quality task, which is how quality.owed.first_scheduled tells its batches from CLI drains.
    Never cut: a pipeline name has at most 63 characters, deltadrain_run_id cuts past 110."""
    return f"{AIRFLOW_RUN_PREFIX}{ingest_dag_id(pipeline)}-"


def pool_name(pipeline: str) -> str:
    return f"deltadrain_{pipeline}"


def replay_task_id(pipeline: str) -> str:
    """The replay DAG's task for one pipeline's requests: it runs in that pipeline's pool."""
    return f"replay_{pipeline}"


def replay_quality_task_id(pipeline: str) -> str:
    """The replay DAG's task that checks the batches a reprocess of that pipeline rewrote."""
    return f"quality_{pipeline}"
