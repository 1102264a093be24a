"""The operator's view: a FastAPI app that Airflow's API server mounts (plugins/deltadrain_view.py).

Per pipeline: lifecycle counts (PENDING, CLAIMED, PUBLISHED, DEAD), lag, the last batches, and the
DLQ with a "Replay selected" action that triggers the replay DAG.

- `data`: what the pages show, as plain data (reads through `deltadrain.observe.tables`, delta-rs: no Spark
  JVM in the API server);
- `actions`: the replay action (selection -> replay DAG confs -> runs triggered with the caller's token);
- `runs`: what it shows of Airflow's own records (the last alerts check's task state);
- `app`: the FastAPI app (routes, authorization, templates); it imports the others, never the reverse.
"""

__all__ = ["actions", "app", "charts", "data", "runs"]
