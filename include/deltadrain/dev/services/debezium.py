"""The embedded change-data-capture worker (`services up --only debezium`): Kafka Connect's standalone
worker from the jar cache (jvm/debezium) running Debezium's Postgres connector, which streams the
embedded PostgreSQL's changes into the embedded Kafka broker as JSON (docs/cdc-services.md). A second
connector that writes Avro through the embedded schema registry can be added to the running worker
(`add_avro_connector`).

One process, its offsets in a file under its home: a SIGKILL loses at most the offsets of the last
flush interval, and a restart sends those changes again (Debezium is at-least-once).
"""

from __future__ import annotations

import base64
import json
import urllib.request
from typing import Any

from deltadrain.config import DeltadrainConfig
from deltadrain.config.embedded import (
    DEBEZIUM_AVRO_CONNECTOR,
    DEBEZIUM_AVRO_TOPIC_PREFIX,
    DEBEZIUM_CONNECTOR,
    DEBEZIUM_TOPIC_PREFIX,
    DEBEZIUM_USER,
    POSTGRES_DB,
    POSTGRES_PUBLICATION,
    POSTGRES_USER,
    debezium_home,
    debezium_login,
    debezium_login_file,
    debezium_url,
    ports,
    postgres_login,
    postgres_login_file,
    registry_login,
    write_private,
)
from deltadrain.dev.services.process import Service, port_open
from deltadrain.errors import ServiceError
from deltadrain.paths import command_line
from deltadrain.runtime.jars import classpath

# How often the worker writes the connector's offsets (and Debezium confirms its LSN to the slot): what a
# kill sends again at most.
OFFSET_FLUSH_MS = 1000
# The Postgres replication slot the connector reads from (kept in the database between runs).
SLOT = "deltadrain"
AVRO_SLOT = "deltadrain_avro"  # the Avro connector's: each connector reads a slot of its own
# Apicurio Registry's Kafka Connect converter (jvm/debezium): Avro, its schemas registered in the registry.
AVRO_CONVERTER = "io.apicurio.registry.utils.converter.AvroConverter"
BASIC_AUTH = "org.apache.kafka.connect.rest.basic.auth.extension"

# XML: log4j2 reads it with the JDK alone (YAML would need Jackson's YAML module on the class path).
LOG4J = """\
<Configuration>
  <Appenders>
    <Console name="STDOUT"><PatternLayout pattern="[%d] %p %m (%c)%n"/></Console>
  </Appenders>
  <Loggers>
    <Root level="WARN"><AppenderRef ref="STDOUT"/></Root>
    <Logger name="org.apache.kafka.connect.cli.ConnectStandalone" level="INFO"/>
    <!-- The snapshot, the slot and the LSN it streams from. -->
    <Logger name="io.debezium.connector.postgresql" level="INFO"/>
  </Loggers>
</Configuration>
"""


def properties(values: dict[str, str]) -> str:
    """A Java properties file of plain values (no backslashes, no line breaks: paths and names of ours)."""
    if any(ch in f"{k}{v}" for k, v in values.items() for ch in "\\\n\r"):
        raise ServiceError(f"a Kafka Connect setting holds a backslash or a line break: {sorted(values)}")
    return "".join(f"{k}={v}\n" for k, v in values.items())


def worker_properties(*, kafka_port: int, rest_port: int, offsets: str) -> dict[str, str]:
    """The standalone worker: JSON with Kafka Connect's schema/payload envelope for keys and values,
    offsets in a file, its REST API on 127.0.0.1 behind HTTP basic auth, secrets read from files by
    the config provider (so that the REST API never shows them)."""
    return {
        "bootstrap.servers": f"127.0.0.1:{kafka_port}",
        "key.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
        "key.converter.schemas.enable": "true",
        "value.converter.schemas.enable": "true",
        "offset.storage.file.filename": offsets,
        "offset.flush.interval.ms": str(OFFSET_FLUSH_MS),
        "listeners": f"http://127.0.0.1:{rest_port}",
        "rest.advertised.host.name": "127.0.0.1",
        "rest.extension.classes": f"{BASIC_AUTH}.BasicAuthSecurityRestExtension",
        "config.providers": "file",
        "config.providers.file.class": "org.apache.kafka.common.config.provider.FileConfigProvider",
        # Every plugin is on the class path and declares itself: no reflective scan of ~70 jars at start.
        "plugin.discovery": "service_load",
    }


def connector_properties(*, postgres_port: int, secrets: str, tables: list[str]) -> dict[str, str]:
    """Debezium's Postgres connector: pgoutput from the publication of every table the postgres service
    made (its role need not own the tables), `tables` (schema.table) or every table captured, one topic
    per table, `cdc.<schema>.<table>`, made by the worker as the first change arrives; the key is the
    table's primary key. Deletes are followed by a tombstone (Debezium's default)."""
    values = {
        "name": DEBEZIUM_CONNECTOR,
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "tasks.max": "1",
        "database.hostname": "127.0.0.1",
        "database.port": str(postgres_port),
        "database.user": POSTGRES_USER,
        "database.password": f"${{file:{secrets}:postgres_password}}",
        "database.dbname": POSTGRES_DB,
        "topic.prefix": DEBEZIUM_TOPIC_PREFIX,
        "plugin.name": "pgoutput",
        "slot.name": SLOT,
        "publication.name": POSTGRES_PUBLICATION,
        "publication.autocreate.mode": "disabled",
        "topic.creation.default.replication.factor": "1",
        "topic.creation.default.partitions": "1",
        # numeric as its exact text ("12.50"), not the unscaled value's bytes: plain for any JSON reader, and
        # deltadrain types it by the declared decimal column (docs/cdc.md, "Debezium's values").
        "decimal.handling.mode": "string",
    }
    if tables:
        values["table.include.list"] = ",".join(tables)
    return values


def avro_converters(*, registry_port: int, username: str, secrets: str) -> dict[str, str]:
    """`key.converter` and `value.converter` of a connector that writes Avro through the embedded registry, in
    the Confluent wire format deltadrain reads (deltadrain.formats.confluent): magic byte 0, then the schema's
    4-byte content id, which the registry's Confluent-compatible API names (`/schemas/ids/<id>`); no ids in
    headers. Each table's key and value schema is registered on its first change. The password comes from
    `secrets` through the worker's file config provider, never in the connector's config."""
    values = {}
    for side in ("key", "value"):
        c = f"{side}.converter"
        values.update({
            c: AVRO_CONVERTER,
            f"{c}.apicurio.registry.url": f"http://127.0.0.1:{registry_port}/apis/registry/v2",
            f"{c}.apicurio.auth.username": username,
            f"{c}.apicurio.auth.password": f"${{file:{secrets}:registry_password}}",
            f"{c}.apicurio.registry.auto-register": "true",
            f"{c}.apicurio.registry.find-latest": "true",
            f"{c}.apicurio.registry.as-confluent": "true",
            f"{c}.apicurio.registry.use-id": "contentId",
            f"{c}.apicurio.registry.headers.enabled": "false",
        })
    return values


def avro_connector_properties(*, postgres_port: int, registry_port: int, registry_user: str, secrets: str,
                              registry_secrets: str, tables: list[str], name: str = DEBEZIUM_AVRO_CONNECTOR,
                              slot: str = AVRO_SLOT, topic_prefix: str = DEBEZIUM_AVRO_TOPIC_PREFIX) -> dict[str, str]:
    """The Postgres connector as `connector_properties` makes it, under its own name, slot and topic prefix,
    with Avro keys and values (`avro_converters`) and numeric in Debezium's default `precise` mode: Avro's
    decimal logical type, exact."""
    values = connector_properties(postgres_port=postgres_port, secrets=secrets, tables=tables)
    del values["decimal.handling.mode"]
    values.update({"name": name, "slot.name": slot, "topic.prefix": topic_prefix})
    values.update(avro_converters(registry_port=registry_port, username=registry_user, secrets=registry_secrets))
    return values


def rest_call(cfg: DeltadrainConfig, method: str, path: str, body: dict | None = None, timeout: float = 30) -> Any:
    """A call of the worker's REST API with its login: the JSON it answers (None for an empty answer)."""
    login = debezium_login()
    token = base64.b64encode(f"{login['username']}:{login['password']}".encode()).decode()
    request = urllib.request.Request(f"{debezium_url(cfg)}{path}", method=method,
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Authorization": f"Basic {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as resp:  # our own loopback URL
        text = resp.read()
    return json.loads(text) if text else None


def add_avro_connector(cfg: DeltadrainConfig, tables: list[str], *, name: str = DEBEZIUM_AVRO_CONNECTOR,
                       slot: str = AVRO_SLOT, topic_prefix: str = DEBEZIUM_AVRO_TOPIC_PREFIX) -> str:
    """Run (or reconfigure) a connector on the running worker that writes `tables`' changes as Avro through the
    embedded registry (`avro_connector_properties`), to topics `<topic_prefix>.<schema>.<table>`; its name.
    Made through the REST API, it runs until the worker stops (`services up` starts the JSON connector
    only). The registry's login is written owner-only to a file of the worker's home, which the worker's file
    config provider reads: the REST API shows `${file:...}` where the password would be."""
    p = ports(cfg)
    home = debezium_home()
    missing = [n for n, port in (("debezium", p.debezium), ("registry", p.registry)) if not port_open(port)]
    if missing:
        raise ServiceError(f"the Avro connector writes through the embedded registry on the Debezium worker: start "
                           f"{' and '.join(missing)} first "
                           f"(`{command_line('services up --only kafka,registry,postgres,debezium', cfg.source_file)}`)")
    login = registry_login()
    registry_secrets = home / "registry-secrets.properties"
    registry_secrets.unlink(missing_ok=True)
    write_private(registry_secrets, properties({"registry_password": login["password"]}))
    values = avro_connector_properties(postgres_port=p.postgres, registry_port=p.registry,
                                       registry_user=login["username"], secrets=str(home / "secrets.properties"),
                                       registry_secrets=str(registry_secrets), tables=tables, name=name, slot=slot,
                                       topic_prefix=topic_prefix)
    rest_call(cfg, "PUT", f"/connectors/{name}/config", values)
    return name


def remove_connector(cfg: DeltadrainConfig, name: str = DEBEZIUM_AVRO_CONNECTOR) -> None:
    """Stop and remove a connector the REST API added (its replication slot stays in the database)."""
    rest_call(cfg, "DELETE", f"/connectors/{name}")


JAAS = """\
KafkaConnect {{
  {module}.PropertyFileLoginModule required
  file="{credentials}";
}};
"""


def rest_get(cfg: DeltadrainConfig, path: str, timeout: float = 3) -> Any:
    """GET on the worker's REST API with its login: the JSON it answers."""
    return rest_call(cfg, "GET", path, timeout=timeout)


def connector_running(status: dict) -> bool:
    """The connector and each of its tasks RUNNING, as /connectors/<name>/status says."""
    tasks = status.get("tasks") or []
    return (status.get("connector", {}).get("state") == "RUNNING" and bool(tasks)
            and all(t.get("state") == "RUNNING" for t in tasks))


def debezium_service(cfg: DeltadrainConfig) -> Service:
    p = ports(cfg)
    home = debezium_home()
    worker, connector, secrets = home / "worker.properties", home / "connector.properties", home / "secrets.properties"
    credentials, jaas = home / "rest-credentials.properties", home / "jaas.conf"

    def prepare() -> None:
        missing = [name for name, port in (("kafka", p.kafka), ("postgres", p.postgres)) if not port_open(port)]
        if missing or not postgres_login_file().exists():
            raise ServiceError(f"debezium reads the embedded PostgreSQL and writes into the embedded Kafka broker: "
                               f"start {' and '.join(missing) or 'postgres'} first "
                               f"(`{command_line('services up --only kafka,postgres,debezium', cfg.source_file)}`)")
        login = debezium_login()
        # The files with secrets are made anew, owner-only, on each start (a login file may be new).
        for path, text in ((secrets, properties({"postgres_password": postgres_login()["password"]})),
                           (credentials, properties({login["username"]: login["password"]}))):
            path.unlink(missing_ok=True)
            write_private(path, text)
        jaas.write_text(JAAS.format(module=BASIC_AUTH, credentials=credentials))
        worker.write_text(properties(worker_properties(kafka_port=p.kafka, rest_port=p.debezium,
                                                       offsets=str(home / "offsets.dat"))))
        connector.write_text(properties(connector_properties(postgres_port=p.postgres, secrets=str(secrets),
                                                             tables=cfg.services.debezium_tables)))
        (home / "log4j2.xml").write_text(LOG4J)

    def command() -> list[str]:
        from deltadrain.runtime.java import check_java

        cp = ":".join(str(j) for j in classpath("debezium"))
        return [check_java(), "-Xmx384m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                f"-Dlog4j2.configurationFile={home / 'log4j2.xml'}", f"-Djava.security.auth.login.config={jaas}",
                "-cp", cp, "org.apache.kafka.connect.cli.ConnectStandalone", str(worker), str(connector)]

    def healthy() -> bool:
        if not port_open(p.debezium):
            return False
        try:
            return connector_running(rest_get(cfg, f"/connectors/{DEBEZIUM_CONNECTOR}/status"))
        except (OSError, ValueError):  # starting (no connector yet: 404), or an answer that is not JSON
            return False

    return Service("debezium", home, [p.debezium], command, healthy, prepare=prepare, start_timeout=120,
                   describe=lambda: f"{debezium_url(cfg)} (Kafka Connect, connector {DEBEZIUM_CONNECTOR}, topics "
                                    f"{DEBEZIUM_TOPIC_PREFIX}.<schema>.<table>; user {DEBEZIUM_USER}, login in "
                                    f"{debezium_login_file()})")
