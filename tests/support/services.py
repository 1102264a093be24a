"""The CLI and `deltadrain services` on a home and ports of a test's own: what the tests of the embedded
services (test_services, test_object_store, test_spark_connect, test_s3_cluster) share."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]


def own_env(tmp_path: Path, **ports: int) -> dict:
    """The process environment with a DELTADRAIN_HOME under `tmp_path` and free ports of its own (or
    the ones given, by service: `valkey=6399`): services started in it are not the session's."""
    env = {**os.environ, "DELTADRAIN_HOME": str(tmp_path / "home")}
    env.pop("AIRFLOW_CONN_DELTADRAIN_VALKEY", None)  # the session's Valkey login; the new home makes its own
    for name in ("VALKEY", "KAFKA", "KAFKA_CONTROLLER", "KAFKA_SASL", "AIRFLOW", "SPARK_CONNECT", "S3"):
        env[f"DELTADRAIN_{name}_PORT"] = str(ports.get(name.lower(), free_port()))
    return env


def cli(env: dict, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """`deltadrain ARGS` in a process of its own, in `env`."""
    return subprocess.run([sys.executable, "-m", "deltadrain.cli", *args], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=ROOT)


def up_unwarmed(env: dict, *names: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """`deltadrain services up --only NAMES --no-warm-up --json` in `env`: a Spark Connect server it starts is
    not warmed up, for a test whose own drains are the server's first batches anyway (the warm-up itself is
    test_spark_connect's). Its rows as JSON on stdout."""
    return cli(env, "services", "up", "--only", ",".join(names), "--no-warm-up", "--json", timeout=timeout)


def processes_under(home: Path) -> list[str]:
    """Live processes whose working directory is inside `home` (every service runs there)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0]
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (FileNotFoundError, PermissionError, ProcessLookupError, IndexError):
            continue
        if cwd.startswith(str(home)) and state != "Z":
            found.append(f"{pid} {cmd[:120]}")
    return found
