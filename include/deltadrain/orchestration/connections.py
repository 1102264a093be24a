"""Airflow's connections, for the layers below that never import Airflow.

`secrets` reads AIRFLOW_CONN_<ID> itself and asks a registered store for the rest: importing
deltadrain.orchestration registers Airflow's (`use_airflow_connections`), so every Airflow process that
runs deltadrain's code (DAG processor, triggerer, task, the view) finds the connections kept in the
metadata DB or a secrets backend. Airflow itself is imported only when a connection is looked up.
"""

from __future__ import annotations

from deltadrain.errors import PrerequisiteError
from deltadrain.paths import command_line
from deltadrain.secrets import ConnectionFields, use_connection_store


def airflow_connection(conn_id: str) -> ConnectionFields | None:
    """Airflow's connection `conn_id` as its JSON form holds it, or None when Airflow has none (or
    cannot be asked: outside Airflow, without its metadata DB)."""
    from airflow.sdk import BaseHook

    try:
        conn = BaseHook.get_connection(conn_id)
    except Exception:  # not found, or no Airflow to ask: the caller names what is missing
        return None
    return {"conn_type": conn.conn_type, "host": conn.host, "port": conn.port, "schema": conn.schema,
            "login": conn.login, "password": conn.password, "extra": conn.extra_dejson}


def use_airflow_connections() -> None:
    """Make Airflow's connections the store behind `secrets` in this process."""
    use_connection_store(airflow_connection)


def connect_url(conn_id: str) -> str:
    """The Connect URL of Airflow's connection `conn_id` (the apache-spark provider's `spark_connect` type:
    host, port, User ID, Token, use_ssl), made by the provider's own hook."""
    from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

    try:
        return SparkConnectHook(conn_id=conn_id).get_connection_url()
    except Exception as exc:
        if "isn't defined" not in str(exc) and "not found" not in str(exc).lower():
            raise
        raise PrerequisiteError(
            f"Airflow has no connection '{conn_id}' (type spark_connect) to a Spark Connect server. "
            f"`{command_line('services up')}` defines it for the embedded server; for your own, add it in Airflow (host, port, and "
            "the token as its password), or set `spark.executor: submit` in the config") from None
