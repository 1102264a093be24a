"""Clients for a pipeline's source, with secrets resolved at the edge (never stored, never logged)."""

from __future__ import annotations

from deltadrain.config import DeltadrainConfig, KafkaSource, PipelineConfig, ValkeySource
from deltadrain.secrets import credentials


def as_text(value) -> str:
    """Valkey replies come as bytes; names and ids are compared as text."""
    return value.decode() if isinstance(value, bytes) else str(value)


def group_counts(client, stream: str, group: str) -> tuple[int, int]:
    """(lag, pending) of `group` on `stream`: entries not yet delivered to it, and entries it holds.
    Without the group (or a known lag) every entry of the stream counts as not yet delivered."""
    if not client.exists(stream):
        return 0, 0
    info = next((g for g in client.xinfo_groups(stream) if as_text(g["name"]) == group), None)
    if info is None:
        return client.xlen(stream), 0
    lag = info.get("lag")
    return (int(lag) if lag is not None else client.xlen(stream)), int(info.get("pending", 0))


def valkey_url(cfg: DeltadrainConfig, source: ValkeySource) -> str:
    if source.url:
        return source.url
    from deltadrain.services import ports

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
    from deltadrain.services import ports

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


def kafka_spark_options(cfg: DeltadrainConfig, pipeline: PipelineConfig) -> dict[str, str]:
    """The same settings for Spark's Kafka source (Java client names, JAAS for SASL)."""
    servers, sec, creds = _kafka_settings(cfg, pipeline)
    opts = {"kafka.bootstrap.servers": servers, "kafka.security.protocol": sec.protocol}
    if creds is not None:
        module = ("org.apache.kafka.common.security.plain.PlainLoginModule" if sec.sasl_mechanism == "PLAIN"
                  else "org.apache.kafka.common.security.scram.ScramLoginModule")
        user = (creds.username or "").replace('"', '\\"')
        pw = (creds.password or "").replace('"', '\\"')
        opts["kafka.sasl.mechanism"] = sec.sasl_mechanism
        opts["kafka.sasl.jaas.config"] = f'{module} required username="{user}" password="{pw}";'
    if sec.ssl_ca_location:
        # The Java client reads a PEM CA file as a truststore of type PEM (same file as librdkafka's).
        opts["kafka.ssl.truststore.type"] = "PEM"
        opts["kafka.ssl.truststore.location"] = sec.ssl_ca_location
    return opts
