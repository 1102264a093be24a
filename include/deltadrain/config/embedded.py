"""Where the embedded services listen and how to log in to them: their ports, their state home, the
embedded Airflow's environment and admin login. The runtime reads these (connections default to the
embedded services' addresses; the view and the pools command act on the embedded Airflow); starting
and stopping the services is a development tool (`deltadrain.dev.services`).
"""

from __future__ import annotations

import json
import os
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path

from deltadrain.config import DeltadrainConfig, ServicesConfig
from deltadrain.errors import ServiceError
from deltadrain.paths import PROJECT_ROOT, config_path, state_home


@dataclass(frozen=True)
class Ports:
    valkey: int
    kafka: int
    kafka_controller: int
    kafka_sasl: int
    airflow: int
    spark_connect: int
    s3: int
    spark_cluster: int
    spark_cluster_ui: int
    valkey_cluster: int = 16400
    valkey_tls: int = 6398
    registry: int = 18081
    postgres: int = 15432
    debezium: int = 18083

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
            valkey_tls=pick("DELTADRAIN_VALKEY_TLS_PORT", services.valkey_tls_port),
            kafka=pick("DELTADRAIN_KAFKA_PORT", services.kafka_port),
            kafka_controller=pick("DELTADRAIN_KAFKA_CONTROLLER_PORT", services.kafka_controller_port),
            kafka_sasl=pick("DELTADRAIN_KAFKA_SASL_PORT", services.kafka_sasl_port),
            airflow=pick("DELTADRAIN_AIRFLOW_PORT", services.airflow_port),
            spark_connect=pick("DELTADRAIN_SPARK_CONNECT_PORT", services.spark_connect_port),
            s3=pick("DELTADRAIN_S3_PORT", services.s3_port),
            valkey_cluster=pick("DELTADRAIN_VALKEY_CLUSTER_PORT", services.valkey_cluster_port),
            spark_cluster=pick("DELTADRAIN_SPARK_CLUSTER_PORT", services.spark_cluster_port),
            spark_cluster_ui=pick("DELTADRAIN_SPARK_CLUSTER_UI_PORT", services.spark_cluster_ui_port),
            registry=pick("DELTADRAIN_REGISTRY_PORT", services.registry_port),
            postgres=pick("DELTADRAIN_POSTGRES_PORT", services.postgres_port),
            debezium=pick("DELTADRAIN_DEBEZIUM_PORT", services.debezium_port),
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


# The Airflow connection (the apache-spark provider's `spark_connect` type) to the embedded Connect server.
SPARK_CONNECT_CONN_ID = "spark_connect"


def spark_connect_url(cfg: DeltadrainConfig) -> str:
    """The embedded Spark Connect server's address, as a Connect client takes it."""
    return f"sc://127.0.0.1:{ports(cfg).spark_connect}"


def spark_connect_connection(cfg: DeltadrainConfig) -> dict:
    """The Airflow connection to the embedded Connect server, in the provider's fields: host and port.
    No login (User ID) and no password (Token): it listens on 127.0.0.1 only, without TLS (use_ssl unset)."""
    return {"conn_type": "spark_connect", "host": "127.0.0.1", "port": ports(cfg).spark_connect,
            "description": "the embedded Spark Connect server (deltadrain services)"}


def services_home() -> Path:
    return state_home() / "services"


def airflow_home() -> Path:
    return services_home() / "airflow"


def airflow_shim_dir() -> Path:
    """Where `services up` puts the `airflow` that `airflow standalone` starts its components through."""
    return airflow_home() / "bin"


def airflow_password_file() -> Path:
    return airflow_home() / "simple_auth_manager_passwords.json.generated"


def s3_home() -> Path:
    return services_home() / "s3"


def s3_login_file() -> Path:
    """The embedded S3 server's access key and secret (JSON), made by its first start, owner-only."""
    return s3_home() / "login.json"


def valkey_home() -> Path:
    return services_home() / "valkey"


def valkey_login_file() -> Path:
    """The embedded Valkey's logins (JSON): the drains' user and an admin for the services' own checks
    and an operator's repairs. Made once, owner-only, before the server's first start."""
    return valkey_home() / "login.json"


def valkey_tls_home() -> Path:
    return services_home() / "valkey_tls"


def valkey_ca_file() -> Path:
    """The CA (PEM) that signed the certificate of the embedded Valkey's TLS port (`services up --only
    valkey_tls`), made with it on its first start."""
    return valkey_tls_home() / "ca.pem"


# The ACL user the drains log in as, and the Airflow connection that names it.
VALKEY_USER = "deltadrain"
VALKEY_CONNECTION_ID = "deltadrain_valkey"


def private_login(path: Path, username: str, *secret_names: str) -> dict:
    """The login kept at `path` (JSON, owner-only), made on the first call: `username` and a new random
    secret under each of `secret_names`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_private(path, json.dumps({"username": username, **{n: secrets.token_urlsafe(24) for n in secret_names}}))
    return json.loads(path.read_text())


def valkey_login() -> dict:
    """The embedded Valkey's logins, made on the first call: {"username", "password", "admin_password"}."""
    return private_login(valkey_login_file(), VALKEY_USER, "password", "admin_password")


def valkey_connection(cfg: DeltadrainConfig) -> dict:
    """The embedded Valkey as an Airflow connection: the drains' user, never the admin."""
    login = valkey_login()
    return {"conn_type": "generic", "host": "127.0.0.1", "port": ports(cfg).valkey, "login": login["username"],
            "password": login["password"], "description": "the embedded Valkey (deltadrain services)"}


def kafka_home() -> Path:
    return services_home() / "kafka"


def kafka_login_file() -> Path:
    """The embedded broker's SCRAM login and its keystore's password (JSON), owner-only."""
    return kafka_home() / "login.json"


def kafka_ca_file() -> Path:
    """The CA (PEM) that signed the embedded broker's certificate, made with its keystore by keytool."""
    return kafka_home() / "tls" / "ca.pem"


# The SCRAM user the drains log in as on the SASL_SSL listener, and the Airflow connection that names it.
KAFKA_USER = "deltadrain"
KAFKA_CONNECTION_ID = "deltadrain_kafka"


def kafka_login() -> dict:
    """The embedded broker's logins, made on the first call: {"username", "password", "keystore_password"}."""
    return private_login(kafka_login_file(), KAFKA_USER, "password", "keystore_password")


def kafka_connection() -> dict:
    """The embedded broker's SCRAM-SHA-512 user as an Airflow connection (its SASL_SSL listener)."""
    login = kafka_login()
    return {"conn_type": "generic", "login": login["username"], "password": login["password"],
            "description": "the embedded Kafka broker's SASL_SSL listener (deltadrain services)"}


# The bucket the embedded S3 server starts with.
S3_BUCKET = "deltadrain"
# The Airflow connection (type aws) deltadrain reads the object store's endpoint and login from.
S3_CONNECTION_ID = "deltadrain_s3"


def s3_connection(cfg: DeltadrainConfig) -> dict | None:
    """The embedded S3 server as an Airflow connection (type aws, endpoint in extra), None before its
    first start made a login."""
    try:
        login = json.loads(s3_login_file().read_text())
    except (FileNotFoundError, ValueError):
        return None
    return {"conn_type": "aws", "login": login["access_key_id"], "password": login["secret_access_key"],
            "extra": {"endpoint_url": f"http://127.0.0.1:{ports(cfg).s3}", "region_name": "us-east-1"}}


def registry_home() -> Path:
    return services_home() / "registry"


def registry_login_file() -> Path:
    """The embedded schema registry's login (JSON), made before its first start, owner-only."""
    return registry_home() / "login.json"


# The user the embedded registry knows (its build's configuration names it), and the Airflow connection
# that holds its login; a pipeline names it in schema.registry.connection_id.
REGISTRY_USER = "deltadrain"
REGISTRY_CONNECTION_ID = "deltadrain_registry"


def registry_login() -> dict:
    """The embedded registry's login, made on the first call: {"username", "password"}."""
    return private_login(registry_login_file(), REGISTRY_USER, "password")


def registry_url(cfg: DeltadrainConfig) -> str:
    """The embedded registry's Confluent-compatible API: a pipeline's schema.registry.url."""
    return f"http://127.0.0.1:{ports(cfg).registry}/apis/ccompat/v7"


def registry_connection(cfg: DeltadrainConfig) -> dict:
    """The embedded registry as an Airflow connection: its API's address and the login."""
    login = registry_login()
    return {"conn_type": "http", "host": registry_url(cfg), "login": login["username"],
            "password": login["password"], "description": "the embedded schema registry (deltadrain services)"}


def postgres_home() -> Path:
    return services_home() / "postgres"


def postgres_login_file() -> Path:
    """The embedded PostgreSQL's logins (JSON): the deltadrain role, and the superuser's password for the
    services' own setup and an operator's repairs. Made once, owner-only, before its first start."""
    return postgres_home() / "login.json"


# The embedded PostgreSQL's role and database (the role owns it), and the publication of all its tables
# that the change-data-capture connector reads (docs/cdc-services.md).
POSTGRES_USER = "deltadrain"
POSTGRES_DB = "deltadrain"
POSTGRES_PUBLICATION = "deltadrain"


def postgres_login() -> dict:
    """The embedded PostgreSQL's logins, made on the first call: {"username", "password", "admin_password"}
    (the superuser is `postgres`)."""
    return private_login(postgres_login_file(), POSTGRES_USER, "password", "admin_password")


def postgres_conninfo(cfg: DeltadrainConfig, *, admin: bool = False, dbname: str = POSTGRES_DB) -> dict:
    """How to connect to the embedded PostgreSQL (`psycopg.connect(**conninfo)`), as the deltadrain role or
    as its superuser. It holds the password: keep it out of logs."""
    login = postgres_login()
    user, password = ("postgres", login["admin_password"]) if admin else (login["username"], login["password"])
    return {"host": "127.0.0.1", "port": ports(cfg).postgres, "dbname": dbname, "user": user, "password": password,
            "connect_timeout": 3}


def debezium_home() -> Path:
    return services_home() / "debezium"


def debezium_login_file() -> Path:
    """The login of the Debezium worker's REST API (JSON), made before its first start, owner-only."""
    return debezium_home() / "login.json"


DEBEZIUM_USER = "deltadrain"
# The connector's name in the worker, and the prefix of its topics: `cdc.<schema>.<table>`.
DEBEZIUM_CONNECTOR = "postgres"
DEBEZIUM_TOPIC_PREFIX = "cdc"
# The connector that writes Avro through the embedded registry (dev.services.debezium.add_avro_connector), on
# the same worker with its own replication slot, and the prefix of its topics: `cdcavro.<schema>.<table>`.
DEBEZIUM_AVRO_CONNECTOR = "postgres_avro"
DEBEZIUM_AVRO_TOPIC_PREFIX = "cdcavro"


def debezium_login() -> dict:
    """The Debezium worker's REST login, made on the first call: {"username", "password"}."""
    return private_login(debezium_login_file(), DEBEZIUM_USER, "password")


def debezium_url(cfg: DeltadrainConfig) -> str:
    """Kafka Connect's REST API of the embedded Debezium worker."""
    return f"http://127.0.0.1:{ports(cfg).debezium}"


def debezium_topic(table: str) -> str:
    """The topic the embedded connector writes a table's changes to: `schema.table` -> `cdc.schema.table`."""
    return f"{DEBEZIUM_TOPIC_PREFIX}.{table}"


# Seconds a task's call to the embedded API server may take: more than its SQLite lock wait (60 s).
EXECUTION_API_TIMEOUT_S = 65


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
        # standalone starts its components as `airflow ...` by name: our bin/ must come first, after
        # the shim that keeps their log servers off (dev.services.airflow_shim).
        "PATH": os.pathsep.join([str(airflow_shim_dir()), bindir, os.environ.get("PATH", "")]),
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(PROJECT_ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(PROJECT_ROOT / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        # LocalExecutor starts this many worker processes (Airflow's default is 32): size it to the machine.
        "AIRFLOW__CORE__PARALLELISM": str(cfg.services.airflow_parallelism),
        # A read-only user too: what it may see and not do (the view's replay action) is Airflow's to say.
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin,viewer:viewer",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(airflow_password_file()),
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        "AIRFLOW__API_AUTH__JWT_SECRET": secret_file.read_text().strip(),
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "30",
        "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
        # A task's calls to the API server wait longer than the API server may wait for the SQLite DB's write lock
        # (orchestration.airflow_db): after Airflow's 5 s a busy 2-core machine's task runner gave up and killed
        # a task the DB was only slow for.
        "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": str(EXECUTION_API_TIMEOUT_S),
        "DELTADRAIN_HOME": str(state_home()),
        "DELTADRAIN_CONFIG": str(cfg.source_file or config_path()),
    }
    if "AIRFLOW_CONN_SPARK_DEFAULT" not in os.environ:
        # The ingest DAG's spark-submit runs locally unless the user points spark_default elsewhere.
        env["AIRFLOW_CONN_SPARK_DEFAULT"] = json.dumps({"conn_type": "spark", "host": "local[*]"})
    conn_var = f"AIRFLOW_CONN_{SPARK_CONNECT_CONN_ID.upper()}"
    if conn_var not in os.environ:
        # A user's own connection of this id (another server, a token) wins over the embedded server's.
        env[conn_var] = json.dumps(spark_connect_connection(cfg))
    conn = f"AIRFLOW_CONN_{VALKEY_CONNECTION_ID.upper()}"
    if conn not in os.environ:
        # The example config's Valkey pipeline logs in through this connection (the login is made now
        # if the server has not started yet: it reads the same file).
        env[conn] = json.dumps(valkey_connection(cfg))
    conn = f"AIRFLOW_CONN_{KAFKA_CONNECTION_ID.upper()}"
    if conn not in os.environ:
        env[conn] = json.dumps(kafka_connection())
    conn = f"AIRFLOW_CONN_{REGISTRY_CONNECTION_ID.upper()}"
    if conn not in os.environ:
        env[conn] = json.dumps(registry_connection(cfg))
    conn = f"AIRFLOW_CONN_{S3_CONNECTION_ID.upper()}"
    if conn not in os.environ and (s3 := s3_connection(cfg)) is not None:
        # The embedded S3 server, once `services up --only s3` made its login: start it before Airflow.
        env[conn] = json.dumps(s3)
    if "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN" not in os.environ:
        env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = f"sqlite:///{home / 'airflow.db'}"
        # Wait for another process's write lock instead of failing after SQLite's 5 s, and let a
        # savepoint that will write hold the write lock from its start (see orchestration.airflow_db).
        for key, value in (("SQL_ALCHEMY_CONNECT_ARGS", "SQLITE_CONNECT_ARGS"),
                           ("SQL_ALCHEMY_CONNECT_ARGS_ASYNC", "SQLITE_CONNECT_ARGS"),
                           ("SQL_ALCHEMY_SESSION_MAKER", "session_maker")):
            if f"AIRFLOW__DATABASE__{key}" not in os.environ:
                env[f"AIRFLOW__DATABASE__{key}"] = f"deltadrain.orchestration.airflow_db.{value}"
    return env


def airflow_login() -> tuple[str, str | None]:
    try:
        return "admin", json.loads(airflow_password_file().read_text()).get("admin")
    except (FileNotFoundError, ValueError):
        return "admin", None


# The embedded Valkey Cluster (`services up --only valkey_cluster`): three primaries, three replicas.
VALKEY_CLUSTER_PRIMARIES = 3
VALKEY_CLUSTER_NODES = 6


def valkey_cluster_home() -> Path:
    return services_home() / "valkey_cluster"


def valkey_cluster_login_file() -> Path:
    """The embedded Valkey Cluster's password (JSON), made by its first start, owner-only."""
    return valkey_cluster_home() / "login.json"


def valkey_cluster_password() -> str | None:
    """The embedded Valkey Cluster's password, None before its first start made one."""
    try:
        return json.loads(valkey_cluster_login_file().read_text())["password"]
    except (FileNotFoundError, ValueError, KeyError):
        return None


def valkey_cluster_ports(cfg: DeltadrainConfig) -> list[int]:
    """The client ports of the embedded cluster's nodes; node i's cluster bus is on port i + 6."""
    base = ports(cfg).valkey_cluster
    return [base + i for i in range(VALKEY_CLUSTER_NODES)]


def valkey_cluster_seeds(cfg: DeltadrainConfig) -> list[str]:
    """Seed URLs of the embedded cluster: every node, so that a client finds it with any one down."""
    return [f"valkey://127.0.0.1:{port}" for port in valkey_cluster_ports(cfg)]


def spark_cluster_home() -> Path:
    return services_home() / "spark_cluster"


def spark_cluster_url(cfg: DeltadrainConfig) -> str:
    """The embedded Spark standalone master, as a Spark master URL (`services up --only spark_cluster`)."""
    return f"spark://127.0.0.1:{ports(cfg).spark_cluster}"


def spark_cluster_secret_file() -> Path:
    """The shared secret of the embedded Spark cluster (Spark's spark.authenticate), owner-only."""
    return spark_cluster_home() / "secret"


def spark_cluster_auth_conf(master: str, cfg: DeltadrainConfig | None = None) -> dict[str, str]:
    """The Spark confs a driver needs to join the embedded Spark cluster when `master` is it: its secret.
    Empty for any other master (a user's cluster brings its own auth settings)."""
    from deltadrain.config import load_config

    cfg = cfg or load_config()
    if master != spark_cluster_url(cfg) or not spark_cluster_secret_file().exists():
        return {}
    return {"spark.authenticate": "true", "spark.authenticate.secret": spark_cluster_secret_file().read_text().strip()}
