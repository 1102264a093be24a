"""Where a command's Spark work runs: on a Spark Connect server when one answers, else in a local driver.

`drain`, `quality`, `backfill`, `replay` and `maintain` take a session from `open_session`. A Connect
server that is up (the embedded one `services up` starts, or the one the config's `spark.connect_conn_id`
names) runs the work warm in seconds; a local driver of the command's own costs a JVM's start and a
cold first query (docs/spark-connect.md, "The command line"). `choose` is the decision, pure: the
flags, the config's `spark.executor`, the server it names and whether that server answered.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NamedTuple

from deltadrain.config import DeltadrainConfig
from deltadrain.errors import PrerequisiteError
from deltadrain.paths import command_line

__all__ = ["CONFIG_SERVER", "EMBEDDED", "Place", "choose", "configured_server", "open_session", "place_of"]

# `--remote` without a URL: the server the config names (the embedded one unless a connection says otherwise).
CONFIG_SERVER = "config"
# `--remote embedded`: the embedded server, whatever the config's connection says.
EMBEDDED = "embedded"
# How long `open_session` waits for the server's port to answer before it takes a local driver.
PROBE_TIMEOUT_S = 2.0


class Place(NamedTuple):
    """Where a command runs: `url` a Connect server's, or None for a local driver; `line` says which."""

    url: str | None
    line: str


def _address(url: str) -> str:
    from deltadrain.runtime.session import server_address

    return server_address(url)


def choose(*, local: bool, remote: str | None, executor: str, server: str | None, answers: bool,
           start_it: str, server_note: str = "") -> Place:
    """Where to run. `local`: --local given; `remote`: --remote's URL (a server the user named must be
    used, or fail); `executor`: the config's spark.executor; `server`: the URL of the server the config
    names (None: it names none that can be found, `server_note` says why); `answers`: that server's port
    answered; `start_it`: the command that starts the embedded server, for the line."""
    if local:
        return Place(None, "in a local driver (--local)")
    if remote:
        return Place(remote, f"on the Spark Connect server at {_address(remote)}")
    if executor == "submit":
        return Place(None, "in a local driver: the config's spark.executor is submit")
    if server is None:
        return Place(None, f"in a local driver: {server_note or 'no Spark Connect server configured'}")
    if answers:
        return Place(server, f"on the Spark Connect server at {_address(server)}")
    if server_note:
        return Place(None, f"in a local driver: no server answers at {_address(server)} ({server_note})")
    return Place(None, f"in a local driver: no server up — `{start_it}` starts one")


def _bare(fields: dict) -> bool:
    """A spark_connect connection with only a host and a port: its URL needs no provider code."""
    return bool(fields.get("host")) and not (fields.get("login") or fields.get("password") or fields.get("extra"))


def configured_server(cfg: DeltadrainConfig) -> tuple[str | None, str]:
    """(URL, note) of the Connect server the config names: the Airflow connection spark.connect_conn_id
    from AIRFLOW_CONN_<ID> or Airflow's store, built by the apache-spark provider's hook when it carries
    a token or TLS; without one of the default id, the embedded server (its note empty). The URL is
    None when a connection of another id is not found."""
    from deltadrain.config.embedded import SPARK_CONNECT_CONN_ID, spark_connect_url
    from deltadrain.secrets import env_connection

    conn_id = cfg.spark.connect_conn_id
    fields = env_connection(conn_id)
    if fields is None and conn_id == SPARK_CONNECT_CONN_ID:
        return spark_connect_url(cfg), ""  # `services up` gives Airflow this connection to the embedded server
    url = None
    if fields is not None and _bare(fields):
        url = f"sc://{fields['host']}:{fields.get('port') or 15002}"
    else:
        from deltadrain.orchestration.connections import connect_url

        try:
            url = connect_url(conn_id)  # Airflow's store, or a connection with a token or TLS
        except PrerequisiteError:
            return None, f"Airflow has no connection '{conn_id}' (spark.connect_conn_id)"
    return url, "" if url == spark_connect_url(cfg) else f"Airflow connection '{conn_id}'"


def place_of(args, cfg: DeltadrainConfig) -> Place:
    """Where this command runs: the flags, then the config's server, probed when it is the choice."""
    from deltadrain.config.embedded import spark_connect_url
    from deltadrain.runtime.session import server_unreachable

    local, remote = bool(getattr(args, "local", False)), getattr(args, "remote", None)
    if remote == EMBEDDED:
        remote = spark_connect_url(cfg)
    server, note, answers = None, "", False
    if not local and (remote == CONFIG_SERVER or (not remote and cfg.spark.executor == "connect")):
        server, note = configured_server(cfg)
    if remote == CONFIG_SERVER:
        if server is None:
            raise PrerequisiteError(f"--remote: {note}")
        remote = server
    elif not local and not remote and server is not None:
        answers = server_unreachable(server, timeout=PROBE_TIMEOUT_S) is None
    return choose(local=local, remote=remote, executor=cfg.spark.executor, server=server, answers=answers,
                  start_it=command_line("services up", cfg.source_file), server_note=note)


def open_session(args, cfg: DeltadrainConfig, purpose: str):
    """(a Spark session, its Place) for the command: a Connect session on the server `place_of` chose, else
    a local driver of this process's own. Says on stderr where it runs before the session starts, since
    a local driver takes seconds to start."""
    place = place_of(args, cfg)
    print(f"deltadrain: {purpose} runs {place.line}", file=sys.stderr, flush=True)
    if place.url is not None:
        from deltadrain.runtime.session import connect_session

        source = cfg.source_file if isinstance(cfg.source_file, Path) else None
        return connect_session(place.url, purpose=f"deltadrain {purpose}", config=source), place
    from deltadrain.runtime.session import get_spark

    return get_spark(f"deltadrain-{purpose.replace(' ', '-')}", cfg=cfg), place
