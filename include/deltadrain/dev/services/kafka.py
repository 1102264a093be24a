"""The embedded KRaft Kafka broker: its keystore, SCRAM user and ACLs, and the service that runs it
from the jar cache (deltadrain.dev.services)."""

from __future__ import annotations

import base64
import os
import subprocess
import uuid
from pathlib import Path

from deltadrain.config import DeltadrainConfig
from deltadrain.config.embedded import (
    KAFKA_USER,
    kafka_ca_file,
    kafka_home,
    kafka_login,
    ports,
    write_private,
)
from deltadrain.dev.services.process import Service, port_open
from deltadrain.errors import ServiceError
from deltadrain.runtime.jars import classpath

KAFKA_PROPERTIES = """\
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:{controller}
listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller},SASL_SSL://127.0.0.1:{sasl}
advertised.listeners=PLAINTEXT://127.0.0.1:{port},SASL_SSL://127.0.0.1:{sasl}
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_SSL:SASL_SSL
sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
ssl.keystore.type=PKCS12
ssl.keystore.location={keystore}
ssl.keystore.password={keystore_password}
ssl.key.password={keystore_password}
inter.broker.listener.name=PLAINTEXT
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
# No login on the PLAINTEXT and CONTROLLER listeners (loopback only): their principal, ANONYMOUS, is the
# broker's own and the admin's. SASL_SSL users get what their ACLs grant, and no ACL means no access.
super.users=User:ANONYMOUS
allow.everyone.if.no.acl.found=false
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
# A development broker's load is a few clients: Kafka's thread pools are sized for a server's, and each
# idle thread still wakes several times a second.
num.io.threads=2
num.network.threads=1
background.threads=2
num.recovery.threads.per.data.dir=1
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
      # A denied request, with its principal, operation and resource (what ACL a user lacks).
      - name: kafka.authorizer.logger
        level: INFO
"""


def kafka_cluster_id() -> str:
    """A KRaft cluster id: a URL-safe base64 UUID that does not start with '-' (the storage tool
    would read such an id as an option, one format in 64 would fail)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


# The embedded broker's certificate: for the address it listens on, signed by a CA of its own.
TLS_NAMES = "SAN=ip:127.0.0.1,dns:localhost"
TLS_DAYS = "3650"


def make_broker_keystore(tls: Path, password: str) -> None:
    """A CA and the broker's key and certificate (signed by it) in PKCS12 keystores under `tls`, and
    the CA as ca.pem for the clients, with the JDK's keytool. The password reaches keytool in its
    environment, never on its command line. Made once: kept while broker.p12 exists."""
    from deltadrain.runtime.session import check_java

    if (tls / "broker.p12").exists():
        return
    keytool = str(Path(check_java()).parent / "keytool")
    tls.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "DD_KEYSTORE_PASSWORD": password}
    for name in ("ca.p12", "broker.p12.tmp", "broker.csr", "broker.pem", "ca.pem"):
        (tls / name).unlink(missing_ok=True)

    def keytool_run(*args: str) -> None:
        done = subprocess.run([keytool, *args], cwd=tls, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise ServiceError(f"keytool {args[0]} for the Kafka broker's certificate in {tls} failed: "
                               f"{(done.stdout + done.stderr).strip()[:500]}")

    store = ("-storetype", "PKCS12", "-storepass:env", "DD_KEYSTORE_PASSWORD")
    keytool_run("-genkeypair", "-alias", "ca", "-keyalg", "RSA", "-keysize", "2048", "-dname", "CN=deltadrain embedded CA",
                "-ext", "bc:c", "-validity", TLS_DAYS, "-keystore", "ca.p12", *store)
    keytool_run("-exportcert", "-rfc", "-alias", "ca", "-file", "ca.pem", "-keystore", "ca.p12", *store)
    keytool_run("-genkeypair", "-alias", "broker", "-keyalg", "RSA", "-keysize", "2048", "-dname", "CN=localhost",
                "-ext", TLS_NAMES, "-validity", TLS_DAYS, "-keystore", "broker.p12.tmp", *store)
    keytool_run("-certreq", "-alias", "broker", "-file", "broker.csr", "-keystore", "broker.p12.tmp", *store)
    keytool_run("-gencert", "-alias", "ca", "-infile", "broker.csr", "-outfile", "broker.pem", "-rfc", "-ext", TLS_NAMES,
                "-validity", TLS_DAYS, "-keystore", "ca.p12", *store)
    keytool_run("-importcert", "-noprompt", "-alias", "ca", "-file", "ca.pem", "-keystore", "broker.p12.tmp", *store)
    keytool_run("-importcert", "-alias", "broker", "-file", "broker.pem", "-keystore", "broker.p12.tmp", *store)
    for name in ("ca.p12", "broker.p12.tmp"):
        os.chmod(tls / name, 0o600)
    os.replace(tls / "broker.p12.tmp", tls / "broker.p12")


def ensure_scram_user(bootstrap: str, login: dict, timeout_s: float = 30) -> None:
    """The broker's SCRAM-SHA-512 user and its ACLs, set through the admin API on the PLAINTEXT listener
    (the password never on a command line); waits until the broker knows the user."""
    import time

    from confluent_kafka.admin import (
        AdminClient,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialUpsertion,
    )

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})

    def known() -> bool:
        try:
            futures = admin.describe_user_scram_credentials([login["username"]], request_timeout=5)
            return isinstance(futures, dict) and all(f.result() for f in futures.values())  # one per user named
        except Exception:  # RESOURCE_NOT_FOUND: not set (or not applied) yet
            return False

    if known():
        return ensure_drain_acls(admin, login["username"], timeout_s)
    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192)
    upsert = UserScramCredentialUpsertion(login["username"], info, login["password"].encode())
    for future in admin.alter_user_scram_credentials([upsert], request_timeout=timeout_s).values():
        future.result()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if known():
            return ensure_drain_acls(admin, login["username"], timeout_s)
        time.sleep(0.3)
    raise ServiceError(f"the Kafka broker did not take the SCRAM user {login['username']} within {timeout_s:.0f} s")


def ensure_drain_acls(admin, user: str, timeout_s: float = 30) -> None:
    """The ACLs a drain needs (sources.kafka.acl) for the broker's SCRAM user, on every topic and group;
    creating one that exists changes nothing."""
    from deltadrain.sources.kafka.acl import acl_bindings

    for future in admin.create_acls(acl_bindings(user), request_timeout=timeout_s).values():
        future.result()


def kafka_service(cfg: DeltadrainConfig) -> Service:
    p = ports(cfg)
    home = kafka_home()
    props = home / "server.properties"
    data = home / "data"

    def java_cmd(main: str, *args: str) -> list[str]:
        from deltadrain.runtime.session import check_java

        java = check_java()
        cp = ":".join(str(j) for j in classpath("kafka"))
        # C1 only, as the registry's and Debezium's JVMs: a development broker's load is small, and C2's
        # compiler threads used most of its CPU.
        return [java, f"-Xmx{cfg.services.kafka_heap}", "-XX:+UseG1GC", "-XX:TieredStopAtLevel=1",
                f"-Dlog4j2.configurationFile={home / 'log4j2.yaml'}", "-cp", cp, main, *args]

    def prepare() -> None:
        data.mkdir(parents=True, exist_ok=True)
        login = kafka_login()
        make_broker_keystore(home / "tls", login["keystore_password"])
        # The properties hold the keystore's password: made anew, owner-only, on each start.
        props.unlink(missing_ok=True)
        write_private(props, KAFKA_PROPERTIES.format(port=p.kafka, controller=p.kafka_controller, sasl=p.kafka_sasl,
                                                     data=data, keystore=home / "tls" / "broker.p12",
                                                     keystore_password=login["keystore_password"]))
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
        if not md.brokers:
            return False
        # The SCRAM user lives in the cluster's metadata: set on each start (the login file may be new).
        ensure_scram_user(f"127.0.0.1:{p.kafka}", kafka_login())
        return port_open(p.kafka_sasl)

    return Service("kafka", home, [p.kafka, p.kafka_controller, p.kafka_sasl],
                   lambda: java_cmd("kafka.Kafka", str(props)), healthy, prepare=prepare, start_timeout=90,
                   describe=lambda: f"127.0.0.1:{p.kafka}, SASL_SSL 127.0.0.1:{p.kafka_sasl} (user {KAFKA_USER}, "
                                    f"CA {kafka_ca_file()})")


