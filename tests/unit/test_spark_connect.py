"""The Spark Connect server's command line, its port, the Airflow connection to it and a client session's
conf: built, never started (tests/integration/test_spark_connect.py starts the server)."""

from __future__ import annotations

import json
import sys

import pytest

from deltadrain.config import load_config
from deltadrain.errors import ServiceError


def conf_of(cmd: list[str]) -> dict[str, str]:
    pairs = [cmd[i + 1] for i, arg in enumerate(cmd) if arg == "--conf"]
    return dict(p.split("=", 1) for p in pairs)


def test_the_server_starts_from_the_jar_cache_on_loopback_with_the_venvs_python():
    from deltadrain.runtime.jars import (
        CONNECT_ARTIFACT,
        CONNECT_SERVER_CLASS,
        LOG_STORE_CLASS,
        artifact_name,
        classpath,
    )
    from deltadrain.runtime.session import CONNECT_LOG4J, LOG4J, connect_server_command

    cmd = connect_server_command(15999, master="local[2]")
    assert cmd[0].endswith("/bin/spark-submit")
    assert cmd[cmd.index("--class") + 1] == CONNECT_SERVER_CLASS
    # The entry point comes from the jar cache's class path; no application jar for Spark to ship.
    assert cmd[-1] == "spark-internal"
    assert any(artifact_name(j.rsplit("/", 1)[-1]) == CONNECT_ARTIFACT for j in conf_of(cmd)["spark.jars"].split(","))
    assert cmd[cmd.index("--master") + 1] == "local[2]"
    assert "--packages" not in cmd and not any("spark.jars.packages" in a for a in cmd)
    conf = conf_of(cmd)
    assert conf["spark.connect.grpc.binding.address"] == "127.0.0.1"
    assert conf["spark.connect.grpc.binding.port"] == "15999"
    assert conf["spark.driver.bindAddress"] == conf["spark.driver.host"] == "127.0.0.1"
    assert conf["spark.jars"].split(",") == [str(j) for j in classpath("spark")]
    assert conf["spark.jars.ivy"].startswith("/nonexistent")
    assert conf["spark.delta.logStore.file.impl"] == LOG_STORE_CLASS
    assert conf["spark.sql.extensions"] == "io.delta.sql.DeltaSparkSessionExtension"
    assert conf["spark.pyspark.python"] == sys.executable
    assert f"-Dlog4j2.configurationFile=file:{CONNECT_LOG4J}" in conf["spark.driver.extraJavaOptions"]
    assert str(LOG4J) not in conf["spark.driver.extraJavaOptions"]
    assert CONNECT_LOG4J.exists()
    # A server that lives on keeps the status store of past queries and tasks small.
    assert int(conf["spark.sql.ui.retainedExecutions"]) <= 100 and int(conf["spark.ui.retainedTasks"]) <= 10_000


def test_against_a_cluster_master_the_driver_address_stays_sparks_choice():
    from deltadrain.runtime.session import connect_server_command

    conf = conf_of(connect_server_command(15999, master="spark://head:7077"))
    assert "spark.driver.bindAddress" not in conf and "spark.driver.host" not in conf
    assert conf["spark.connect.grpc.binding.address"] == "127.0.0.1"


def test_the_port_comes_from_the_config_or_the_environment(monkeypatch):
    from deltadrain.config.embedded import ports, spark_connect_url

    cfg = load_config()
    monkeypatch.delenv("DELTADRAIN_SPARK_CONNECT_PORT", raising=False)
    assert ports(cfg).spark_connect == cfg.services.spark_connect_port == 15012
    monkeypatch.setenv("DELTADRAIN_SPARK_CONNECT_PORT", "15433")
    assert spark_connect_url(cfg) == "sc://127.0.0.1:15433"
    monkeypatch.setenv("DELTADRAIN_SPARK_CONNECT_PORT", "sc")
    with pytest.raises(ServiceError, match="DELTADRAIN_SPARK_CONNECT_PORT"):
        ports(cfg)


def test_services_up_starts_it_by_default_before_airflow_and_names_its_port_setting(monkeypatch):
    from deltadrain.dev import services

    monkeypatch.setenv("DELTADRAIN_SPARK_CONNECT_PORT", "15433")
    assert services.select(None) == ["valkey", "kafka", "spark_connect", "airflow"]
    assert services.select(["airflow", "spark_connect"]) == ["spark_connect", "airflow"]
    svc = services.FACTORIES["spark_connect"](load_config())
    assert svc.ports == [15433]
    assert svc.log_file.name == "spark_connect.log" and svc.pid_file.parent == svc.home
    assert "DELTADRAIN_SPARK_CONNECT_PORT" in svc.port_setting(15433)
    assert "services.spark_connect_port" in svc.port_setting(15433)
    assert svc.env["PYSPARK_PYTHON"] == sys.executable
    assert "spark_connect" in services.defaults(load_config())  # a bare `up` starts it
    from deltadrain.paths import PROJECT_ROOT

    # Its workers import transforms by dotted name from the project, and it is no Connect client itself.
    assert svc.env["PYTHONPATH"].split(":")[:2] == [str(PROJECT_ROOT), str(PROJECT_ROOT / "include")]
    assert svc.env["SPARK_CONNECT_MODE_ENABLED"] is None


def test_airflow_gets_a_spark_connect_connection_to_the_server(monkeypatch):
    from deltadrain.config.embedded import SPARK_CONNECT_CONN_ID, airflow_env, spark_connect_connection

    monkeypatch.setenv("DELTADRAIN_SPARK_CONNECT_PORT", "15433")
    monkeypatch.delenv("AIRFLOW_CONN_SPARK_CONNECT", raising=False)
    cfg = load_config()
    conn = json.loads(airflow_env(cfg)["AIRFLOW_CONN_SPARK_CONNECT"])
    assert SPARK_CONNECT_CONN_ID == "spark_connect"
    assert conn == spark_connect_connection(cfg)
    assert (conn["conn_type"], conn["host"], conn["port"]) == ("spark_connect", "127.0.0.1", 15433)
    # No secret: no Token (password), no User ID (login), no extra.
    assert not {"password", "login", "extra"} & conn.keys()
    # A connection of that id the user gave is theirs.
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CONNECT", json.dumps({"conn_type": "spark_connect", "host": "far"}))
    assert "AIRFLOW_CONN_SPARK_CONNECT" not in airflow_env(cfg)


def test_the_providers_hook_reads_it_as_a_url_a_connect_client_takes(monkeypatch):
    from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook
    from pyspark.sql.connect.client.core import DefaultChannelBuilder

    from deltadrain.config.embedded import SPARK_CONNECT_CONN_ID, spark_connect_connection

    monkeypatch.setenv("DELTADRAIN_SPARK_CONNECT_PORT", "15433")
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CONNECT", json.dumps(spark_connect_connection(load_config())))
    url = SparkConnectHook(conn_id=SPARK_CONNECT_CONN_ID).get_connection_url()
    assert url == "sc://127.0.0.1:15433/"
    channel = DefaultChannelBuilder(url)  # parses only; connects on first use
    assert (channel.host, channel.endpoint, channel.secure) == ("127.0.0.1", "127.0.0.1:15433", False)


def test_a_client_session_carries_the_runtime_confs_deltadrain_relies_on():
    from deltadrain.runtime.session import DEFAULT_CONF, SESSION_KEYS, session_conf

    conf = session_conf()
    assert set(conf) == set(SESSION_KEYS) <= set(DEFAULT_CONF)
    assert conf["spark.databricks.delta.snapshotPartitions"] == "4"
    assert conf["spark.sql.session.timeZone"] == "UTC"
    # Static confs are the server's: a session cannot set them.
    assert not {"spark.sql.extensions", "spark.jars", "spark.driver.memory"} & set(conf)
    assert session_conf({"spark.sql.shuffle.partitions": "8"})["spark.sql.shuffle.partitions"] == "8"


def test_a_missing_connect_connection_names_the_fix(monkeypatch):
    from deltadrain.errors import PrerequisiteError
    from deltadrain.orchestration.connections import connect_url

    monkeypatch.delenv("AIRFLOW_CONN_NO_SUCH_SERVER", raising=False)
    with pytest.raises(PrerequisiteError, match="Airflow has no connection 'no_such_server'.*deltadrain services up"):
        connect_url("no_such_server")


def test_a_lost_server_is_told_from_other_errors():
    from deltadrain.runtime.session import connect_lost

    lost = RuntimeError("[NO_ACTIVE_SESSION] No active Spark session found. Please create a new Spark session")
    assert connect_lost(lost).startswith("the Spark Connect server went away during the run ([NO_ACTIVE_SESSION]")
    assert " deltadrain services up`" in connect_lost(lost)
    assert connect_lost(RuntimeError("<_MultiThreadedRendezvous of RPC: status = StatusCode.UNAVAILABLE>"))
    assert connect_lost(ValueError("[DELTA_CONCURRENT_APPEND] a conflict")) is None


def test_a_tasks_calls_to_the_embedded_api_server_outwait_its_sqlite_lock_wait():
    from deltadrain.config.embedded import airflow_env
    from deltadrain.orchestration.airflow_db import SQLITE_LOCK_TIMEOUT

    # The API server may wait this long for the DB's write lock before it answers; a task runner that gave up
    # sooner would kill a task the DB was only slow for.
    assert float(airflow_env(load_config())["AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT"]) > SQLITE_LOCK_TIMEOUT
