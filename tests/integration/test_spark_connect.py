"""The embedded Spark Connect server, started as `deltadrain services up` starts it: Delta MERGEs with a
Delta app transaction through a client session, sessions that keep their confs apart under concurrency,
the venv's Python in its workers, loopback only, `services status|down` through the CLI; and drains as
its clients: two pipelines at once, a client SIGKILLed during its MERGE, the server SIGKILLed mid-batch."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest

from deltadrain.config.embedded import SPARK_CONNECT_CONN_ID, spark_connect_url
from deltadrain.runtime.session import connect_session
from tests.support.pipelines import ROOT
from tests.support.services import cli, own_env, processes_under

pytestmark = pytest.mark.slow

TXN_APP = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"


@pytest.fixture
def client(spark_connect_server, cfg, monkeypatch):
    """New Connect sessions on the session's server; stopped after the test. A Connect session makes this
    process a Connect client (pyspark's SPARK_CONNECT_MODE_ENABLED): that mark is taken back afterwards,
    the tests after this one start local drivers in this process."""
    monkeypatch.setenv("SPARK_CONNECT_MODE_ENABLED", "1")
    made = []

    def new_session():
        made.append(connect_session(spark_connect_url(cfg)))
        return made[-1]

    yield new_session
    for session in made:
        session.stop()


def create_table(session, path: Path) -> None:
    session.sql(f"CREATE TABLE delta.`{path}` (id STRING, v INT) USING delta").collect()


def merge(session, path: Path, app: str, version: int, ids: list[str]) -> None:
    """An insert-only MERGE on the id, committed with the Delta app transaction (app, version)."""
    session.conf.set(TXN_APP, app)
    session.conf.set(TXN_VERSION, str(version))
    # A temp view is the session's own too: the two sessions of a test both name theirs `batch`.
    session.createDataFrame([(i, version) for i in ids], "id string, v int").createOrReplaceTempView("batch")
    session.sql(f"MERGE INTO delta.`{path}` t USING batch s ON t.id = s.id "
                "WHEN NOT MATCHED THEN INSERT *").collect()


def txns_per_commit(path: Path) -> list[dict]:
    """The app transaction each commit of the table carries, read from its log (None when it has none)."""
    out = []
    for commit in sorted((path / "_delta_log").glob("*.json")):
        actions = [json.loads(line) for line in commit.read_text().splitlines() if line.strip()]
        out.append(next((a["txn"] for a in actions if "txn" in a), None))
    return out


def test_a_merge_through_connect_commits_its_app_transaction_once(client, tmp_path):
    from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook
    from deltalake import DeltaTable

    # The URL Airflow's own hook makes of the connection `services up` gives the embedded Airflow.
    url = SparkConnectHook(conn_id=SPARK_CONNECT_CONN_ID).get_connection_url()
    session = connect_session(url)
    try:
        assert session.conf.get("spark.databricks.delta.snapshotPartitions") == "4"
        path = tmp_path / "t"
        create_table(session, path)
        merge(session, path, "pipe-a", 7, ["a", "b"])
        # The same app transaction again, with other rows: Delta skips it, the table is unchanged.
        merge(session, path, "pipe-a", 7, ["c"])
        merge(session, path, "pipe-a", 8, ["b", "d"])
    finally:
        session.stop()
    table = DeltaTable(str(path))
    assert table.transaction_version("pipe-a") == 8
    assert sorted(table.to_pyarrow_table().column("id").to_pylist()) == ["a", "b", "d"]
    assert [t and (t["appId"], t["version"]) for t in txns_per_commit(path)] == \
        [None, ("pipe-a", 7), ("pipe-a", 8)]


def test_concurrent_sessions_on_one_server_keep_their_own_confs(client, tmp_path):
    """Two threads, each its own session, app id and table: each sets its confs, waits for the other to
    set its own, then both MERGE at once. A conf shared between the sessions would put one's app id (or
    version) on the other's commit."""
    from deltalake import DeltaTable

    rounds, gate, errors = 3, threading.Barrier(2, timeout=120), []
    apps = {"pipe-a": (tmp_path / "a", 100), "pipe-b": (tmp_path / "b", 200)}

    def run(app: str) -> None:
        path, base = apps[app]
        try:
            session = client()
            create_table(session, path)
            for r in range(rounds):
                session.conf.set(TXN_APP, app)
                session.conf.set(TXN_VERSION, str(base + r))
                gate.wait()  # both sessions have set theirs
                assert session.conf.get(TXN_APP) == app
                merge(session, path, app, base + r, [f"{app}-{r}"])
                gate.wait()
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
            gate.abort()

    threads = [threading.Thread(target=run, args=(app,)) for app in apps]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    for app, (path, base) in apps.items():
        other = next(a for a in apps if a != app)
        table = DeltaTable(str(path))
        assert table.transaction_version(app) == base + rounds - 1
        assert table.transaction_version(other) is None
        assert [t and (t["appId"], t["version"]) for t in txns_per_commit(path)] == \
            [None, *[(app, base + r) for r in range(rounds)]]
        assert len(table.to_pyarrow_table()) == rounds


def test_its_python_workers_run_the_projects_interpreter_under_a_daemon_that_ends_when_idle(client,
                                                                                            spark_connect_server):
    import sys

    import psutil
    from pyspark.sql.functions import udf

    session = client()  # before the UDF: pyspark reads its Arrow setting from the active session

    @udf("string")
    def interpreter(_):
        import sys

        return sys.executable

    assert session.range(1).select(interpreter("id")).first()[0] == sys.executable
    # Spark 4.1 keeps a daemon per session for the server's life; the server's is one that exits once
    # idle (docs/spark-connect.md; tests/unit/test_python_daemon.py drives its exit).
    def command(p: psutil.Process) -> list[str]:
        try:
            return p.cmdline()
        except psutil.Error:  # exited since, or a worker that exited and awaits its reaping
            return []

    under = [command(p) for p in psutil.Process(spark_connect_server.pid()).children(recursive=True)]
    assert [c for c in under if "deltadrain.runtime.python_daemon" in c]
    assert not [c for c in under if "pyspark.daemon" in c]


def test_it_listens_on_loopback_only_and_status_shows_it(spark_connect_server, cfg):
    from deltadrain.dev import services

    (row,) = services.status(cfg, ["spark_connect"])
    assert row["state"] == "running" and row["address"] == spark_connect_url(cfg)
    server = psutil.Process(spark_connect_server.pid())
    pids = {server.pid, *(p.pid for p in server.children(recursive=True))}
    # Java listens on dual-stack sockets: 127.0.0.1 shows as ::ffff:127.0.0.1.
    listening = {(c.laddr.ip.removeprefix("::ffff:"), c.laddr.port) for c in psutil.net_connections("inet")
                 if c.status == psutil.CONN_LISTEN and c.pid in pids}
    assert ("127.0.0.1", spark_connect_server.ports[0]) in listening
    assert {ip for ip, _ in listening} == {"127.0.0.1"}, listening  # the driver's RPC and block manager too


def test_services_up_status_down_through_the_cli(tmp_path):
    """A server of its own (home, port): `up` twice (the second finds it), `status`, `down` closes the port
    and leaves no process."""
    from deltadrain.dev.services.process import port_open

    env = own_env(tmp_path)
    home, port = Path(env["DELTADRAIN_HOME"]), int(env["DELTADRAIN_SPARK_CONNECT_PORT"])
    try:
        up = cli(env, "services", "up", "--only", "spark_connect")
        assert up.returncode == 0, up.stderr + up.stdout
        assert "result=started" in up.stdout and f"address=sc://127.0.0.1:{port}" in up.stdout
        # Warmed before it was reported: two batches committed on a scratch table, which is gone.
        assert re.search(r"warm_up=[0-9.]+ s \(2 batches of 5000 rows", up.stdout), up.stdout
        assert not (home / "services" / "spark_connect" / "warm-up").exists()
        again = cli(env, "services", "up", "--only", "spark_connect")
        assert again.returncode == 0 and "result=already running" in again.stdout
        status = cli(env, "services", "status", "--only", "spark_connect", "--json")
        assert status.returncode == 0, status.stderr
        (row,) = json.loads(status.stdout)
        assert row["state"] == "running" and row["ports"] == [port]
        assert Path(row["log"]) == home / "services" / "spark_connect" / "spark_connect.log"
        assert "Spark Connect server started" in Path(row["log"]).read_text()
    finally:
        down = cli(env, "services", "down", "--only", "spark_connect", timeout=120)
    assert down.returncode == 0 and "result=stopped" in down.stdout, down.stderr
    assert not port_open(port)
    assert processes_under(home) == []
    assert cli(env, "services", "status", "--only", "spark_connect").returncode == 3


# -- drains through the server -------------------------------------------------------------------------

def remote_drain(path: Path, pipeline: str, url: str, env: dict | None = None, args: tuple[str, ...] = ()):
    """`deltadrain drain --remote URL` in a process of its own: a Connect client as an Airflow task is."""
    from tests.support.processes import cli_drain

    return cli_drain(path, pipeline, env, args=("--remote", url, *args))


def summary_of(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def test_a_valkey_and_a_kafka_pipeline_drain_at_once_on_one_server_each_exactly_once(
        spark_connect_server, kafka_broker, valkey_server, cfg, tmp_path, spark):
    """Two clients, two pipelines, one server, at the same moment: each run's app transaction and views
    are its session's, so each table ends with its own messages once and its own checkpoint."""
    from deltadrain.dev.produce import MALFORMED_KINDS, produce
    from deltadrain.lake.checkpoint import read_checkpoint
    from deltadrain.sources.valkey.client import valkey_client
    from tests.support import kafka
    from tests.support.valkey import assert_exactly_once, make_pipeline

    url = spark_connect_url(cfg)
    for side in ("v", "k"):
        (tmp_path / side).mkdir()
    vpath, vc, vp = make_pipeline(tmp_path / "v", min_idle_ms=0, batch_cap=2000)
    kpath, kc, kp = kafka.make_kafka_pipeline(tmp_path / "k", partitions=2, batch_cap=2000)
    vsent = produce(vc, vp, 1500, seed=51, malformed_ratio=0.05)
    ksent = produce(kc, kp, 1500, seed=52, malformed_ratio=0.05)
    runs = [remote_drain(vpath, vp.name, url), remote_drain(kpath, kp.name, url)]
    outs = [run.communicate(timeout=600) for run in runs]
    for run, (_, err) in zip(runs, outs, strict=True):
        assert run.returncode == 0, err[-3000:]
    vsum, ksum = (summary_of(out) for out, _ in outs)
    assert (vsum["outcome"], vsum["batch"], vsum["claimed"]) == ("committed", 1, 1500)
    assert (ksum["outcome"], ksum["batch"], ksum["claimed"]) == ("committed", 1, 1500)
    client = valkey_client(vc, vp)
    assert_exactly_once(spark, vc, vp, client, vsent.valid_ids, vsent.bad_places(MALFORMED_KINDS))
    valid, fallback, bad = kafka.expected_counts(ksent)
    kafka.assert_exactly_once(spark, kc, kp, valid, fallback, bad)
    assert read_checkpoint(spark, str(kc.target_path(kp)), kp.name).positions == kafka.end_offsets(kc, kp)
    # Each commit carries its own pipeline's app transaction and no other.
    from deltalake import DeltaTable

    for c, p, other in ((vc, vp, kp), (kc, kp, vp)):
        table = DeltaTable(str(c.target_path(p)))
        assert table.transaction_version(p.name) == 1 and table.transaction_version(other.name) is None
    # The other Spark commands run on the server too: a replay's dry run finds the dead letters, a
    # maintenance run compacts the table.
    def remote(config: Path, *argv: str) -> dict | list:
        done = subprocess.run([sys.executable, "-m", "deltadrain.cli", "--config", str(config), *argv, "--json",
                               "--remote", url], capture_output=True, text=True, timeout=600, cwd=ROOT)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout[done.stdout.index("{" if argv[0] == "replay" else "["):])

    dead = len(vsent.bad_places(MALFORMED_KINDS))
    assert dead and remote(vpath, "replay", vp.name)["selected"] == dead
    (summary,) = remote(kpath, "maintain", kp.name)
    target = next(t for t in summary["tables"] if t["path"] == str(kc.target_path(kp)))
    assert target["skipped"] is None and 1 <= target["files_after"] <= target["files_before"], summary


def test_a_client_killed_during_its_merge_loses_and_doubles_nothing(spark_connect_server, valkey_server, cfg,
                                                                      tmp_path, spark):
    """The task's process SIGKILLed while the server runs its MERGE (into the table its first batch made):
    the server may commit after the client is gone, while the next run already drains. Either way every
    message lands once and nothing stays pending."""
    from deltadrain.dev.produce import MALFORMED_KINDS, produce
    from deltadrain.failpoints import fired
    from deltadrain.lake.checkpoint import find_commit
    from deltadrain.sources.valkey.client import valkey_client
    from tests.support.valkey import assert_exactly_once, drain_until_done, make_pipeline

    path, c, p = make_pipeline(tmp_path, min_idle_ms=0, batch_cap=1500, partitions=1)
    client = valkey_client(c, p)
    sent = produce(c, p, 3000, seed=53, malformed_ratio=0.05)
    env = {"DELTADRAIN_FAILPOINT": "during_merge", "DELTADRAIN_FAILPOINT_SKIP": "1",
           "DELTADRAIN_FAILPOINT_DELAY_MS": "300"}
    killed = remote_drain(path, p.name, spark_connect_url(cfg), env, args=("--max-batches", "2"))
    _, err = killed.communicate(timeout=600)
    assert killed.returncode == -9 and fired("during_merge") in err, err[-3000:]
    drain_until_done(c, p, spark, client)  # a local driver: a competing writer to the server's MERGE
    # Whoever committed batch 2 (the killed client's MERGE or the next run), its rows are in the table once.
    assert find_commit(str(c.target_path(p)), p.name, 2) is not None
    assert_exactly_once(spark, c, p, client, sent.valid_ids, sent.bad_places(MALFORMED_KINDS))


def test_a_server_killed_mid_batch_fails_the_run_clearly_and_after_up_the_next_runs_finish_once(
        spark_connect_server, valkey_server, cfg, tmp_path, spark):
    """The server SIGKILLed while a run holds its claims (held before its commit), then started again, as
    `services up` does: the run fails with the server's error instead of hanging, commits nothing, and the
    next run on the new server drains everything once."""
    from deltadrain.dev.produce import MALFORMED_KINDS, produce
    from deltadrain.lake.checkpoint import read_checkpoint
    from deltadrain.lake.delta import exists
    from deltadrain.sources.valkey.client import valkey_client
    from tests.conftest import start_connect_server
    from tests.support.processes import wait_held
    from tests.support.valkey import assert_exactly_once, lag, make_pipeline, pending

    path, c, p = make_pipeline(tmp_path, min_idle_ms=0, batch_cap=5000, partitions=2)
    client = valkey_client(c, p)
    sent = produce(c, p, 2000, seed=54, malformed_ratio=0.05)
    release = tmp_path / "release"
    url = spark_connect_url(cfg)
    held = remote_drain(path, p.name, url, {"DELTADRAIN_PAUSE_BEFORE_COMMIT_MS": "300000",
                                            "DELTADRAIN_PAUSE_BEFORE_COMMIT_UNTIL": str(release)})
    # Held before its commit: its claims made, its dead letters written.
    wait_held(held, lambda: pending(client, p) == 2000 and exists(str(c.dlq_path(p))), 300, "the run's claims")
    server = psutil.Process(spark_connect_server.pid())
    family = [server, *server.children(recursive=True)]
    for proc in family:
        proc.kill()
    psutil.wait_procs(family, timeout=30)
    assert start_connect_server(cfg)[0]["result"] == "started"  # as the session's fixture starts it
    release.touch()
    out, err = held.communicate(timeout=300)
    assert held.returncode != 0, out
    error = err.strip().splitlines()[-1]
    assert error.startswith("deltadrain: error: the Spark Connect server went away during the run"), err[-3000:]
    assert read_checkpoint(spark, str(c.target_path(p)), p.name).batch == 0
    assert pending(client, p) == 2000  # nothing acknowledged
    # The next runs, on the new server: after a run that died they read half of what it read at a time.
    outcomes = []
    while pending(client, p) or lag(client, p):
        assert len(outcomes) < 6, outcomes
        again = remote_drain(path, p.name, url, args=("--max-batches", "4"))
        out, err = again.communicate(timeout=600)
        assert again.returncode == 0, err[-3000:]
        outcomes.append(summary_of(out)["outcome"])
    assert outcomes[0] == "committed"
    assert_exactly_once(spark, c, p, client, sent.valid_ids, sent.bad_places(MALFORMED_KINDS))


def test_a_session_collected_while_another_runs_a_query_does_not_hang_the_process(client):
    """pyspark's client close shuts down the release pool every Connect client of the process shares, and
    a collected session closes its client from `__del__`, which the collector may run inside that pool's
    `submit`, under the pool's lock: the process then hung for good (a drain waiting, the server idle).
    Here `__del__` runs under that lock, as it did then; deltadrain's sessions close their own channel only."""
    import threading

    from pyspark.sql.connect.client.reattach import ExecutePlanResponseReattachableIterator as Reattach

    gone, live = client(), client()
    assert gone.range(3).count() == 3
    gone.stop()
    pool = Reattach._get_or_create_release_thread_pool()
    finished = threading.Event()

    def collected_inside_submit():
        with pool._shutdown_lock:  # what ThreadPoolExecutor.submit holds while it starts a thread
            gone.__del__()
        finished.set()

    threading.Thread(target=collected_inside_submit, daemon=True).start()
    if not finished.wait(30):
        pool._shutdown_lock.release()  # lets the stuck thread go, or the fixture's stop() would hang too
        pytest.fail("a session's __del__ under the release pool's lock hung")
    assert Reattach._release_thread_pool_instance is pool  # still there, still taking work
    assert live.range(5).count() == 5
