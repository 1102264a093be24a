"""A small supervisor for the embedded services: pid files, port checks, health waits, clean stops.

Each service runs in its own session (process group) so that `down` can stop it and every child
it started (airflow standalone starts several) and leave no process behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from deltadrain.errors import ServiceError
from deltadrain.paths import command_line


def port_open(port: int, host: str = "127.0.0.1", timeout: float = 0.3) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        return s.connect_ex((host, port)) == 0


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours still answers kill(0); reap it if it is ours.
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    state = _state_of(pid)
    return state is not None and state != "Z"


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return any(_pgid_of(p) == pgid and _state_of(p) != "Z" for p in all_pids())


def all_pids() -> list[int]:
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]


def proc_stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state, ppid, pgrp, ...), None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1].split()
    except (FileNotFoundError, IndexError, ProcessLookupError):
        return None


def _pgid_of(pid: int) -> int | None:
    st = proc_stat(pid)
    return int(st[2]) if st else None


def _state_of(pid: int) -> str | None:
    st = proc_stat(pid)
    return st[0] if st else None


@dataclass
class Service:
    """One embedded service: how to start it, which ports it owns, how to tell it is healthy."""

    name: str
    home: Path
    ports: list[int]
    command: Callable[[], list[str]]
    healthy: Callable[[], bool]
    env: dict[str, str | None] = field(default_factory=dict)  # None: not passed on from ours
    prepare: Callable[[], None] | None = None
    start_timeout: float = 60.0
    stop_timeout: float = 30.0
    describe: Callable[[], str] | None = None
    # What `down` sends first, to the process group (PostgreSQL's fast shutdown is SIGINT).
    stop_signal: int = signal.SIGTERM

    def port_setting(self, port: int) -> str:
        """The config key and environment variable that choose `port` (Kafka owns three)."""
        kinds = ("kafka", "kafka_controller", "kafka_sasl") if self.name == "kafka" else (self.name,)
        kind = kinds[min(self.ports.index(port), len(kinds) - 1)]
        return f"services.{kind}_port in the config or DELTADRAIN_{kind.upper()}_PORT"

    @property
    def pid_file(self) -> Path:
        return self.home / f"{self.name}.pid"

    @property
    def log_file(self) -> Path:
        return self.home / f"{self.name}.log"

    def pid(self) -> int | None:
        try:
            pid = int(self.pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        return pid if pid_alive(pid) or group_alive(pid) else None

    def status(self) -> dict:
        pid = self.pid()
        state = "stopped"
        if pid is not None:
            state = "running" if self.healthy() else "unhealthy"
        info = {"service": self.name, "state": state, "pid": pid, "ports": self.ports,
                "log": str(self.log_file)}
        if self.describe and state == "running":
            info["address"] = self.describe()
        return info

    def up(self) -> str:
        """Start unless already running and healthy; idempotent."""
        pid = self.pid()
        if pid is not None:
            if self._wait_healthy(pid, self.start_timeout):
                return "already running"
            raise ServiceError(f"{self.name} (pid {pid}) is running but not healthy; see {self.log_file} "
                               f"or run `{command_line('services down')}` first")
        taken = [p for p in self.ports if port_open(p)]
        if taken:
            raise ServiceError(
                f"cannot start {self.name}: port {taken[0]} on 127.0.0.1 is taken by another process. "
                f"Stop it, or choose another port ({self.port_setting(taken[0])}).")
        self.home.mkdir(parents=True, exist_ok=True)
        if self.prepare:
            self.prepare()
        env = {key: value for key, value in {**os.environ, **self.env}.items() if value is not None}
        with open(self.log_file, "ab") as log:
            proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, env=env,
                                    cwd=self.home, start_new_session=True, stdin=subprocess.DEVNULL)
        self.pid_file.write_text(str(proc.pid))
        if not self._wait_healthy(proc.pid, self.start_timeout, proc):
            self.down()
            raise ServiceError(f"{self.name} did not become healthy within {self.start_timeout:.0f}s; "
                               f"last log lines ({self.log_file}):\n{self._log_tail()}")
        return "started"

    def down(self) -> str:
        pid = self.pid()
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            return "not running"
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, self.stop_signal)
        deadline = time.monotonic() + self.stop_timeout
        while time.monotonic() < deadline and (pid_alive(pid) or group_alive(pid)):
            time.sleep(0.2)
        if pid_alive(pid) or group_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and group_alive(pid):
                time.sleep(0.1)
        # A JVM that exited stays a zombie, its ports still open, while the kernel ends its threads (longer on
        # a busy machine): "stopped" means that a new `up` can bind them.
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(port_open(port) for port in self.ports):
            time.sleep(0.2)
        self.pid_file.unlink(missing_ok=True)
        return "stopped"

    def _wait_healthy(self, pid: int, timeout: float, proc: subprocess.Popen | None = None) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                return False
            if proc is None and not (pid_alive(pid) or group_alive(pid)):
                return False
            try:
                if self.healthy():
                    return True
            except Exception:
                pass
            time.sleep(0.5)
        return False

    def _log_tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"
