"""The embedded Airflow's SQLite metadata DB: how its connections wait for each other.

Every Airflow process of the embedded install (scheduler, DAG processor, API server, triggerer, task
runners, a CLI call such as `airflow backfill create`) writes the same SQLite file, one writer at a
time, so two things are set for that DB only (`embedded.airflow_env`; a user's own DB is untouched):

- `[database] sql_alchemy_connect_args` = `SQLITE_CONNECT_ARGS`. Python's driver gives up after 5 s
  of waiting for a write lock with "database is locked", which a busy 2-core machine exceeds while
  Spark runs; the call then fails although nothing is wrong.
- `[database] sql_alchemy_session_maker` = `session_maker`. Airflow's sessions are Airflow's own,
  except that a savepoint opened outside a transaction starts a *write* transaction. Python's driver
  begins a transaction only before a write, but a SAVEPOINT begins one at once, as a reader. In WAL
  mode (Airflow's setting) a reader whose snapshot another process has since written past cannot
  become a writer: its first write fails with "database is locked" at once, without waiting. That
  is what `airflow backfill create` does when it re-runs a finished interval (reads the run in a
  savepoint, then clears it), so it failed whenever the scheduler wrote in between.
"""

from __future__ import annotations

# Seconds a connection waits for another one's write lock before "database is locked".
SQLITE_LOCK_TIMEOUT = 60

SQLITE_CONNECT_ARGS = {"timeout": SQLITE_LOCK_TIMEOUT}


def begin_writing_before_savepoint(conn, name) -> None:
    """SQLAlchemy `savepoint` event: outside a transaction, take the write lock first (waiting for it)."""
    dbapi = conn.connection.dbapi_connection
    if not dbapi.in_transaction:
        dbapi.execute("BEGIN IMMEDIATE")


def session_maker(engine):
    """Airflow's default session factory (same arguments) over an engine whose savepoints write."""
    from sqlalchemy import event
    from sqlalchemy.orm import sessionmaker

    if engine.dialect.name == "sqlite":
        event.listen(engine, "savepoint", begin_writing_before_savepoint)
    return sessionmaker(engine, autocommit=False, autoflush=False, expire_on_commit=False)
