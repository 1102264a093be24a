"""DAG runs for the tests: dag.test() of one DAG in a process of its own (tests/integration/dagrun.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_dag(dag_id: str, run_conf: dict | None = None, env: dict | None = None) -> dict:
    """dag.test() in a subprocess (see tests/integration/dagrun.py): {run_id, state, states, xcoms, log}."""
    args = [sys.executable, "-m", "tests.integration.dagrun", dag_id] + ([json.dumps(run_conf)] if run_conf else [])
    done = subprocess.run(args, capture_output=True, text=True, timeout=900, cwd=ROOT, env=env or {**os.environ})
    lines = [line for line in done.stdout.splitlines() if line.startswith("DAGRUN-RESULT ")]
    assert lines, f"dag.test of {dag_id} printed no result:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    result = json.loads(lines[-1].removeprefix("DAGRUN-RESULT "))
    result["log"] = done.stdout + done.stderr
    return result
