"""The embedded Spark Connect server, started as `deltadrain services up` starts it: Delta MERGEs with a
Delta app transaction through a client session, sessions that keep their confs apart under concurrency,
the venv's Python in its workers, loopback only, and `services status|down` through the CLI."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import psutil
import pytest

from deltadrain.embedded import SPARK_CONNECT_CONN_ID, spark_connect_url
from deltadrain.spark import connect_session
from tests.integration.test_services import _own_env, cli, processes_under

# About 100 s on two cores: the server's start, a cold server's first MERGEs, a second server for the CLI.
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
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
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


def test_its_python_workers_run_the_projects_interpreter(client):
    import sys

    from pyspark.sql.functions import udf

    session = client()  # before the UDF: pyspark reads its Arrow setting from the active session

    @udf("string")
    def interpreter(_):
        import sys

        return sys.executable

    assert session.range(1).select(interpreter("id")).first()[0] == sys.executable


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

    env = _own_env(tmp_path)
    home, port = Path(env["DELTADRAIN_HOME"]), int(env["DELTADRAIN_SPARK_CONNECT_PORT"])
    try:
        up = cli(env, "services", "up", "--only", "spark_connect")
        assert up.returncode == 0, up.stderr + up.stdout
        assert "result=started" in up.stdout and f"address=sc://127.0.0.1:{port}" in up.stdout
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
