"""`deltadrain services`: idempotent up, clean down, clear errors; on a home and ports of its own."""

from __future__ import annotations

import socket
from pathlib import Path

import psutil
import pytest

from deltadrain.dev import services
from tests.support.services import cli, own_env, processes_under


def test_up_is_idempotent_and_down_leaves_no_process(tmp_path):
    env = own_env(tmp_path)
    home = Path(env["DELTADRAIN_HOME"])
    first = cli(env, "services", "up", "--only", "valkey,kafka")
    assert first.returncode == 0, first.stderr
    assert first.stdout.count("result=started") == 2
    pids = [line for line in first.stdout.splitlines() if "pid=" in line]
    second = cli(env, "services", "up", "--only", "valkey,kafka")
    assert second.returncode == 0 and second.stdout.count("result=already running") == 2
    assert [line.split("pid=")[1].split()[0] for line in second.stdout.splitlines() if "pid=" in line] == \
        [line.split("pid=")[1].split()[0] for line in pids]
    assert cli(env, "services", "status", "--only", "valkey,kafka").returncode == 0
    assert processes_under(home)
    down = cli(env, "services", "down")
    assert down.returncode == 0, down.stderr
    assert processes_under(home) == []
    assert cli(env, "services", "down").stdout.count("not running") == len(services.ALL)
    assert cli(env, "services", "status", "--only", "valkey").returncode == 3
    # And up again on the same state: Kafka storage is reused, not reformatted.
    again = cli(env, "services", "up", "--only", "valkey,kafka")
    assert again.returncode == 0, again.stderr
    assert cli(env, "services", "down").returncode == 0
    assert processes_under(home) == []


def test_a_port_taken_by_another_process_is_a_clear_error(tmp_path):
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        env = own_env(tmp_path, valkey=port)
        done = cli(env, "services", "up", "--only", "valkey")
    assert done.returncode == 1
    assert f"port {port}" in done.stderr and "taken by another process" in done.stderr
    assert "DELTADRAIN_VALKEY_PORT" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.slow
def test_airflow_standalone_up_down(tmp_path):
    env = own_env(tmp_path)
    home = Path(env["DELTADRAIN_HOME"])
    try:
        up = cli(env, "services", "up", "--only", "airflow", timeout=400)
        assert up.returncode == 0, up.stderr + up.stdout
        assert "Airflow UI: http://127.0.0.1:" in up.stdout
        status = cli(env, "services", "status", "--only", "airflow", "--json")
        assert status.returncode == 0 and '"running"' in status.stdout
        # bound to loopback only
        port = int(env["DELTADRAIN_AIRFLOW_PORT"])
        listening = {c.laddr.ip for c in psutil.net_connections("inet")
                     if c.status == psutil.CONN_LISTEN and c.laddr.port == port}
        assert listening == {"127.0.0.1"}, listening
    finally:
        cli(env, "services", "down", timeout=120)
    assert processes_under(home) == []


def test_a_bench_stops_only_the_server_it_started_and_drops_its_own_source(tmp_path, monkeypatch):
    """`deltadrain bench` starts Valkey or Kafka if needed (`bench.bench_source`, `services.running`): a
    server it started is stopped afterwards, one that was running is left running, and the bench's
    streams and pipeline keys are deleted even when a phase fails."""
    from deltadrain.dev import services
    from deltadrain.dev.bench import bench_source
    from deltadrain.dev.produce import produce
    from deltadrain.sources.valkey.client import valkey_client
    from deltadrain.sources.valkey.drain import failures_key
    from tests.support.valkey import make_pipeline, valkey_admin

    env = own_env(tmp_path)
    for key in ("DELTADRAIN_HOME", "DELTADRAIN_VALKEY_PORT"):
        monkeypatch.setenv(key, env[key])
    # The session's Valkey login is not this server's: the drains read the new home's login file.
    monkeypatch.delenv("AIRFLOW_CONN_DELTADRAIN_VALKEY")
    home = Path(env["DELTADRAIN_HOME"])
    _, cfg, p = make_pipeline(tmp_path, partitions=2)  # ports and home are read from the env when used
    failed = pytest.raises(RuntimeError, match="a phase failed")
    with failed, bench_source(cfg, p):
        assert services.FACTORIES["valkey"](cfg).status()["state"] == "running"
        produce(cfg, p, 50, seed=3)
        client = valkey_client(cfg, p)
        client.hset(failures_key(p.name), "x", "1")
        assert sum(client.xlen(s) for s in p.source.streams) == 50
        raise RuntimeError("a phase failed")
    assert processes_under(home) == []  # it started the server, so it stopped it

    services.up(cfg, ["valkey"])
    try:
        with bench_source(cfg, p):
            produce(cfg, p, 10, seed=4)
        client = valkey_client(cfg, p)
        assert services.FACTORIES["valkey"](cfg).status()["state"] == "running"  # not its server to stop
        assert client.exists(*p.source.streams) == 0
        assert list(valkey_admin().scan_iter(match=f"deltadrain:{{{p.name}}}:*")) == []
        assert valkey_admin().dbsize() == 0
    finally:
        services.down(cfg, ["valkey"])
    assert processes_under(home) == []
