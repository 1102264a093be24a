"""The CLI on real services: a drain runs on the Spark Connect server that is up (and says so), in a
local driver with --local; the commands the demo and `status` print for a user to run next run as
printed, against this config and home, not the defaults."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from deltadrain.config.embedded import ports
from tests.support.pipelines import ROOT
from tests.support.processes import summary_of

CLI = [sys.executable, "-m", "deltadrain.cli"]


def drain(path, name: str, *flags: str) -> tuple[dict, str]:
    done = subprocess.run([*CLI, "--config", str(path), "drain", name, *flags], capture_output=True, text=True,
                          timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return summary_of(done.stdout), done.stderr


@pytest.mark.slow
def test_a_cli_drain_runs_on_the_server_that_is_up_and_in_a_local_driver_with_local(
        spark_connect_server, valkey_server, cfg, tmp_path):
    from deltadrain.dev.produce import produce
    from tests.support.valkey import make_pipeline

    path, c, p = make_pipeline(tmp_path, min_idle_ms=0)
    server = f"on the Spark Connect server at 127.0.0.1:{ports(cfg).spark_connect}"
    produce(c, p, 3, seed=71)
    summary, err = drain(path, p.name)
    assert (summary["outcome"], summary["written"], summary["spark"]) == ("committed", 3, server)
    assert f"deltadrain: drain of '{p.name}' runs {server}" in err  # said before the session starts
    produce(c, p, 2, seed=72, start=3)
    summary, err = drain(path, p.name, "--local")
    assert (summary["outcome"], summary["written"], summary["spark"]) == ("committed", 2, "in a local driver (--local)")
    assert f"deltadrain: drain of '{p.name}' runs in a local driver (--local)" in err


def printed(text: str) -> list[str]:
    """The commands in backticks, or after the demo's labels, that start with deltadrain (or its env)."""
    found = re.findall(r"`([^`]*deltadrain [^`]*)`", text)
    found += [line.split(":", 1)[1].strip() for line in text.splitlines() if ".venv/bin/deltadrain" in line]
    return found


def run_printed(command: str) -> subprocess.CompletedProcess:
    """A printed command as a shell runs it from the project's root: its assignments as the environment."""
    words = shlex.split(command)
    at = next(i for i, w in enumerate(words) if w.endswith("deltadrain"))
    env = {**os.environ, **dict(w.split("=", 1) for w in words[:at])}
    return subprocess.run([*CLI, *words[at + 1:]], capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)


def test_the_commands_the_demo_and_status_print_run_as_printed_on_this_config(valkey_server, tmp_path):
    from deltadrain.dev.demo import where_to_look
    from deltadrain.dev.produce import produce
    from deltadrain.names import ingest_dag_id
    from deltadrain.observe.status import pipeline_status
    from tests.support.valkey import make_pipeline

    path, c, p = make_pipeline(tmp_path, min_idle_ms=0)
    produce(c, p, 7, seed=73)
    lines = where_to_look(c, p, pipeline_status(c, p), ingest_dag_id(p.name))
    commands = printed("\n".join(lines))
    assert [cmd.split()[-2:] for cmd in commands] == [["status", p.name], ["list", p.name], ["services", "down"]]
    assert all(f"--config {path}" in cmd and f"DELTADRAIN_HOME={os.environ['DELTADRAIN_HOME']}" in cmd
               for cmd in commands), commands
    # `services down` would stop this session's services: it only has to name them (above).
    status = run_printed(commands[0])
    assert status.returncode == 0, status.stderr[-2000:]
    assert re.search(r"PENDING\s+7\b", status.stdout), status.stdout
    assert "deleted" not in status.stdout  # the default config's Valkey would not know these streams
    dlq = run_printed(commands[1])
    assert dlq.returncode == 0 and dlq.stdout.startswith(f"0 dead letter(s) of {p.name}"), dlq.stderr[-2000:]
    # The note of a pipeline never run names its drain with the same config and home.
    as_json = run_printed(f"{commands[0]} --json")
    notes = [n["note"] for n in json.loads(as_json.stdout)["notes"]]
    [never] = [printed(n) for n in notes if n.startswith("never run")]
    assert never == [f"DELTADRAIN_HOME={os.environ['DELTADRAIN_HOME']} deltadrain --config {path} drain {p.name}"]
