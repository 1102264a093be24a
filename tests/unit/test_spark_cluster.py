"""The embedded Spark cluster's settings and what a driver or the Connect server is told about it."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from deltadrain.config import load_config
from deltadrain.config.embedded import spark_cluster_auth_conf, spark_cluster_secret_file, spark_cluster_url
from deltadrain.dev.services.spark_cluster import properties, spark_cluster_service
from deltadrain.lake.objectstore import S3Settings, login_conf, private_properties
from deltadrain.paths import jar_cache


def test_only_a_driver_of_the_embedded_cluster_gets_its_secret_and_no_command_line_carries_one(tmp_path, monkeypatch):
    monkeypatch.setenv("DELTADRAIN_HOME", str(tmp_path))
    monkeypatch.setenv("DELTADRAIN_SPARK_CLUSTER_PORT", "17999")
    cfg = load_config()
    url = spark_cluster_url(cfg)
    assert url == "spark://127.0.0.1:17999"
    assert spark_cluster_auth_conf(url, cfg) == {}  # not started yet: no secret
    svc = spark_cluster_service(cfg)
    svc.prepare()
    secret = spark_cluster_secret_file().read_text().strip()
    assert stat.S_IMODE(spark_cluster_secret_file().stat().st_mode) == 0o600 and len(secret) >= 32
    assert spark_cluster_auth_conf(url, cfg) == {"spark.authenticate": "true", "spark.authenticate.secret": secret}
    assert spark_cluster_auth_conf("spark://elsewhere:7077", cfg) == {}
    props = (svc.home / "spark.properties")
    assert stat.S_IMODE(props.stat().st_mode) == 0o600 and f"spark.authenticate.secret={secret}" in props.read_text()
    assert "spark.master.rest.enabled=false" in properties(secret, 1)
    assert secret not in json.dumps(svc.command()) and svc.env["SPARK_LOCAL_IP"] == "127.0.0.1"
    # The Connect server on the cluster with the lake on S3: both secrets in its properties file only.
    from deltadrain.runtime.session import connect_server_command

    store = S3Settings("key", "s3-secret", "http://127.0.0.1:9000")
    login = private_properties({**login_conf(store), **spark_cluster_auth_conf(url, cfg)}, tmp_path / "p.properties")
    cmd = connect_server_command(15999, url, object_store=store, login_file=login)
    assert "s3-secret" not in " ".join(cmd) and secret not in " ".join(cmd)
    assert cmd[cmd.index("--properties-file") + 1] == str(login)
    assert "spark.driver.host=127.0.0.1" in cmd  # the executors call back on loopback
    # The worker reads the jar cache from its own disk: nothing to ship to its executors.
    conf = dict(c.split("=", 1) for c in cmd if "=" in c and c.startswith("spark."))
    assert "spark.jars" not in conf
    for side in ("driver", "executor"):
        jars = conf[f"spark.{side}.extraClassPath"].split(os.pathsep)
        assert any("hadoop-aws" in j for j in jars) and any("delta-spark" in j for j in jars)
        assert all(Path(j).is_relative_to(jar_cache()) for j in jars)
    # Each stopped application's work directory goes a day after its last change.
    assert "spark.worker.cleanup.enabled=true" in properties(secret, 1)
    assert "spark.deploy.defaultCores=1" in properties(secret, 1)  # room for a second application


def test_a_cluster_whose_workers_hold_the_jar_cache_gets_no_jars_shipped(tmp_path, monkeypatch):
    from deltadrain.runtime.session import jars_on_workers, spark_conf

    monkeypatch.setenv("DELTADRAIN_HOME", str(tmp_path))
    monkeypatch.setenv("DELTADRAIN_SPARK_CLUSTER_PORT", "17999")
    monkeypatch.delenv("DELTADRAIN_WORKER_JARS", raising=False)
    conf = spark_conf()
    jars = conf["spark.jars"].split(",")
    # Local drivers, and a cluster whose workers lack the cache, ship the jars as before.
    assert jars_on_workers(conf, "local[*]") == conf
    assert jars_on_workers(conf, "spark://elsewhere:7077") == conf
    # The embedded cluster: its worker reads this very cache.
    embedded = jars_on_workers(conf, "spark://127.0.0.1:17999")
    assert "spark.jars" not in embedded
    assert embedded["spark.driver.extraClassPath"] == embedded["spark.executor.extraClassPath"] == os.pathsep.join(jars)
    # Another cluster whose workers ran `make jars` under /opt/deltadrain/jars.
    monkeypatch.setenv("DELTADRAIN_WORKER_JARS", "/opt/deltadrain/jars")
    other = jars_on_workers(conf, "spark://elsewhere:7077")
    assert other["spark.driver.extraClassPath"] == os.pathsep.join(jars)
    assert other["spark.executor.extraClassPath"].split(os.pathsep) == [
        str(Path("/opt/deltadrain/jars") / Path(j).relative_to(jar_cache())) for j in jars]
    assert {k: v for k, v in other.items() if "extraClassPath" not in k} == \
        {k: v for k, v in conf.items() if k != "spark.jars"}
