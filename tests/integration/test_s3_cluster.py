"""Drains into a lake on the object store, run by a Spark standalone cluster: the embedded S3 server,
the embedded cluster (a master and a worker from pyspark's Spark), and a Spark Connect server on that
cluster with the lake's settings. Nothing may depend on the driver's disk: the tasks that claim and stage
run in executor processes the worker starts, and stage on S3.

One test, as the services it needs take minutes to start on a small machine: a Valkey and a Kafka
pipeline killed after the claim and after the commit, two drains racing for a batch, a poison
message, maintenance and Delta's log cleanup, backfill and replay on the cluster, a drain killed
during its acknowledgement, and the ingest DAG through spark-submit on the cluster; each read back
with delta-rs from S3 (every message once, the malformed ones in the DLQ). The executors read the
jars from the worker's jar cache: no application's work directory holds one.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from deltadrain.config import load_config
from deltadrain.config.embedded import S3_BUCKET, s3_home
from deltadrain.dev.produce import MALFORMED_KINDS, ensure_topic, produce
from deltadrain.failpoints import fired
from deltadrain.lake.checkpoint import find_commit
from deltadrain.lake.delta import snapshot_txn, sql_literal
from deltadrain.lake.objectstore import as_connection, embedded_connection, resolve, storage_options
from deltadrain.names import ingest_dag_id
from deltadrain.sources.kafka.client import kafka_client_conf
from deltadrain.sources.valkey.client import valkey_client
from tests.conftest import free_port
from tests.support.lake import assert_dead_letters
from tests.support.processes import SPAWNED, held_at, run_dag, summary_of
from tests.support.services import cli, up_unwarmed
from tests.support.valkey import pending

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


def start_drain(env: dict, config: Path, name: str, *more: str, run_id: str,
                extra: dict | None = None) -> subprocess.Popen:
    """A CLI drain through the Connect server."""
    proc = subprocess.Popen([sys.executable, "-m", "deltadrain.cli", "--config", str(config), "drain", name,
                             "--remote", "embedded", "--run-id", run_id, *more],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**env, **(extra or {})},
                            cwd=ROOT)
    SPAWNED.append(proc)
    return proc


def drain(env: dict, config: Path, name: str, *more: str, point: str | None = None) -> dict | str:
    """One CLI drain through the Connect server (run id `name-point`, or `name-<n>`): its summary, or
    the failpoint's kill."""
    proc = start_drain(env, config, name, *more, run_id=f"{name}-{point or uuid.uuid4().hex[:6]}",
                       extra={"DELTADRAIN_FAILPOINT": point} if point else None)
    out, err = proc.communicate(timeout=900)
    if point:
        assert proc.returncode == -9 and fired(point) in err, f"rc={proc.returncode}: {err[-3000:]}"
        return "killed"
    assert proc.returncode == 0, err[-3000:]
    return summary_of(out)


def json_command(env: dict, config: Path, *args: str) -> dict:
    """A CLI command through the Connect server, with --json: its JSON answer."""
    done = cli(env, "--config", str(config), *args, "--remote", "embedded", "--json", timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout[done.stdout.index("{"):])


def variant(config: Path, name: str, **changes) -> Path:
    """A copy of the config with `changes` to pipeline `name` (an operator's edit, e.g. a fixed transform)."""
    data = yaml.safe_load(config.read_text())
    next(p for p in data["pipelines"] if p["name"] == name).update(changes)
    path = config.with_name(f"{name}-{uuid.uuid4().hex[:6]}.yaml")
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def staging_on_disk(lake: str) -> Path:
    """The lake's staging root as the S3 server's filesystem backend keeps it."""
    return s3_home() / "data" / S3_BUCKET / lake.split("/", 3)[3] / "_deltadrain" / "staging"


def staged_runs(store, lake: str) -> set[str]:
    """The run ids whose staging objects are on the store."""
    from pyarrow.fs import FileSelector

    from deltadrain.lake.objectstore import pyarrow_filesystem

    staged = pyarrow_filesystem(store).get_file_info(
        FileSelector(f"{S3_BUCKET}/{lake.split('/', 3)[3]}/_deltadrain/staging", recursive=True, allow_not_found=True))
    return {f.path.split("/_deltadrain/staging/", 1)[1].split("/", 1)[0] for f in staged if f.size}


def age_tree(root: Path, days: int = 2) -> None:
    """Give every file under `root` a modification time `days` ago (the S3 server's object times)."""
    old = time.time() - days * 86400
    for where, _dirs, files in os.walk(root):
        for name in files:
            os.utime(os.path.join(where, name), (old, old))


def age_log(table: str, days: int = 5) -> Path:
    """Make the table's commit files look `days` old, on the S3 server's own disk (its filesystem
    backend gives an object the time of its file): Delta's log cleanup then finds them expired."""
    log = s3_home() / "data" / S3_BUCKET / table.removeprefix(f"s3a://{S3_BUCKET}/") / "_delta_log"
    old = time.time() - days * 86400
    for name in os.listdir(log):
        os.utime(log / name, (old, old))
    return log


@pytest.mark.slow
def test_drains_into_s3_on_a_standalone_cluster_survive_kills_a_race_replay_backfill_and_maintenance(
        tmp_path, s3_server, valkey_server, kafka_broker, airflow_db):
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
        # Not warmed up: the drains below are its first batches, and on S3 (the warm-up's are on disk).
        up = up_unwarmed(env, "spark_cluster", "spark_connect")
        assert up.returncode == 0, up.stdout + up.stderr
        server = home / "services" / "spark_connect"
        command = Path(f"/proc/{int((server / 'spark_connect.pid').read_text())}/cmdline").read_bytes()
        assert store.secret_access_key.encode() not in command and b"authenticate.secret" not in command
        assert b"--properties-file" in command and b"hadoop-aws" in command

        began = datetime.now(UTC) - timedelta(seconds=1)
        produced = {valkey_p.name: produce(cfg, valkey_p, 120, seed=5, malformed_ratio=0.05),
                    kafka_p.name: produce(cfg, kafka_p, 120, seed=6, malformed_ratio=0.05)}
        client = valkey_client(cfg, valkey_p)
        # Killed between the claim and the commit: the batch is staged on the store, nothing committed.
        for p in (valkey_p, kafka_p):
            assert drain(env, config, p.name, point="after_claim") == "killed"
            assert snapshot_txn(str(cfg.target_path(p)), p.name) == (None, None)
        assert pending(client, valkey_p) == 120  # claimed, not acknowledged
        killed = {f"{p.name}-after_claim" for p in (valkey_p, kafka_p)}
        assert staged_runs(store, lake) == killed
        # Its staging is never read again; the first run a day later deletes it.
        for run in killed:
            age_tree(staging_on_disk(lake) / run)
        # Killed between the commit and the acknowledgement: the next run finds its batch committed. The
        # death above narrowed what this one read (poison isolation), so a part of the messages is left.
        for p in (valkey_p, kafka_p):
            assert drain(env, config, p.name, point="after_commit") == "killed"
        assert staged_runs(store, lake) == {f"{p.name}-after_commit" for p in (valkey_p, kafka_p)}
        for p in (valkey_p, kafka_p):
            id_field = p.payload_schema.id_field
            held = read_table(str(cfg.target_path(p)), store, [id_field]).num_rows
            assert 0 < held <= len(produced[p.name].valid_ids), p.name
            again = drain(env, config, p.name, "--max-batches", "6")
            assert again["outcome"] in ("committed", "already_committed", "empty"), again
            # What the killed runs committed is not written again, the rest once.
            assert again["written"] == len(produced[p.name].valid_ids) - held, again

        for p in (valkey_p, kafka_p):
            result = produced[p.name]
            ids = read_table(str(cfg.target_path(p)), store, [p.payload_schema.id_field]).column(0).to_pylist()
            assert len(ids) == len(set(ids)) and set(ids) == set(result.valid_ids), p.name
            dead = read_table(str(cfg.dlq_path(p)), store, ["partition", "position", "state", "message_id"])
            assert_dead_letters([Rows(**r) for r in dead.to_pylist()], ids, result.bad_places(MALFORMED_KINDS))
        assert pending(client, valkey_p) == 0

        # Two drains of the same pipeline at once, two clients of the Connect server on the cluster, each
        # with 30 entries of its own, held before the commit until both are there. Both commit the same
        # batch: exactly one wins it. (Two drivers racing for the same commit file are
        # test_object_store's; a local driver here would cost a JVM start and the s3a jars' load.) Each
        # has malformed entries (this seed): its dead letters, written just before the hold, show it held.
        target = str(cfg.target_path(valkey_p))
        raced = produce(cfg, valkey_p, 60, seed=8, malformed_ratio=0.1)
        batch = snapshot_txn(target, valkey_p.name)[0]
        slow_config = variant(config, valkey_p.name, min_idle_ms=600_000, batch_cap=30)  # no reclaiming
        release = tmp_path / "release"
        hold = held_at("before_commit", release, 600_000)
        racers = {name: start_drain(env, slow_config, valkey_p.name, run_id=name, extra=hold)
                  for name in ("race-a", "race-b")}
        # A run's dead letters are its last write before the hold: once both runs' are in, both are held.
        dlq = str(cfg.dlq_path(valkey_p))

        def held() -> set[str]:
            return set(read_table(dlq, store, ["run_id"]).column(0).to_pylist()) & set(racers)

        deadline = time.time() + 600
        while len(held()) < 2 and time.time() < deadline and all(r.poll() is None for r in racers.values()):
            time.sleep(0.5)
        assert len(held()) == 2, {k: r.poll() for k, r in racers.items()}
        assert pending(client, valkey_p) == 60  # each claimed its 30
        release.touch()
        outcomes = {}
        for name, racer in racers.items():
            out, err = racer.communicate(timeout=600)
            assert racer.returncode == 0, f"{name}: {err[-3000:]}"
            outcomes[name] = summary_of(out)
        print("race:", outcomes)
        won = [s for s in outcomes.values() if s["outcome"] == "committed"]
        lost = [s for s in outcomes.values() if s["outcome"] != "committed"]
        assert len(won) == 1 and len(lost) == 1, outcomes
        assert won[0]["dead_lettered"] and lost[0]["dead_lettered"], outcomes
        assert (won[0]["batch"], won[0]["written"], won[0]["acked"]) == \
            (batch + 1, 30 - won[0]["dead_lettered"], 30), won
        assert (lost[0]["outcome"], lost[0]["written"], lost[0]["acked"], lost[0]["released"]) == \
            ("ahead", 0, 0, 30), lost
        assert "another writer is ahead" in lost[0]["error"]
        winner = find_commit(target, valkey_p.name, batch + 1)
        assert winner is not None and winner["meta"]["run_id"] == won[0]["run_id"]
        assert pending(client, valkey_p) == 30  # the loser's, handed back

        # The next run takes the loser's entries (its dead letters again: written once) and new ones, among
        # them a message the transform fails on: with max_retries 0 it is a dead letter at once.
        poisoned = produce(cfg, valkey_p, 20, seed=9, poison_ratio=0.1)
        assert len(poisoned.poison_ids) == 1
        strict = variant(config, valkey_p.name, max_retries=0)
        after = drain(env, strict, valkey_p.name, "--max-batches", "3")
        assert (after["batch"], after["written"], after["dead_lettered"]) == \
            (batch + 2, 30 - lost[0]["dead_lettered"] + 19, lost[0]["dead_lettered"] + 1), after
        bad = produced[valkey_p.name].bad_places(MALFORMED_KINDS) | raced.bad_places(MALFORMED_KINDS)
        valid = produced[valkey_p.name].valid_ids + raced.valid_ids + poisoned.valid_ids
        ids = read_table(target, store, ["event_id"]).column(0).to_pylist()
        assert len(ids) == len(set(ids)) and set(ids) == set(valid)
        assert pending(client, valkey_p) == 0

        # The staging lived on the store: each run removed its own, the runs a day old were swept, and
        # only the runs killed after their commit left theirs (a run a day later sweeps those away).
        assert staged_runs(store, lake) == {f"{p.name}-after_commit" for p in (valkey_p, kafka_p)}
        # The tasks ran in executors the worker started: processes of their own, with the drains' logs.
        work = home / "services" / "spark_cluster" / "work"
        executors = list(work.glob("app-*/*/stderr"))
        assert executors, "no executor ran on the cluster's worker"
        assert any("CoarseGrainedExecutorBackend" in e.read_text(errors="replace") for e in executors)
        server_pid = int((server / "spark_connect.pid").read_text())
        executor_pids = {int(m) for e in executors
                         for m in re.findall(r"Started daemon with process name: (\d+)@", e.read_text(errors="replace"))}
        assert executor_pids and server_pid not in executor_pids

        # Maintenance on the store, through the same server: compaction replaces the batches' files.
        done = cli(env, "maintain", valkey_p.name, "--json", "--remote", "embedded", timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]
        assert '"table": "target"' in done.stdout and '"skipped": null' in done.stdout, done.stdout
        # Log cleanup: Delta removes expired commit files when it writes a checkpoint; this commit
        # writes one. The commits that hold the batches' positions go with it. Then rows are lost.
        log = age_log(target)
        lost_ids = ", ".join(map(sql_literal, sorted(produced[valkey_p.name].valid_ids)[:5]))
        delete = f"DELETE FROM delta.`{target}` WHERE event_id IN ({lost_ids})"  # noqa: S608 (literals, quoted)
        sql = subprocess.run([sys.executable, str(SQL), env["DELTADRAIN_SPARK_CONNECT_PORT"],
                              f"ALTER TABLE delta.`{target}` SET TBLPROPERTIES ('delta.logRetentionDuration' = "
                              "'interval 1 days', 'delta.deletedFileRetentionDuration' = 'interval 1 days', "
                              "'delta.checkpointInterval' = '1')",
                              delete],
                             capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
        assert sql.returncode == 0, sql.stderr[-3000:]
        assert not (log / f"{0:020d}.json").exists(), "log cleanup did not run"
        assert list(log.glob("*.checkpoint.parquet"))
        committed = snapshot_txn(target, valkey_p.name)[0]  # the batch, from the Delta checkpoint
        assert committed == batch + 2

        # An operator fixes the transform. A backfill of the interval heals the lost rows from the
        # stream's history and leaves the dead letters to the replay; it moves no checkpoint.
        fixed = variant(config, valkey_p.name, transform="deltadrain.transforms.identity")
        dead_before = len(bad) + 1
        healed = json_command(env, fixed, "backfill", valkey_p.name, "--start", began.isoformat(),
                              "--end", (datetime.now(UTC) + timedelta(seconds=1)).isoformat())
        assert (healed["read"], healed["written"], healed["skipped_dead_lettered"], healed["dead_lettered"],
                healed["acked"]) == (200, 5, dead_before, 0, 0), healed
        assert healed["duplicates_skipped"] == len(valid) - 5
        assert snapshot_txn(target, valkey_p.name)[0] == committed
        # The replay sends the poison message's dead letter back to its stream.
        replayed = json_command(env, fixed, "replay", valkey_p.name, "--error", "poison message", "--apply")
        assert (replayed["selected"], replayed["replayed"], replayed["skipped"]) == (1, 1, []), replayed

        # The next drain recovers its positions from the table without those commits: it commits the next
        # batch, the new messages and the replayed one. It is killed during its acknowledgement, which reads
        # the staged entries back from the store: one stream's entries are acknowledged, the other's not.
        more = produce(cfg, valkey_p, 30, seed=7, start=120)
        step = time.monotonic()
        assert drain(env, fixed, valkey_p.name, point="during_ack") == "killed"
        assert snapshot_txn(target, valkey_p.name)[0] == committed + 1
        left = pending(client, valkey_p)
        assert 0 < left < 31, left
        written = valid + poisoned.poison_ids + more.valid_ids
        ids = read_table(target, store, ["event_id"]).column(0).to_pylist()
        assert len(ids) == len(set(ids)) and set(ids) == set(written)
        # The next runs take the dead run's unacknowledged entries, find them committed, write nothing and
        # acknowledge them.
        rest = drain(env, fixed, valkey_p.name, "--max-batches", "6")
        assert (rest["written"], rest["duplicates_skipped"], rest["acked"]) == (0, left, left), rest
        assert pending(client, valkey_p) == 0
        ids = read_table(target, store, ["event_id"]).column(0).to_pylist()
        assert len(ids) == len(set(ids)) and set(ids) == set(written)
        dead = read_table(str(cfg.dlq_path(valkey_p)), store, ["partition", "position", "state", "message_id",
                                                                 "replay_run_id"]).to_pylist()
        assert [(r["state"], r["message_id"], r["replay_run_id"]) for r in dead if r["state"] != "DEAD"] == \
            [("REPLAYED", poisoned.poison_ids[0], replayed["run_id"])]
        assert_dead_letters([Rows(**r) for r in dead if r["state"] == "DEAD"], ids, bad)
        print(f"the kill during the ack and the drain after it: {time.monotonic() - step:.1f} s")

        # The ingest DAG with `spark.executor: submit`: its drain task runs spark-submit on the cluster's
        # master (the `spark_default` connection). The store's login reaches the driver in the environment
        # and, with the cluster's secret, in the run's own properties file: never on its command line.
        step = time.monotonic()
        submitted = produce(cfg, valkey_p, 40, seed=11, start=150, malformed_ratio=0.1)
        data = yaml.safe_load(fixed.read_text())
        data["spark"] = {"executor": "submit"}
        # Continuous: the batch's quality check is a DAG of its own, so this run submits only the drain.
        next(p for p in data["pipelines"] if p["name"] == valkey_p.name)["schedule"] = "@continuous"
        submit_config = tmp_path / "submit.yaml"
        submit_config.write_text(yaml.safe_dump(data, sort_keys=False))
        before = snapshot_txn(target, valkey_p.name)[0]
        apps = set(work.glob("app-*"))
        run = run_dag(ingest_dag_id(valkey_p.name), env={**env, "DELTADRAIN_CONFIG": str(submit_config),
                                                          "AIRFLOW_CONN_SPARK_DEFAULT": env["DELTADRAIN_SPARK_MASTER"]})
        assert run["states"] == {"wait_for_work": "success", "drain": "success"}, run["log"][-3000:]
        summary = run["xcoms"]["drain"]
        malformed = submitted.bad_places(MALFORMED_KINDS)
        assert (summary["outcome"], summary["batches"], summary["written"], summary["dead_lettered"],
                summary["acked"]) == ("committed", [before + 1], len(submitted.valid_ids), len(malformed), 40), summary
        command = next(line for line in run["log"].splitlines() if "Spark-Submit cmd:" in line)
        assert f"--master {env['DELTADRAIN_SPARK_MASTER']} " in command and "--properties-file" in command
        assert "spark.jars=" not in command and "spark.executor.extraClassPath=" in command
        cluster_secret = (home / "services" / "spark_cluster" / "secret").read_text().strip()
        for secret in (store.secret_access_key, cluster_secret):
            assert secret not in run["log"] and secret not in json.dumps(run["xcoms"], default=str)
        # It was an application of its own on the cluster, with an executor of its own.
        (app,) = set(work.glob("app-*")) - apps
        assert any("CoarseGrainedExecutorBackend" in e.read_text(errors="replace") for e in app.glob("*/stderr"))
        ids = read_table(target, store, ["event_id"]).column(0).to_pylist()
        assert len(ids) == len(set(ids)) and set(ids) == set(written + submitted.valid_ids)
        dead = read_table(str(cfg.dlq_path(valkey_p)), store, ["partition", "position", "state", "message_id"])
        assert_dead_letters([Rows(**r) for r in dead.to_pylist() if r["state"] == "DEAD"], ids, bad | malformed)
        assert pending(client, valkey_p) == 0
        print(f"the ingest DAG through spark-submit: {time.monotonic() - step:.1f} s")
        # No application got the jars copied into its work directory: the worker's executors read the cache.
        assert not list(work.glob("app-*/*/*.jar"))
        print("work directories:", {a.name: sum(f.stat().st_size for f in a.rglob("*") if f.is_file())
                                    for a in sorted(work.glob("app-*"))})
    finally:
        down = cli(env, "services", "down", "--only", "spark_connect,spark_cluster", timeout=300)
        assert down.returncode == 0, down.stderr
