"""Secrets come from environment variables or Airflow connections, never from the YAML, never logged."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

from deltadrain.errors import ConfigError


@dataclass(frozen=True)
class Credentials:
    username: str | None = None
    password: str | None = field(default=None, repr=False)  # repr=False: never in a log line


def env_name(conn_id: str) -> str:
    return f"AIRFLOW_CONN_{conn_id.upper()}"


def _from_env_connection(conn_id: str) -> Credentials | None:
    """AIRFLOW_CONN_<ID> (URI or JSON), readable without importing Airflow (Spark jobs, CLI)."""
    raw = os.environ.get(env_name(conn_id))
    if not raw:
        return None
    if raw.lstrip().startswith("{"):
        data = json.loads(raw)
        return Credentials(data.get("login"), data.get("password"))
    parts = urlsplit(raw)
    return Credentials(unquote(parts.username) if parts.username else None,
                       unquote(parts.password) if parts.password else None)


def _from_airflow(conn_id: str) -> Credentials | None:
    try:
        from airflow.sdk import BaseHook
    except ImportError:  # pragma: no cover - Airflow is always installed here, but jobs may run elsewhere
        return None
    try:
        conn = BaseHook.get_connection(conn_id)
    except Exception:
        return None
    return Credentials(conn.login, conn.password)


def credentials(*, connection_id: str | None = None, username_env: str | None = None,
                password_env: str | None = None) -> Credentials:
    if connection_id:
        found = _from_env_connection(connection_id) or _from_airflow(connection_id)
        if found is None:
            raise ConfigError(f"Airflow connection '{connection_id}' not found "
                              f"(create it in Airflow, or set {env_name(connection_id)})")
        return found
    user = os.environ.get(username_env) if username_env else None
    password = None
    if password_env:
        password = os.environ.get(password_env)
        if password is None:
            raise ConfigError(f"environment variable {password_env} (password_env) is not set")
    return Credentials(user, password)


def handed_over(conn_ids: Iterable[str], lookup: Callable[[str], Credentials | None] = _from_airflow) -> dict[str, str]:
    """AIRFLOW_CONN_<ID> variables for a job's process, which cannot ask Airflow itself (a Spark driver
    is a child of the task, and only the task may reach the metadata DB, through Airflow's supervisor):
    the connections the environment does not define already, found by `lookup`, as JSON with only the
    login and password. A connection not found is left out: the job then names it in its error."""
    out = {}
    for conn_id in sorted(set(conn_ids)):
        if os.environ.get(env_name(conn_id)):
            continue
        found = lookup(conn_id)
        if found is not None:
            out[env_name(conn_id)] = json.dumps({"conn_type": "generic", "login": found.username,
                                                 "password": found.password})
    return out
