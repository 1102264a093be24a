"""Secrets come from environment variables or Airflow connections, never from the YAML, never logged.

A connection is read from AIRFLOW_CONN_<ID> (Airflow's JSON or URI form) without importing Airflow, then
from the store registered with `use_connection_store`: deltadrain.orchestration registers Airflow's (its
metadata DB and secrets backends) in every Airflow process that runs deltadrain's code, and so does the
CLI. A Spark driver started by spark-submit has no store: the task hands it what it needs (`handed_over`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from deltadrain.errors import ConfigError

# A connection as Airflow's JSON form holds it: conn_type, host, port, schema, login, password, extra.
ConnectionFields = dict[str, Any]
ConnectionStore = Callable[[str], "ConnectionFields | None"]

_store: ConnectionStore | None = None


@dataclass(frozen=True)
class Credentials:
    username: str | None = None
    password: str | None = field(default=None, repr=False)  # repr=False: never in a log line


def env_name(conn_id: str) -> str:
    return f"AIRFLOW_CONN_{conn_id.upper()}"


def use_connection_store(store: ConnectionStore | None) -> None:
    """Where the connections the environment lacks are looked up (None: nowhere). The store returns
    None for a connection it does not have."""
    global _store
    _store = store


def parse_connection(raw: str) -> ConnectionFields:
    """AIRFLOW_CONN_<ID>'s value, JSON or URI (`type://login:password@host:port/schema?extra=...`)."""
    if raw.lstrip().startswith("{"):
        return dict(json.loads(raw))
    parts = urlsplit(raw)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    extra = json.loads(query["__extra__"]) if "__extra__" in query else query
    return {"conn_type": parts.scheme.replace("-", "_") or None,
            "host": unquote(parts.hostname) if parts.hostname else None, "port": parts.port,
            "schema": unquote(parts.path.lstrip("/")) or None,
            "login": unquote(parts.username) if parts.username else None,
            "password": unquote(parts.password) if parts.password else None, "extra": extra}


def env_connection(conn_id: str, env: Mapping[str, str] | None = None) -> ConnectionFields | None:
    """The connection AIRFLOW_CONN_<ID> defines, or None when it is not set."""
    raw = (os.environ if env is None else env).get(env_name(conn_id))
    return parse_connection(raw) if raw else None


def stored_connection(conn_id: str) -> ConnectionFields | None:
    """The connection from the registered store, or None (no store, or not in it)."""
    return _store(conn_id) if _store is not None else None


def _as_credentials(conn: ConnectionFields | None) -> Credentials | None:
    return None if conn is None else Credentials(conn.get("login"), conn.get("password"))


def _stored_credentials(conn_id: str) -> Credentials | None:
    return _as_credentials(stored_connection(conn_id))


def credentials(*, connection_id: str | None = None, username_env: str | None = None,
                password_env: str | None = None) -> Credentials:
    if connection_id:
        found = _as_credentials(env_connection(connection_id)) or _stored_credentials(connection_id)
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


def handed_over(conn_ids: Iterable[str],
                lookup: Callable[[str], Credentials | None] = _stored_credentials) -> dict[str, str]:
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
