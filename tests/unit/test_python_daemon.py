"""The Python worker daemons: the Connect server's (deltadrain.runtime.python_daemon), pyspark's daemon that exits
once idle, and the one of deltadrain's other sessions (warm_daemon); both fork workers with deltadrain's task
modules imported. The exit decision is a pure function; the processes are driven here as Spark drives them:
stdin held open, the listening port read from their stdout, a connection per worker."""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

from deltadrain.runtime.python_daemon import should_exit, warm

INCLUDE = Path(__file__).resolve().parents[2] / "include"


def test_it_exits_only_when_idle_long_enough_with_no_worker_and_nobody_waiting():
    assert should_exit(121, 120, children=False, pending=False)
    assert not should_exit(119, 120, children=False, pending=False)
    assert not should_exit(500, 120, children=True, pending=False)
    assert not should_exit(500, 120, children=False, pending=True)


def test_the_daemon_keeps_its_worker_then_exits_once_idle():
    env = {**os.environ, "DELTADRAIN_PYTHON_DAEMON_IDLE_SECONDS": "2",
           "PYTHONPATH": os.pathsep.join([str(INCLUDE), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "deltadrain.runtime.python_daemon"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        (port,) = struct.unpack("!i", proc.stdout.read(4))
        worker = socket.create_connection(("127.0.0.1", port), timeout=30)
        (pid,) = struct.unpack("!i", worker.recv(4))  # the forked worker's pid, as Spark reads it
        assert pid > 0
        time.sleep(5)  # more than twice the idle limit: its worker still runs, so it stays
        assert proc.poll() is None, proc.stderr.read().decode()
        worker.close()  # the worker ends; the daemon has nothing left
        deadline = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert proc.poll() is not None, "the idle daemon did not exit"
        assert b"idle for" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def mapped_by_worker(module: str) -> str:
    """/proc/<pid>/maps of a worker forked by `python -m module`, before it ran any task."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(INCLUDE), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", module], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    try:
        (port,) = struct.unpack("!i", proc.stdout.read(4))
        worker = socket.create_connection(("127.0.0.1", port), timeout=30)
        (pid,) = struct.unpack("!i", worker.recv(4))
        maps = Path(f"/proc/{pid}/maps").read_text()
        worker.close()
        return maps
    finally:
        proc.kill()
        proc.wait()


def test_workers_of_deltadrains_daemons_are_forked_with_the_task_modules_imported():
    # pydantic's compiled core is loaded by importing deltadrain's config, which the drain modules do: a worker
    # that has it mapped before any task ran got it from its daemon. pyspark's own daemon's workers do not.
    for module in ("deltadrain.runtime.warm_daemon", "deltadrain.runtime.python_daemon"):
        assert "_pydantic_core" in mapped_by_worker(module), module
    assert "_pydantic_core" not in mapped_by_worker("pyspark.daemon")


def test_a_module_that_does_not_import_is_left_to_the_task(capsys):
    assert warm(("deltadrain.no_such_module", "json")) == ["json"]
    assert "could not import deltadrain.no_such_module in advance" in capsys.readouterr().err


def test_sessions_name_the_warm_daemon_and_the_connect_server_its_own():
    from deltadrain.runtime.session import connect_server_conf, spark_conf

    assert spark_conf()["spark.python.daemon.module"] == "deltadrain.runtime.warm_daemon"
    assert connect_server_conf(15002)["spark.python.daemon.module"] == "deltadrain.runtime.python_daemon"
