"""The processes a test starts: CLI drains (a local driver, or a Spark Connect client with `remote`),
runs held at a failpoint pause until the test releases them, their summaries, DAG runs, the cleanup
that kills whatever a failed test left running, and what a process listens on."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tests.support.pipelines import ROOT

# The drains a test started; the `no_drain_left` fixture kills those still running when it ends.
SPAWNED: list[subprocess.Popen] = []


def held_at(point: str, release: Path, at_most_ms: int = 180_000) -> dict[str, str]:
    """The environment that holds a CLI drain at the failpoint pause `point` until the test creates
    `release` (at most `at_most_ms`): the test releases it once its neighbour is done."""
    key = point.upper()
    return {f"DELTADRAIN_PAUSE_{key}_MS": str(at_most_ms), f"DELTADRAIN_PAUSE_{key}_UNTIL": str(release)}


def cli_drain(config: Path, pipeline: str, env: dict | None = None, timeout: int = 600,
              args: tuple[str, ...] = (), remote: bool = False) -> subprocess.Popen:
    """`deltadrain drain` in a process of its own. A local Spark driver (`--local`: a JVM of its own,
    seconds to start, whose death is the run's, even while the session's Connect server is up) unless
    `remote`: then a client of the session's Spark Connect server (the `spark_connect_server` fixture),
    as an Airflow task is, whose process a kill ends just as really."""
    remote_args = ("--remote",) if remote else () if "--remote" in args else ("--local",)
    proc = subprocess.Popen(
        [sys.executable, "-m", "deltadrain.cli", "--config", str(config), "drain", pipeline, *args, *remote_args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})}, cwd=ROOT)
    SPAWNED.append(proc)
    return proc


def wait_held(proc: subprocess.Popen, ready, timeout: float, what: str) -> None:
    """Wait until `ready()` while `proc`, a run held at a failpoint, still runs. Fails naming `what`:
    with the run's output when it exited (never blocks on a run still held), or after `timeout` s."""
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None and not ready():
        time.sleep(0.2)
    if proc.poll() is not None:
        out, err = proc.communicate()
        raise AssertionError(f"{what}: the run exited ({proc.returncode}): {(err or out or '')[-3000:]}")
    assert ready(), f"{what}: not within {timeout} s"


def kill_spawned() -> list[int]:
    """SIGKILL the drains still running (a test that failed before it released a held run, or before it
    read one's output): none of them goes on writing into the next test. Their pids."""
    killed = []
    while SPAWNED:
        proc = SPAWNED.pop()
        if proc.poll() is None:
            proc.kill()
            killed.append(proc.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.communicate(timeout=120)  # reaps it and closes its pipes (once its JVM has let go of them)
    return killed


def summary_of(stdout: str) -> dict:
    """The run summary: the CLI's JSON line, or the Spark jobs' `deltadrain-summary: {json}` line."""
    from deltadrain.jobs import SUMMARY_PREFIX

    lines = [line.removeprefix(SUMMARY_PREFIX) for line in stdout.splitlines()]
    return json.loads([line for line in lines if line.startswith("{")][-1])


# The settings a DAG run's Airflow reads when it is imported: a fork server started with other values
# cannot run it (`run_dag` starts a process of its own instead).
IMPORT_TIME = ("AIRFLOW", "OPENLINEAGE", "GX_", "PYTHONPATH")


class DagRunServer:
    """The test worker's fork server of DAG runs (tests/integration/dagrun.py --serve), started at the
    first DAG run with the worker's environment, stopped when the worker exits."""

    def __init__(self) -> None:
        import atexit
        import tempfile

        self.logs = Path(tempfile.mkdtemp(prefix="dagruns-"))
        self.env = dict(os.environ)
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.integration.dagrun", "--serve"], cwd=ROOT,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=self.env,
                                     stderr=(self.logs / "server.log").open("w"))
        atexit.register(self.proc.kill)
        self.runs = 0
        ready = self._line(600)
        assert ready == "READY", f"the DAG run server did not start: {ready!r}; {self.logs / 'server.log'}"

    def _line(self, timeout: float) -> str:
        import select

        assert self.proc.stdout is not None
        if not select.select([self.proc.stdout], [], [], timeout)[0]:
            return ""
        return self.proc.stdout.readline().strip()

    def serves(self, env: dict) -> bool:
        """Whether a DAG run in `env` may be forked from this server: it is alive, and every setting read
        at import time is the server's."""
        def read_at_import(e: dict) -> dict:
            return {k: v for k, v in e.items() if k.startswith(IMPORT_TIME)}

        return self.proc.poll() is None and read_at_import(env) == read_at_import(self.env)

    def run(self, dag_id: str, run_conf: dict | None, env: dict, result: Path, timeout: float) -> tuple[int, str]:
        """(exit code, output) of one DAG run forked from the server; its result goes to `result`."""
        assert self.proc.stdin is not None
        self.runs += 1
        log = self.logs / f"run{self.runs}.log"
        self.proc.stdin.write(json.dumps({"dag_id": dag_id, "conf": run_conf, "env": env, "cwd": str(ROOT),
                                          "log": str(log), "result": str(result)}) + "\n")
        self.proc.stdin.flush()
        pid = json.loads(self._line(60) or "null")
        assert pid, f"the DAG run server did not fork for {dag_id}; {self.logs / 'server.log'}"
        done = self._line(timeout)
        if not done:
            os.kill(pid["pid"], 9)
            self._line(60)  # the killed child's exit code: the server then waits for the next run
            raise AssertionError(f"dag.test of {dag_id} did not end within {timeout} s:\n{log.read_text()[-4000:]}")
        return json.loads(done)["rc"], log.read_text(errors="replace")


_SERVER: list[DagRunServer] = []


def run_dag(dag_id: str, run_conf: dict | None = None, env: dict | None = None) -> dict:
    """dag.test() in a process of its own (see tests/integration/dagrun.py): {run_id, state, states, xcoms,
    log}. Forked from the worker's DagRunServer when `env` (the test's own environment by default) reads
    at import time what the server read; else a new Python process."""
    import tempfile

    env = env or {**os.environ}
    if not _SERVER or _SERVER[0].proc.poll() is not None:
        _SERVER[:] = [DagRunServer()]
    with tempfile.TemporaryDirectory(prefix="dagrun-") as tmp:
        result = Path(tmp) / "result.json"
        if _SERVER[0].serves(env):
            _, output = _SERVER[0].run(dag_id, run_conf, env, result, timeout=900)
        else:
            args = [sys.executable, "-m", "tests.integration.dagrun", dag_id, str(result)]
            done = subprocess.run(args + ([json.dumps(run_conf)] if run_conf else []), capture_output=True,
                                  text=True, timeout=900, cwd=ROOT, env=env)
            output = done.stdout + done.stderr
        assert result.exists(), f"dag.test of {dag_id} wrote no result:\n{output[-8000:]}"
        found = json.loads(result.read_text())
    found["log"] = output
    return found


def run_or_killed(c, p, spark) -> dict | str:
    """One drain in this process: its summary, or "killed" when the transform stopped it as a SIGKILL
    would (failpoints.ABANDON)."""
    from dataclasses import asdict

    from deltadrain.catchup import drain
    from deltadrain.failpoints import Abandoned

    try:
        return asdict(drain(c, p, spark=spark))
    except Abandoned:
        return "killed"


def running(*words: str) -> list[int]:
    """The pids of processes whose command line holds all of `words`."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().decode(errors="replace")
        except OSError:
            continue
        if all(w in cmd for w in words):
            pids.append(int(pid))
    return pids


def _listening() -> dict[str, str]:
    """Socket inode -> local address (hex, as the kernel prints it) of every TCP socket in LISTEN."""
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A":
                found[fields[9]] = fields[1]
    return found


def _group_sockets(pgid: int) -> list[str]:
    """The socket inodes the processes of process group `pgid` hold (a service and its children)."""
    inodes = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.getpgid(int(pid)) != pgid:
                continue
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.append(target[8:-1])
        except OSError:  # gone, or a descriptor closed meanwhile
            continue
    return inodes


# 127.0.0.1 in /proc/net/tcp, and as an IPv4-mapped or the IPv6 loopback in /proc/net/tcp6.
LOOPBACK = {"0100007F", "0000000000000000FFFF00000100007F", "00000000000000000000000001000000"}


def listening_addresses(pgid: int) -> list[str]:
    """The local addresses (hex, as the kernel prints them) of the TCP sockets in LISTEN that the
    processes of process group `pgid` hold: an embedded service and every child it started."""
    listening = _listening()
    return [listening[i] for i in _group_sockets(pgid) if i in listening]


def beyond_loopback(addresses: list[str]) -> list[str]:
    return [a for a in addresses if a.split(":")[0] not in LOOPBACK]
