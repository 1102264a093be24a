"""Clients for a pipeline's source, with secrets resolved at the edge (never stored, never logged)."""

from __future__ import annotations

from deltadrain.config import DeltadrainConfig, KafkaSource, PipelineConfig, ValkeySource
from deltadrain.secrets import credentials


def as_text(value) -> str:
    """Valkey replies come as bytes; names and ids are compared as text."""
    return value.decode() if isinstance(value, bytes) else str(value)


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


def kafka_client_conf(cfg: DeltadrainConfig, pipeline: PipelineConfig) -> dict[str, str]:
    """librdkafka settings (confluent-kafka) for producers, admin and offset commits."""
    source = pipeline.source
    assert isinstance(source, KafkaSource)
    sec = source.security
    conf = {"bootstrap.servers": kafka_bootstrap(cfg, source), "security.protocol": sec.protocol}
    if sec.sasl_mechanism:
        creds = credentials(connection_id=sec.connection_id, username_env=sec.username_env,
                            password_env=sec.password_env)
        conf.update({"sasl.mechanism": sec.sasl_mechanism, "sasl.username": creds.username or "",
                     "sasl.password": creds.password or ""})
    if sec.ssl_ca_location:
        conf["ssl.ca.location"] = sec.ssl_ca_location
    return conf


def kafka_spark_options(cfg: DeltadrainConfig, pipeline: PipelineConfig) -> dict[str, str]:
    """The same settings for Spark's Kafka source (Java client names, JAAS for SASL)."""
    source = pipeline.source
    assert isinstance(source, KafkaSource)
    sec = source.security
    opts = {"kafka.bootstrap.servers": kafka_bootstrap(cfg, source), "kafka.security.protocol": sec.protocol}
    if sec.sasl_mechanism:
        creds = credentials(connection_id=sec.connection_id, username_env=sec.username_env,
                            password_env=sec.password_env)
        module = ("org.apache.kafka.common.security.plain.PlainLoginModule" if sec.sasl_mechanism == "PLAIN"
                  else "org.apache.kafka.common.security.scram.ScramLoginModule")
        user = (creds.username or "").replace('"', '\\"')
        pw = (creds.password or "").replace('"', '\\"')
        opts["kafka.sasl.mechanism"] = sec.sasl_mechanism
        opts["kafka.sasl.jaas.config"] = f'{module} required username="{user}" password="{pw}";'
    if sec.ssl_ca_location:
        opts["kafka.ssl.truststore.location"] = sec.ssl_ca_location
    return opts
