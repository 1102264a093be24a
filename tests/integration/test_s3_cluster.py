"""Drains into a lake on the object store, run by a Spark standalone cluster: the embedded S3 server,
the embedded cluster (a master and a worker from pyspark's Spark), and a Spark Connect server on that
cluster with the lake's settings. Nothing may depend on the driver's disk: the tasks that claim and stage
run in executor processes the worker starts, and stage on S3.

One test, as the services it needs take minutes to start on a small machine: a Valkey and a Kafka
pipeline, each killed between its commit and its acknowledgement (a SIGKILL of the drain), drained
again, read back with delta-rs (each message once, the malformed ones in the DLQ); then maintenance
(OPTIMIZE, VACUUM) and Delta's log cleanup on the object store, and a drain after it that recovers
its checkpoint from the table's Delta checkpoint.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

from deltadrain.config import load_config
from deltadrain.dev.produce import MALFORMED_KINDS, ensure_topic, produce
from deltadrain.embedded import S3_BUCKET, s3_home
from deltadrain.failpoints import fired
from deltadrain.objectstore import as_connection, embedded_connection, resolve, storage_options
from deltadrain.sources.kafka.client import kafka_client_conf
from deltadrain.sources.valkey.client import valkey_client
from tests.conftest import free_port
from tests.integration.helpers import SPAWNED, assert_dead_letters, pending, summary_of
from tests.integration.test_services import cli

ROOT = Path(__file__).resolve().parents[2]
SQL = Path(__file__).parent / "connect_sql.py"


def write_s3_config(tmp_path: Path, lake: str) -> Path:
    """The example's Valkey and Kafka pipelines, renamed (own streams, topic, tables), lake on S3."""
    data = yaml.safe_load((ROOT / "config" / "pipelines.yaml").read_text())
    data["data_dir"] = lake
    tag = uuid.uuid4().hex[:6]
    for pipe in data["pipelines"]:
        kind = pipe["source"]["kind"]
        pipe["name"] = name = f"{kind[0]}_{tag}"
        pipe["target"]["path"] = name
        pipe.pop("quality", None)
        pipe["min_idle_ms"] = 0
        if kind == "valkey":
            pipe["source"]["streams"] = [f"{name}:{{{i}}}" for i in range(2)]
        else:
            pipe["source"].update(topic=name, partitions=2, group=f"{name}-group")
    path = tmp_path / "pipelines.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def read_table(path: str, store, columns: list[str]):
    from deltalake import DeltaTable

    return DeltaTable(path, storage_options=storage_options(store)).to_pyarrow_table(columns=columns)


class Rows:
    """A DLQ row as assert_dead_letters reads it."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


def drain(env: dict, config: Path, name: str, *more: str, point: str | None = None) -> dict | str:
    """One CLI drain through the Connect server (run id `name-point`, or `name-<n>`): its summary, or
    the failpoint's kill."""
    run_env = {**env, **({"DELTADRAIN_FAILPOINT": point} if point else {})}
    run_id = f"{name}-{point or uuid.uuid4().hex[:6]}"
    proc = subprocess.Popen([sys.executable, "-m", "deltadrain.cli", "--config", str(config), "drain", name,
                             "--remote", "embedded", "--run-id", run_id, *more], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=run_env, cwd=ROOT)
    SPAWNED.append(proc)
    out, err = proc.communicate(timeout=900)
    if point:
        assert proc.returncode == -9 and fired(point) in err, f"rc={proc.returncode}: {err[-3000:]}"
        return "killed"
    assert proc.returncode == 0, err[-3000:]
    return summary_of(out)


def age_log(table: str, days: int = 5) -> Path:
    """Make the table's commit files look `days` old, on the S3 server's own disk (its filesystem
    backend gives an object the time of its file): Delta's log cleanup then finds them expired."""
    log = s3_home() / "data" / S3_BUCKET / table.removeprefix(f"s3a://{S3_BUCKET}/") / "_delta_log"
    old = time.time() - days * 86400
    for name in os.listdir(log):
        os.utime(log / name, (old, old))
    return log


@pytest.mark.slow
def test_valkey_and_kafka_drain_exactly_once_into_s3_on_a_standalone_cluster_and_survive_maintenance(
        tmp_path, s3_server, valkey_server, kafka_broker):
    store = resolve({}, lookup=lambda conn_id: None, embedded=embedded_connection)
    lake = f"s3a://{S3_BUCKET}/cluster/{uuid.uuid4().hex[:8]}"
    config = write_s3_config(tmp_path, lake)
    cfg = load_config(config)
    valkey_p, kafka_p = cfg.pipelines
    ensure_topic(kafka_client_conf(cfg, kafka_p), kafka_p.source.topic, 2)
    # The cluster and its Connect server in a home of their own; the sources are the session's. The
    # store's login reaches the server and the drains only as the Airflow connection in the environment.
    home = tmp_path / "home"
    spark_cluster_port = free_port()
    env = {**os.environ, "DELTADRAIN_HOME": str(home), "DELTADRAIN_CONFIG": str(config),
           "DELTADRAIN_SPARK_CLUSTER_PORT": str(spark_cluster_port), "DELTADRAIN_SPARK_CLUSTER_UI_PORT": str(free_port()),
           "DELTADRAIN_SPARK_CONNECT_PORT": str(free_port()), "DELTADRAIN_DRIVER_MEMORY": "1g",
           "DELTADRAIN_SPARK_MASTER": f"spark://127.0.0.1:{spark_cluster_port}",
           "AIRFLOW_CONN_DELTADRAIN_S3": as_connection(store)}
    try:
        up = cli(env, "services", "up", "--only", "spark_cluster,spark_connect", timeout=600)
        assert up.returncode == 0, up.stdout + up.stderr
        server = home / "services" / "spark_connect"
        command = Path(f"/proc/{int((server / 'spark_connect.pid').read_text())}/cmdline").read_bytes()
        assert store.secret_access_key.encode() not in command and b"authenticate.secret" not in command
        assert b"--properties-file" in command and b"hadoop-aws" in command

        produced = {valkey_p.name: produce(cfg, valkey_p, 120, seed=5, malformed_ratio=0.05),
                    kafka_p.name: produce(cfg, kafka_p, 120, seed=6, malformed_ratio=0.05)}
        # Killed between the commit and the acknowledgement: the next run finds its batch committed.
        for p in (valkey_p, kafka_p):
            assert drain(env, config, p.name, point="after_commit") == "killed"
        for p in (valkey_p, kafka_p):
            again = drain(env, config, p.name, "--max-batches", "6")
            assert again["outcome"] in ("committed", "already_committed", "empty"), again
            assert again["written"] == 0  # every row was in the killed run's commit

        for p in (valkey_p, kafka_p):
            result = produced[p.name]
            ids = read_table(str(cfg.target_path(p)), store, [p.payload_schema.id_field]).column(0).to_pylist()
            assert len(ids) == len(set(ids)) and set(ids) == set(result.valid_ids), p.name
            dead = read_table(str(cfg.dlq_path(p)), store, ["partition", "position", "state", "message_id"])
            assert_dead_letters([Rows(**r) for r in dead.to_pylist()], ids, result.bad_places(MALFORMED_KINDS))
        client = valkey_client(cfg, valkey_p)
        assert pending(client, valkey_p) == 0
        # The staging lived on the store: each run removed its own, but for the killed ones (a day
        # later, a run sweeps those away).
        from pyarrow.fs import FileSelector

        from deltadrain.objectstore import pyarrow_filesystem

        staged = pyarrow_filesystem(store).get_file_info(
            FileSelector(f"{S3_BUCKET}/{lake.split('/', 3)[3]}/_deltadrain/staging", recursive=True))
        left = {f.path.split("/_deltadrain/staging/", 1)[1].split("/", 1)[0] for f in staged if f.size}
        assert left == {f"{p.name}-after_commit" for p in (valkey_p, kafka_p)}, left
        # The tasks ran in executors the worker started: processes of their own, with the drains' logs.
        executors = list((home / "services" / "spark_cluster" / "work").glob("app-*/*/stderr"))
        assert executors, "no executor ran on the cluster's worker"
        assert any("CoarseGrainedExecutorBackend" in e.read_text(errors="replace") for e in executors)
        server_pid = int((server / "spark_connect.pid").read_text())
        executor_pids = {int(m) for e in executors
                         for m in re.findall(r"Started daemon with process name: (\d+)@", e.read_text(errors="replace"))}
        assert executor_pids and server_pid not in executor_pids

        # Maintenance on the store, through the same server: compaction replaces the batches' files.
        done = cli(env, "maintain", valkey_p.name, "--json", "--remote", "embedded", timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]
        target = str(cfg.target_path(valkey_p))
        assert '"table": "target"' in done.stdout and '"skipped": null' in done.stdout, done.stdout
        # Log cleanup: Delta removes expired commit files when it writes a checkpoint; this commit
        # writes one. The commits that hold the batches' positions go with it.
        log = age_log(target)
        sql = subprocess.run([sys.executable, str(SQL), env["DELTADRAIN_SPARK_CONNECT_PORT"],
                              f"ALTER TABLE delta.`{target}` SET TBLPROPERTIES ('delta.logRetentionDuration' = "
                              "'interval 1 days', 'delta.deletedFileRetentionDuration' = 'interval 1 days', "
                              "'delta.checkpointInterval' = '1')"],
                             capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
        assert sql.returncode == 0, sql.stderr[-3000:]
        assert not (log / f"{0:020d}.json").exists(), "log cleanup did not run"
        assert list(log.glob("*.checkpoint.parquet"))
        from deltadrain.lake import snapshot_txn

        committed = snapshot_txn(target, valkey_p.name)[0]  # the batch, from the Delta checkpoint
        assert committed is not None and committed >= 1
        # The next drain recovers its positions from the table without those commits: it goes on
        # with the next batch and takes only the new messages.
        more = produce(cfg, valkey_p, 30, seed=7, start=120)
        last = drain(env, config, valkey_p.name)
        assert (last["outcome"], last["batch"], last["written"]) == ("committed", committed + 1, 30), last
        assert snapshot_txn(target, valkey_p.name)[0] == committed + 1
        ids = read_table(target, store, [valkey_p.payload_schema.id_field]).column(0).to_pylist()
        assert len(ids) == len(set(ids)) and set(ids) == set(produced[valkey_p.name].valid_ids + more.valid_ids)
        assert pending(client, valkey_p) == 0
    finally:
        down = cli(env, "services", "down", "--only", "spark_connect,spark_cluster", timeout=300)
        assert down.returncode == 0, down.stderr
