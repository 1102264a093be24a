"""Connect arguments for the embedded Airflow's SQLite metadata DB (`AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS`).

Every Airflow process of the embedded install (scheduler, DAG processor, API server, triggerer, task
runners, a CLI call such as `airflow backfill create`) writes the same SQLite file, one writer at a
time. Python's driver gives up after 5 s of waiting with "database is locked", which a busy 2-core
machine exceeds while Spark runs; the CLI call then fails although nothing is wrong. Waiting longer
is what a local install should do. Only used with the SQLite DB deltadrain sets up itself.
"""

# Seconds a connection waits for another one's write lock before "database is locked".
SQLITE_LOCK_TIMEOUT = 60

SQLITE_CONNECT_ARGS = {"timeout": SQLITE_LOCK_TIMEOUT}
