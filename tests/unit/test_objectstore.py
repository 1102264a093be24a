"""The object store's login and endpoint: where they come from, and what Spark, delta-rs and pyarrow are told."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest

from deltadrain.dev.s3http import signed_headers
from deltadrain.errors import ConfigError
from deltadrain.lake.objectstore import (
    S3_LOG_STORE_CLASS,
    S3Settings,
    bucket_and_key,
    pyarrow_filesystem,
    resolve,
    spark_conf,
    storage_options,
)

CONN = {"conn_type": "aws", "login": "conn-key", "password": "conn-secret",
        "extra": {"endpoint_url": "http://127.0.0.1:9000", "region_name": "eu-west-1"}}


def nothing(conn_id):
    return None


def test_the_connection_comes_first_then_deltadrain_s_variables_then_aws_s():
    env = {"DELTADRAIN_S3_ACCESS_KEY_ID": "dd-key", "DELTADRAIN_S3_SECRET_ACCESS_KEY": "dd-secret",
           "DELTADRAIN_S3_ENDPOINT_URL": "http://dd:1", "AWS_ACCESS_KEY_ID": "aws-key",
           "AWS_SECRET_ACCESS_KEY": "aws-secret", "AWS_ENDPOINT_URL": "https://aws:2", "AWS_REGION": "us-west-2"}
    s = resolve({**env, "AIRFLOW_CONN_DELTADRAIN_S3": json.dumps(CONN)}, lookup=nothing)
    assert (s.access_key_id, s.secret_access_key, s.endpoint_url, s.region) == \
        ("conn-key", "conn-secret", "http://127.0.0.1:9000", "eu-west-1")
    # The connection from Airflow's own store (its extra already a dict), when the environment has none.
    s = resolve(env, lookup=lambda conn_id: {**CONN, "login": "stored"} if conn_id == "deltadrain_s3" else None)
    assert s.access_key_id == "stored"
    s = resolve(env, lookup=nothing)
    assert (s.access_key_id, s.endpoint_url, s.region) == ("dd-key", "http://dd:1", "us-east-1")
    s = resolve({k: v for k, v in env.items() if k.startswith("AWS_")}, lookup=nothing)
    assert (s.access_key_id, s.endpoint_url, s.region, s.secure) == ("aws-key", "https://aws:2", "us-west-2", True)
    s = resolve({}, lookup=nothing, embedded=lambda: CONN)
    assert s.access_key_id == "conn-key" and s.source == "the embedded S3 server"


def test_a_missing_or_half_login_is_one_clear_error_that_never_shows_the_secret():
    with pytest.raises(ConfigError, match="deltadrain_s3.*DELTADRAIN_S3_ACCESS_KEY_ID.*services up --only s3"):
        resolve({}, lookup=nothing)
    with pytest.raises(ConfigError, match="DELTADRAIN_S3_ACCESS_KEY_ID is not set"):
        resolve({"DELTADRAIN_S3_SECRET_ACCESS_KEY": "hunter2"}, lookup=nothing)
    with pytest.raises(ConfigError, match="no access key id"):
        resolve({"AIRFLOW_CONN_DELTADRAIN_S3": json.dumps({"conn_type": "aws", "login": "k"})}, lookup=nothing)
    with pytest.raises(ConfigError, match="carries a login"):
        S3Settings("k", "s", "http://k:hunter2@host:9000")
    assert "hunter2" not in repr(S3Settings("k", "hunter2", "http://host:9000"))


def test_spark_gets_the_endpoint_path_style_the_providers_and_the_conditional_log_store():
    s = S3Settings("k", "s3cr3t", "http://127.0.0.1:9000", "eu-west-1")
    conf = spark_conf(s)
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:9000"
    assert conf["spark.hadoop.fs.s3a.path.style.access"] == "true"
    assert conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
    assert conf["spark.hadoop.fs.s3a.endpoint.region"] == "eu-west-1"
    assert conf["spark.hadoop.fs.s3a.aws.credentials.provider"].split(",")[0].endswith("SimpleAWSCredentialsProvider")
    assert conf["spark.delta.logStore.s3a.impl"] == S3_LOG_STORE_CLASS
    assert (conf["spark.hadoop.fs.s3a.access.key"], conf["spark.hadoop.fs.s3a.secret.key"]) == ("k", "s3cr3t")
    # For a command line (spark-submit): no login; the driver reads it from its environment.
    assert "s3cr3t" not in json.dumps(spark_conf(s, with_login=False))
    # AWS itself: no endpoint, virtual-hosted buckets.
    aws = spark_conf(S3Settings("k", "s"))
    assert "spark.hadoop.fs.s3a.endpoint" not in aws and "spark.hadoop.fs.s3a.path.style.access" not in aws


def test_delta_rs_and_pyarrow_get_the_same_store_and_login():
    s = S3Settings("k", "s", "http://127.0.0.1:9000")
    opts = storage_options(s)
    assert opts["AWS_ENDPOINT_URL"] == "http://127.0.0.1:9000" and opts["AWS_ALLOW_HTTP"] == "true"
    assert (opts["AWS_ACCESS_KEY_ID"], opts["AWS_SECRET_ACCESS_KEY"]) == ("k", "s")
    assert opts["AWS_VIRTUAL_HOSTED_STYLE_REQUEST"] == "false"
    assert "AWS_ALLOW_HTTP" not in storage_options(S3Settings("k", "s", "https://store:443"))
    fs = pyarrow_filesystem(s)
    assert fs.type_name == "s3" and fs.region == "us-east-1"
    assert bucket_and_key("s3a://lake/some/prefix") == ("lake", "some/prefix")
    with pytest.raises(ValueError):
        bucket_and_key("/tmp/lake")


def test_requests_are_signed_as_aws_signature_v4_says():
    # AWS's worked example for Signature Version 4 (GET Object, with a Range header).
    s = S3Settings("AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "http://unused:1")
    headers = signed_headers(s, "GET", "examplebucket.s3.amazonaws.com", "/test.txt", "", b"",
                             {"Range": "bytes=0-9"}, datetime.datetime(2013, 5, 24, tzinfo=datetime.UTC))
    assert headers["authorization"] == (
        "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
        "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
        "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41")


def test_a_lake_on_s3_gives_every_table_and_the_staging_a_url_under_it(tmp_path):
    import stat

    import yaml

    from deltadrain.config import parse_config
    from deltadrain.config.lakeurl import LakeUrl
    from deltadrain.lake.objectstore import as_connection, from_connection, login_conf, private_properties
    from deltadrain.lake.scratch import staging_dir

    data = yaml.safe_load(Path("config/pipelines.yaml").read_text())
    data["data_dir"] = "s3://deltadrain/lake/x/"  # s3:// is read as s3a://, Spark's scheme for it
    cfg = parse_config(data, tmp_path / "p.yaml")
    orders = cfg.pipeline("orders")
    assert cfg.on_object_store and cfg.lake_dir() == LakeUrl("s3a://deltadrain/lake/x")
    assert str(cfg.target_path(orders)) == "s3a://deltadrain/lake/x/orders"
    assert str(cfg.dlq_path(orders)) == "s3a://deltadrain/lake/x/_deltadrain/dlq/orders"
    assert LakeUrl("s3a://b/a/c").parents == (LakeUrl("s3a://b/a"), LakeUrl("s3a://b"))
    assert (LakeUrl("s3a://b/a") / "c/d").fs_path() == "b/a/c/d"
    # The pipelines' tables stay apart on the store too.
    data["pipelines"][1]["target"]["path"] = "_deltadrain/metrics"
    with pytest.raises(ConfigError, match="pipeline 'clicks', field 'target.path'.*overlaps deltadrain's own"):
        parse_config(data, tmp_path / "p.yaml")
    for bad, why in (("s3a:///x", "not an s3a://bucket/key URL"), ("s3a://b/a/../c", "'..' name no place")):
        data["data_dir"] = bad
        with pytest.raises(ConfigError, match=f"field 'data_dir': .*{why}"):
            parse_config(data, tmp_path / "p.yaml")
    # A run id that is no directory name is refused before anything is staged or removed.
    with pytest.raises(ValueError, match="run id"):
        staging_dir("../x", LakeUrl("s3a://b/lake"))
    # spark-submit's login: a file readable by its owner only, and for the job's driver the connection.
    s = S3Settings("key", "se/cr+et\\", "http://127.0.0.1:9000", "eu-west-1")
    props = private_properties(login_conf(s), tmp_path / "login.properties")
    assert stat.S_IMODE(props.stat().st_mode) == 0o600
    assert props.read_text() == "spark.hadoop.fs.s3a.access.key=key\nspark.hadoop.fs.s3a.secret.key=se/cr+et\\\\\n"
    assert from_connection(json.loads(as_connection(s)), "") == s
