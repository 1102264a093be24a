"""Kafka client settings for a pipeline (librdkafka's and Spark's Kafka source's), with its secrets
resolved at the edge (never stored, never logged)."""

from __future__ import annotations

import json

from deltadrain.config import DeltadrainConfig, KafkaSource, PipelineConfig
from deltadrain.errors import ConfigError
from deltadrain.secrets import Credentials, credentials


def kafka_source(pipeline: PipelineConfig) -> KafkaSource:
    """The pipeline's source: the Kafka package is given only pipelines that read a topic."""
    source = pipeline.source
    if not isinstance(source, KafkaSource):
        raise TypeError(f"pipeline '{pipeline.name}' reads a {source.kind} source, not a Kafka topic")
    return source


def kafka_bootstrap(cfg: DeltadrainConfig, source: KafkaSource) -> str:
    """The source's servers; unset: the embedded broker's listener for its protocol (SASL_SSL or PLAINTEXT)."""
    if source.bootstrap_servers:
        return source.bootstrap_servers
    from deltadrain.config.embedded import ports

    p = ports(cfg)
    return f"127.0.0.1:{p.kafka_sasl if source.security.protocol == 'SASL_SSL' else p.kafka}"


def kafka_ca(source: KafkaSource) -> str | None:
    """The CA file the client trusts: the source's; unset on the embedded broker's SASL_SSL listener,
    the CA its keystore was made with; else None (the system's)."""
    if source.security.ssl_ca_location or source.bootstrap_servers or source.security.protocol != "SASL_SSL":
        return source.security.ssl_ca_location
    from deltadrain.config.embedded import kafka_ca_file

    return str(kafka_ca_file())


def _kafka_settings(cfg: DeltadrainConfig, pipeline: PipelineConfig):
    """(bootstrap servers, security settings, SASL credentials or None), shared by both clients."""
    source = kafka_source(pipeline)
    sec = source.security
    creds = sasl_credentials(source) if sec.sasl_mechanism else None
    return kafka_bootstrap(cfg, source), sec, creds


def sasl_credentials(source: KafkaSource) -> Credentials:
    """The SASL login. The embedded broker's connection, when neither the environment nor Airflow has
    it (a shell's `deltadrain drain`), is read from the login file its first start made."""
    from deltadrain.config.embedded import KAFKA_CONNECTION_ID, kafka_login_file

    sec = source.security
    try:
        return credentials(connection_id=sec.connection_id, username_env=sec.username_env,
                           password_env=sec.password_env)
    except ConfigError:
        if source.bootstrap_servers or sec.connection_id != KAFKA_CONNECTION_ID or not kafka_login_file().exists():
            raise
    login = json.loads(kafka_login_file().read_text())
    return Credentials(login["username"], login["password"])


def kafka_client_conf(cfg: DeltadrainConfig, pipeline: PipelineConfig) -> dict[str, str]:
    """librdkafka settings (confluent-kafka) for producers, admin and offset commits."""
    servers, sec, creds = _kafka_settings(cfg, pipeline)
    conf = {"bootstrap.servers": servers, "security.protocol": sec.protocol}
    if creds is not None:
        conf.update({"sasl.mechanism": sec.sasl_mechanism, "sasl.username": creds.username or "",
                     "sasl.password": creds.password or ""})
    if ca := kafka_ca(kafka_source(pipeline)):
        conf["ssl.ca.location"] = ca
    return conf


def kafka_consumer_conf(cfg: DeltadrainConfig, pipeline: PipelineConfig) -> dict[str, str]:
    """kafka_client_conf for the clients that read offsets: the end offsets they see must be the ones
    Spark reads up to (under read_committed, the last stable offset)."""
    return {**kafka_client_conf(cfg, pipeline), "isolation.level": kafka_source(pipeline).isolation_level}


def split_servers(servers: str) -> list[tuple[str, int]]:
    """`host:port,host:port` (a bracketed IPv6 host too) as (host, port) pairs; 9092 when no port (pure)."""
    out = []
    for item in filter(None, (s.strip() for s in servers.split(","))):
        host, sep, port = item.rpartition(":")
        if not sep or not port.isdigit() or (host.count(":") and not host.startswith("[")):
            host, port = item, "9092"
        out.append((host.strip("[]"), int(port)))
    return out


def check_reachable(servers: str, timeout_s: float = 2.0) -> None:
    """Raise librdkafka's transport failure at once when no bootstrap server accepts a TCP connection:
    its own clients try again until their timeout, and a down broker would cost a page or `status`
    that long before it is named."""
    import socket

    from confluent_kafka import KafkaError, KafkaException

    refused = []
    for host, port in split_servers(servers):
        try:
            socket.create_connection((host, port), timeout=timeout_s).close()
            return
        except OSError as exc:
            refused.append(f"{host}:{port}: {exc.strerror or type(exc).__name__}")
    raise KafkaException(KafkaError(KafkaError._TRANSPORT, reason=f"no bootstrap server accepts connections "
                                                                  f"({'; '.join(refused)})"))


def check_secured(conf: dict, timeout_s: float = 15) -> None:
    """Over TLS or SASL, ask the broker once before anything else: librdkafka's own calls only say
    "transport failure" when the login is refused or the certificate untrusted, and say why only to
    an error callback. Raises that error (_AUTHENTICATION, or _SSL for a certificate) instead."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient

    if conf.get("security.protocol", "PLAINTEXT") == "PLAINTEXT":
        return
    said: list = []
    admin = AdminClient({**{k: v for k, v in conf.items() if k != "isolation.level"}, "log_level": 0},
                        error_cb=said.append)
    try:
        admin.list_topics(timeout=timeout_s)
        return
    except KafkaException:
        admin.poll(0.5)  # serves the error callback
        for error in said:
            if error.code() == KafkaError._AUTHENTICATION:
                raise KafkaException(KafkaError(KafkaError._AUTHENTICATION, reason=error.str())) from None
            if "certificate verify failed" in error.str() or "SSL" in error.str():
                raise KafkaException(KafkaError(KafkaError._SSL, reason=error.str())) from None
        raise


def jaas_quoted(value: str) -> str:
    """A value inside a JAAS option's double quotes: a backslash escapes the next character, so it is
    escaped first; otherwise a credential ending in one, or holding \\", ends the value early."""
    return value.replace("\\", "\\\\").replace('"', '\\"')


def kafka_spark_options(cfg: DeltadrainConfig, pipeline: PipelineConfig) -> dict[str, str]:
    """The same settings for Spark's Kafka source (Java client names, JAAS for SASL)."""
    servers, sec, creds = _kafka_settings(cfg, pipeline)
    opts = {"kafka.bootstrap.servers": servers, "kafka.security.protocol": sec.protocol,
            "kafka.isolation.level": kafka_source(pipeline).isolation_level}
    if creds is not None:
        module = ("org.apache.kafka.common.security.plain.PlainLoginModule" if sec.sasl_mechanism == "PLAIN"
                  else "org.apache.kafka.common.security.scram.ScramLoginModule")
        user, pw = jaas_quoted(creds.username or ""), jaas_quoted(creds.password or "")
        opts["kafka.sasl.mechanism"] = sec.sasl_mechanism
        opts["kafka.sasl.jaas.config"] = f'{module} required username="{user}" password="{pw}";'
    if ca := kafka_ca(kafka_source(pipeline)):
        # The Java client reads a PEM CA file as a truststore of type PEM (same file as librdkafka's).
        opts["kafka.ssl.truststore.type"] = "PEM"
        opts["kafka.ssl.truststore.location"] = ca
    return opts
