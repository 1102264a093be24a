"""spark-submit through the apache-spark provider's hook, on a connection decided before the hook is made.

The hook reads its master (and with it how it hands env_vars over) from its connection when it is made.
So the operator decides the connection first (`spark_connection`: `local[*]` when Airflow has none, where
the provider would fall back to YARN), derives what depends on its master (`master_of`), and gives the
hook exactly that connection. The hook's output goes through the operator's watcher on its way to the log.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.sdk import BaseHook, Connection
from airflow.sdk.exceptions import AirflowNotFoundException

DEFAULT_MASTER = "local[*]"


def spark_connection(conn_id: str) -> tuple[Connection, bool]:
    """Airflow's connection `conn_id`, or one naming DEFAULT_MASTER when Airflow has none; and whether it
    was Airflow's."""
    try:
        return BaseHook.get_connection(conn_id), True
    except AirflowNotFoundException:
        return Connection(conn_id=conn_id, conn_type="spark", host=DEFAULT_MASTER), False


def master_of(conn: Connection) -> str:
    """The master a Spark connection names (the provider's connection form): the host holds the whole URL
    (`local[*]`, `yarn`, `k8s://https://host`) unless the connection type is the scheme and the host only a
    host name (a URI such as `spark://host:7077`); the port, when given, follows."""
    if conn.conn_type == "spark" and conn.host and ("://" in conn.host or not conn.port):
        master = conn.host
    else:
        master = f"{conn.conn_type}://{conn.host or ''}"
    return f"{master}:{conn.port}" if conn.port else master


def puts_env_on_command_line(master: str) -> bool:
    """Whether spark-submit gets the hook's env_vars as --conf on its command line (the YARN application
    master's and the Kubernetes driver's environment), readable by anyone on the worker; other masters
    get them in the spark-submit process's environment."""
    return "yarn" in master or "k8s" in master


class SubmitHook(SparkSubmitHook):
    """The provider's spark-submit hook on `connection` (not looked up again), passing spark-submit's
    output lines through `watch` before its own processing and logging."""

    def __init__(self, *, connection: Connection, watch: Callable[[Iterator[str]], Iterator[str]],
                 **kwargs: Any) -> None:
        # Set before the provider's __init__, which resolves the connection.
        self.submit_connection, self.watch = connection, watch
        super().__init__(**kwargs)

    def get_connection(self, conn_id: str) -> Connection:  # type: ignore[override]  # per hook, not per class
        return self.submit_connection

    def _process_spark_submit_log(self, itr: Iterator[Any]) -> None:
        super()._process_spark_submit_log(self.watch(itr))
