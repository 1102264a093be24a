"""The Connect server's Python worker daemon (deltadrain.runtime.python_daemon): pyspark's daemon that exits once
idle. Its decision is a pure function; the process is driven here as Spark drives it: stdin held open,
the listening port read from its stdout, a connection per worker."""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

from deltadrain.runtime.python_daemon import should_exit

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
