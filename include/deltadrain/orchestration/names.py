"""Names of deltadrain's Airflow objects, importable without Airflow (CLI, services, demo, tests)."""

REAPER_DAG = "deltadrain__reaper"
REPLAY_DAG = "deltadrain__replay"
QUALITY_DAG = "deltadrain__quality"
MAINTENANCE_DAG = "deltadrain__maintenance"
# How the run ids of Airflow's tasks start (operators.deltadrain_run_id); a drain so named is followed
# by its DAG run's quality task, which is how quality.catch_up tells such batches from CLI drains.
AIRFLOW_RUN_PREFIX = "af-"


def ingest_dag_id(pipeline: str) -> str:
    return f"deltadrain__{pipeline}__ingest"


def pool_name(pipeline: str) -> str:
    return f"deltadrain_{pipeline}"


def replay_task_id(pipeline: str) -> str:
    """The replay DAG's task for one pipeline's requests: it runs in that pipeline's pool."""
    return f"replay_{pipeline}"


def replay_quality_task_id(pipeline: str) -> str:
    """The replay DAG's task that checks the batches a reprocess of that pipeline rewrote."""
    return f"quality_{pipeline}"
