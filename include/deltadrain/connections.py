"""Clients for a pipeline's source, with secrets resolved at the edge (never stored, never logged)."""

from __future__ import annotations

from deltadrain.config import DeltadrainConfig, KafkaSource, PipelineConfig, ValkeySource
from deltadrain.positions import StreamId
from deltadrain.secrets import credentials

# The field of a Valkey stream entry that holds the message's payload (what producers XADD).
VALKEY_FIELD = b"data"
# librdkafka's codes for "no broker answered" (as opposed to a broker that answered with an error).
KAFKA_UNREACHABLE = frozenset({"_TRANSPORT", "_ALL_BROKERS_DOWN", "_TIMED_OUT", "_RESOLVE"})
KAFKA_LOGIN_REFUSED = frozenset({"_AUTHENTICATION", "SASL_AUTHENTICATION_FAILED"})


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
    if source.url:
        return source.url
    from deltadrain.embedded import ports

    return f"valkey://127.0.0.1:{ports(cfg).valkey}/0"


def valkey_client(cfg: DeltadrainConfig, pipeline: PipelineConfig, **kwargs):
    import valkey

    source = pipeline.source
    assert isinstance(source, ValkeySource)
    creds = credentials(connection_id=source.connection_id, password_env=source.password_env)
    url = valkey_url(cfg, source).replace("valkey://", "redis://", 1).replace("valkeys://", "rediss://", 1)
    opts = {"socket_timeout": 30, "socket_connect_timeout": 5, "health_check_interval": 30, **kwargs}
    if creds.password:
        opts["password"] = creds.password
        if creds.username:
            opts["username"] = creds.username
    return valkey.Valkey.from_url(url, **opts)


def kafka_bootstrap(cfg: DeltadrainConfig, source: KafkaSource) -> str:
    if source.bootstrap_servers:
        return source.bootstrap_servers
    from deltadrain.embedded import ports

    return f"127.0.0.1:{ports(cfg).kafka}"


def _kafka_settings(cfg: DeltadrainConfig, pipeline: PipelineConfig):
    """(bootstrap servers, security settings, SASL credentials or None), shared by both clients."""
    source = pipeline.source
    assert isinstance(source, KafkaSource)
    sec = source.security
    creds = (credentials(connection_id=sec.connection_id, username_env=sec.username_env,
                         password_env=sec.password_env) if sec.sasl_mechanism else None)
    return kafka_bootstrap(cfg, source), sec, creds


def kafka_client_conf(cfg: DeltadrainConfig, pipeline: PipelineConfig) -> dict[str, str]:
    """librdkafka settings (confluent-kafka) for producers, admin and offset commits."""
    servers, sec, creds = _kafka_settings(cfg, pipeline)
    conf = {"bootstrap.servers": servers, "security.protocol": sec.protocol}
    if creds is not None:
        conf.update({"sasl.mechanism": sec.sasl_mechanism, "sasl.username": creds.username or "",
                     "sasl.password": creds.password or ""})
    if sec.ssl_ca_location:
        conf["ssl.ca.location"] = sec.ssl_ca_location
    return conf


def kafka_consumer_conf(cfg: DeltadrainConfig, pipeline: PipelineConfig) -> dict[str, str]:
    """kafka_client_conf for the clients that read offsets: the end offsets they see must be the ones
    Spark reads up to (under read_committed, the last stable offset)."""
    return {**kafka_client_conf(cfg, pipeline), "isolation.level": pipeline.source.isolation_level}


def jaas_quoted(value: str) -> str:
    """A value inside a JAAS option's double quotes: a backslash escapes the next character, so it is
    escaped first; otherwise a credential ending in one, or holding \\", ends the value early."""
    return value.replace("\\", "\\\\").replace('"', '\\"')


def kafka_spark_options(cfg: DeltadrainConfig, pipeline: PipelineConfig) -> dict[str, str]:
    """The same settings for Spark's Kafka source (Java client names, JAAS for SASL)."""
    servers, sec, creds = _kafka_settings(cfg, pipeline)
    opts = {"kafka.bootstrap.servers": servers, "kafka.security.protocol": sec.protocol,
            "kafka.isolation.level": pipeline.source.isolation_level}
    if creds is not None:
        module = ("org.apache.kafka.common.security.plain.PlainLoginModule" if sec.sasl_mechanism == "PLAIN"
                  else "org.apache.kafka.common.security.scram.ScramLoginModule")
        user, pw = jaas_quoted(creds.username or ""), jaas_quoted(creds.password or "")
        opts["kafka.sasl.mechanism"] = sec.sasl_mechanism
        opts["kafka.sasl.jaas.config"] = f'{module} required username="{user}" password="{pw}";'
    if sec.ssl_ca_location:
        # The Java client reads a PEM CA file as a truststore of type PEM (same file as librdkafka's).
        opts["kafka.ssl.truststore.type"] = "PEM"
        opts["kafka.ssl.truststore.location"] = sec.ssl_ca_location
    return opts


def _failure(exc: BaseException) -> tuple[str, bool, str] | None:
    """(source kind, whether it was a refused login, the reason) when exc or one of its causes is a
    connection failure to Valkey or Kafka."""
    for _ in range(10):
        if exc is None:
            return None
        if type(exc).__module__.startswith("valkey"):
            import valkey.exceptions as v

            if isinstance(exc, v.ConnectionError | v.TimeoutError):
                return "valkey", isinstance(exc, v.AuthenticationError), str(exc)
        if type(exc).__name__ == "KafkaException" and exc.args and hasattr(exc.args[0], "name"):
            error = exc.args[0]
            if error.name() in KAFKA_UNREACHABLE or error.name() in KAFKA_LOGIN_REFUSED:
                return "kafka", error.name() in KAFKA_LOGIN_REFUSED, f"{error.name()}: {error.str()}"
        exc = exc.__cause__ or exc.__context__
    return None


def _address(cfg: DeltadrainConfig, pipeline: PipelineConfig) -> str:
    """host:port of a pipeline's source, without anything else of its URL."""
    import urllib.parse

    source = pipeline.source
    if isinstance(source, ValkeySource):
        url = urllib.parse.urlsplit(valkey_url(cfg, source))
        return f"{url.hostname}:{url.port or 6379}"
    return kafka_bootstrap(cfg, source)


def unreachable_source(exc: BaseException, cfg: DeltadrainConfig, pipelines: list[PipelineConfig]) -> str | None:
    """A connection failure to the Valkey or Kafka of `pipelines` as one line that names the service,
    its address and the fix; None when exc is no such failure."""
    found = _failure(exc)
    if found is None:
        return None
    kind, login, reason = found
    service = {"valkey": "Valkey", "kafka": "Kafka"}[kind]
    ours = [p for p in pipelines if p.source.kind == kind] or [p for p in cfg.pipelines if p.source.kind == kind]
    field = "url" if kind == "valkey" else "bootstrap_servers"
    where = ", ".join(sorted({_address(cfg, p) for p in ours})) or "(no such pipeline)"
    names = ", ".join(f"'{p.name}'" for p in ours)
    reason = " ".join(reason.split())[:300]
    if login:
        return (f"{service} at {where} refused the login of pipeline {names} ({reason}): check the password "
                f"in the environment variable or Airflow connection that password_env/connection_id names")
    embedded = [p for p in ours if getattr(p.source, field) is None]
    fixes = []
    if embedded:
        fixes.append(f"start the embedded {service} with `deltadrain services up` (its port: services.{kind}_port "
                     f"in the config or DELTADRAIN_{kind.upper()}_PORT)")
    if len(embedded) < len(ours):
        fixes.append(f"check source.{field} of pipeline {names} in {cfg.source_file} and that the server runs")
    return f"cannot reach {service} at {where} for pipeline {names} ({reason}): " + "; or ".join(fixes)
