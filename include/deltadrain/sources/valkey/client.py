"""Valkey clients for a pipeline, with its secrets resolved at the edge (never stored, never logged),
and the counts of a consumer group that every Valkey step reads."""

from __future__ import annotations

from typing import Any

from deltadrain.config import DeltadrainConfig, PipelineConfig, ValkeySource
from deltadrain.positions import StreamId
from deltadrain.secrets import Credentials, credentials

# The field of a Valkey stream entry that holds the message's payload (what producers XADD).
VALKEY_FIELD = b"data"


def as_text(value) -> str:
    """Valkey replies come as bytes; names and ids are compared as text."""
    return value.decode() if isinstance(value, bytes) else str(value)


def stream_counts(client, stream: str, group: str) -> tuple[int, int, int]:
    """(length, lag, pending) of `group` on `stream`: the entries the stream holds, those not yet
    delivered to the group (at most), and those it holds. Without the group every entry counts as
    not yet delivered."""
    if not client.exists(stream):
        return 0, 0, 0
    info = next((g for g in client.xinfo_groups(stream) if as_text(g["name"]) == group), None)
    length = client.xlen(stream)
    if info is None:
        return length, length, 0
    pending = int(info.get("pending", 0))
    lag = info.get("lag")
    if lag is not None:
        return length, min(int(lag), length), pending  # the server's lag still counts entries trimmed since
    # The server lost count (entries deleted past the group's position): every entry left may be
    # unread, unless the newest was delivered already.
    newest = client.xrevrange(stream, count=1)
    got = StreamId.parse(as_text(info["last-delivered-id"]))
    return length, (0 if not newest or StreamId.parse(as_text(newest[0][0])) <= got else length), pending


def group_counts(client, stream: str, group: str) -> tuple[int, int]:
    """(lag, pending) of `group` on `stream` (`stream_counts` without the length)."""
    _, lag, pending = stream_counts(client, stream, group)
    return lag, pending


def valkey_url(cfg: DeltadrainConfig, source: ValkeySource) -> str:
    """The source's address as one string: its URL, or a cluster's seed URLs joined by commas."""
    return ",".join(seed_urls(cfg, source))


def seed_urls(cfg: DeltadrainConfig, source: ValkeySource) -> list[str]:
    """The URLs the config names, else the embedded server's (or, with cluster: true, the embedded
    cluster's nodes)."""
    if urls := source.seed_urls():
        return urls
    from deltadrain.config.embedded import ports, valkey_cluster_seeds

    if source.cluster:
        return valkey_cluster_seeds(cfg)
    if source.tls:
        return [f"valkeys://127.0.0.1:{ports(cfg).valkey_tls}/0"]
    return [f"valkey://127.0.0.1:{ports(cfg).valkey}/0"]


def tls_ca(source: ValkeySource) -> str | None:
    """The CA file the client trusts over TLS: the source's; unset on the embedded server's TLS port,
    the CA its certificate was made with; else None (the system's, or no TLS)."""
    if source.tls_ca_file or source.url or not source.tls:
        return source.tls_ca_file
    from deltadrain.config.embedded import valkey_ca_file

    return str(valkey_ca_file())


def connect(urls: str, cluster: bool, username: str | None, password: str | None, ca_file: str | None = None,
            **opts):
    """A client of one server (`urls` one URL) or of a Valkey Cluster (`urls` its seed URLs joined by
    commas): the cluster client sends each key's command to the primary that owns its slot, and
    follows MOVED (a slot moved, a replica promoted) and ASK (a slot migrating) redirections. Over
    TLS (valkeys://, rediss://) the server's certificate must be signed by `ca_file` (else the system's
    CAs) and name the host."""
    import valkey

    # Connection keywords: valkey-py hands them to each node's connection (typed there, not here).
    creds: dict[str, Any] = {"password": password, **({"username": username} if username and password else {})}
    if any(u.strip().startswith(("valkeys://", "rediss://")) for u in urls.split(",")):
        # valkey-py checks the chain by default, not the name: a certificate of another host would pass.
        opts["ssl_check_hostname"] = True
        if ca_file:
            opts["ssl_ca_certs"] = ca_file
    if not cluster:
        url = urls.replace("valkey://", "redis://", 1).replace("valkeys://", "rediss://", 1)
        return valkey.Valkey.from_url(url, **{k: v for k, v in creds.items() if v is not None}, **opts)
    import urllib.parse

    from valkey.cluster import ClusterNode, ValkeyCluster

    seeds = [urllib.parse.urlsplit(u) for u in urls.split(",")]
    nodes = [ClusterNode(s.hostname or "127.0.0.1", s.port or 6379) for s in seeds]
    if any(s.scheme in ("valkeys", "rediss") for s in seeds):
        opts["ssl"] = True
    opts.pop("health_check_interval", None)
    return ValkeyCluster(startup_nodes=nodes, cluster_error_retry_attempts=5, **creds, **opts)


def source_credentials(source: ValkeySource) -> Credentials:
    """The source's login, from its connection or environment variable. Two embedded servers need none
    there: the embedded Valkey's connection, when the environment does not define it (a shell's
    `deltadrain drain`), is read from the login file its first start made, which holds the same secret
    as Airflow's connection of it, without importing Airflow (a second of CPU) to ask; a source on the
    embedded cluster that names no login gets that cluster's password."""
    import os

    from deltadrain.config.embedded import (
        VALKEY_CONNECTION_ID,
        valkey_cluster_password,
        valkey_login,
        valkey_login_file,
    )
    from deltadrain.secrets import env_name

    embedded = source.url is None and not source.cluster and source.connection_id == VALKEY_CONNECTION_ID
    if embedded and not os.environ.get(env_name(VALKEY_CONNECTION_ID)) and valkey_login_file().exists():
        login = valkey_login()  # the file the server's first start made (this call makes none: it exists)
        return Credentials(login["username"], login["password"])
    creds = credentials(connection_id=source.connection_id, password_env=source.password_env)
    if source.cluster and not source.url and creds.password is None:
        return Credentials(None, valkey_cluster_password())
    return creds


def valkey_source(pipeline: PipelineConfig) -> ValkeySource:
    """The pipeline's source: the Valkey package is given only pipelines that read streams."""
    source = pipeline.source
    if not isinstance(source, ValkeySource):
        raise TypeError(f"pipeline '{pipeline.name}' reads a {source.kind} source, not Valkey streams")
    return source


def valkey_client(cfg: DeltadrainConfig, pipeline: PipelineConfig, **kwargs):
    source = valkey_source(pipeline)
    creds = source_credentials(source)
    opts = {"socket_timeout": 30, "socket_connect_timeout": 5, "health_check_interval": 30, **kwargs}
    return connect(valkey_url(cfg, source), source.cluster, creds.username, creds.password, tls_ca(source), **opts)
