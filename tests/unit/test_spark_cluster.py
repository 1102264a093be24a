"""The embedded Spark cluster's settings and what a driver or the Connect server is told about it."""

from __future__ import annotations

import json
import stat

from deltadrain.config import load_config
from deltadrain.dev.services.spark_cluster import properties, spark_cluster_service
from deltadrain.embedded import spark_cluster_auth_conf, spark_cluster_secret_file, spark_cluster_url
from deltadrain.objectstore import S3Settings, login_conf, private_properties


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
    from deltadrain.spark import connect_server_command

    store = S3Settings("key", "s3-secret", "http://127.0.0.1:9000")
    login = private_properties({**login_conf(store), **spark_cluster_auth_conf(url, cfg)}, tmp_path / "p.properties")
    cmd = connect_server_command(15999, url, object_store=store, login_file=login)
    assert "s3-secret" not in " ".join(cmd) and secret not in " ".join(cmd)
    assert cmd[cmd.index("--properties-file") + 1] == str(login)
    assert "spark.driver.host=127.0.0.1" in cmd  # the executors call back on loopback
    assert any(c.startswith("spark.jars=") and "hadoop-aws" in c for c in cmd)
