"""What an operator reads: the lifecycle counts (`status`), the notes that explain a state that is no
failure (`notes`), whether a source has work (`probe`), the SLA-like alerts (`alerts`), the
JVM-free reads of deltadrain's tables for the view (`tables`), and what the DAGs' tasks report to Airflow's
lineage and metrics: the datasets a task read and wrote (`lineage`), a drain's figures as metrics (`runmetrics`).
"""

__all__ = ["alerts", "lineage", "notes", "probe", "runmetrics", "status", "tables"]
