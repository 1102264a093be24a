"""Helpers for drain tests: a fresh pipeline per test, drains to completion, and the exactly-once check
made by reading the Delta tables back."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

from deltadrain.catchup import drain
from deltadrain.config import load_config
from deltadrain.sources.valkey.reap import reap

ROOT = Path(__file__).resolve().parents[2]

HANDLER, IDENTITY = "deltadrain.transforms.sample_orders", "deltadrain.transforms.identity"
# The identity transform takes the drain's shortcut (no pass of its own before the MERGE): the
# tests that judge counts, duplicates and kills run both ways.
BOTH_TRANSFORMS = pytest.mark.parametrize("transform", [HANDLER, IDENTITY], ids=["handler", "identity"])


def held_at(point: str, release: Path, at_most_ms: int = 180_000) -> dict[str, str]:
    """The environment that holds a CLI drain at the failpoint pause `point` until the test creates
    `release` (at most `at_most_ms`): the test releases it once its neighbour is done."""
    key = point.upper()
    return {f"DELTADRAIN_PAUSE_{key}_MS": str(at_most_ms), f"DELTADRAIN_PAUSE_{key}_UNTIL": str(release)}


def valkey_admin():
    """The embedded Valkey's admin client: what an operator does (trim, delete, change the ACL) and
    the drains' ACL user may not."""
    from deltadrain.dev.services import valkey_admin as admin

    return admin(load_config())


def make_pipeline(tmp_path: Path, **overrides):
    """A config file with one Valkey pipeline of its own (own streams, tables, group); returns (path, cfg, p).
    `executor`: the config's spark.executor (the DAGs' way to run their jobs), else its default."""
    data = yaml.safe_load((ROOT / "config" / "pipelines.yaml").read_text())
    if executor := overrides.pop("executor", None):
        data["spark"] = {**data.get("spark", {}), "executor": executor}
    name = f"t_{uuid.uuid4().hex[:8]}"
    pipe = next(p for p in data["pipelines"] if p["source"]["kind"] == "valkey")
    pipe["name"] = name
    pipe["source"]["streams"] = [f"{name}:{{{i}}}" for i in range(overrides.pop("partitions", 4))]
    pipe["source"].update(overrides.pop("source", {}))
    pipe["target"]["path"] = name
    pipe.pop("quality", None)
    pipe.update(overrides)
    return write_config(tmp_path, data, pipe)


def write_config(tmp_path: Path, data: dict, pipe: dict):
    """`data` (the example config) with `pipe` as its only pipeline and tables under tmp_path: (path, cfg, p)."""
    data["pipelines"] = [pipe]
    data["data_dir"] = str(tmp_path / "lake")
    path = tmp_path / "pipelines.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    cfg = load_config(path)
    return path, cfg, cfg.pipeline(pipe["name"])


def set_source(path: Path, **fields):
    """Change the source settings of the config file's only pipeline, as an operator edits the YAML:
    returns the reloaded (cfg, pipeline)."""
    data = yaml.safe_load(path.read_text())
    data["pipelines"][0]["source"].update(fields)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    cfg = load_config(path)
    return cfg, cfg.pipeline(data["pipelines"][0]["name"])


def clean_up_delta_log(spark, target: str, version: int) -> None:
    """Age the table's log, then let Delta itself checkpoint and remove expired commit files; asserts
    that commit `version` is gone (so a checkpoint reader must do without its commitInfo)."""
    spark.sql(f"ALTER TABLE delta.`{target}` SET TBLPROPERTIES ('delta.logRetentionDuration' = 'interval 1 days', "
              "'delta.deletedFileRetentionDuration' = 'interval 1 days', 'delta.checkpointInterval' = '1')")
    log = os.path.join(target, "_delta_log")
    old = time.time() - 5 * 86400
    for name in os.listdir(log):
        os.utime(os.path.join(log, name), (old, old))
    spark.sql(f"ALTER TABLE delta.`{target}` SET TBLPROPERTIES ('deltadrain.test' = 'cleanup')")
    assert not os.path.exists(os.path.join(log, f"{version:020d}.json")), "cleanup did not run"


def target_ids(spark, cfg, pipeline) -> list[str]:
    path = str(cfg.target_path(pipeline))
    from deltadrain.lake.delta import is_table

    if not is_table(spark, path):
        return []
    return [r[0] for r in spark.read.format("delta").load(path).select(pipeline.payload_schema.id_field).collect()]


def dlq_rows(spark, cfg, pipeline) -> list:
    from deltadrain.lake.delta import is_table

    path = str(cfg.dlq_path(pipeline))
    if not is_table(spark, path):
        return []
    return spark.read.format("delta").load(path).collect()


def pending(client, pipeline) -> int:
    total = 0
    for stream in pipeline.source.streams:
        try:
            total += client.xpending(stream, pipeline.source.group)["pending"]
        except Exception as exc:
            if "NOGROUP" not in str(exc):
                raise
    return total


def lag(client, pipeline) -> int:
    total = 0
    for stream in pipeline.source.streams:
        groups = [g for g in client.xinfo_groups(stream) if g["name"] in (pipeline.source.group,
                                                                           pipeline.source.group.encode())]
        total += int(groups[0]["lag"]) if groups else client.xlen(stream)
    return total


def drain_until_done(cfg, pipeline, spark, client, max_runs: int = 12) -> list:
    """Drain and reap until nothing is pending or unread; returns the run summaries."""
    summaries = []
    for _ in range(max_runs):
        summaries.append(drain(cfg, pipeline, spark=spark))
        reap(cfg, pipeline, client)
        if pending(client, pipeline) == 0 and lag(client, pipeline) == 0:
            return summaries
    raise AssertionError(f"not drained after {max_runs} runs: {[s.line() for s in summaries]}")


def assert_dead_letters(dead: list, ids: list[str], bad) -> None:
    """The DLQ holds each message once; `bad` is how many, or exactly where they were produced
    (`ProduceResult.bad_places`): then a valid message dead-lettered in place of a malformed one
    does not pass for it. A DEAD message is not in the target as well."""
    keys = [(r.partition, r.position) for r in dead]
    assert len(keys) == len(set(keys)), "a message is twice in the DLQ"
    if isinstance(bad, int):
        assert len(dead) == bad
    else:
        assert set(keys) == set(bad), (f"dead-lettered but not produced bad {sorted(set(keys) - set(bad))[:5]}, "
                                       f"produced bad but not dead-lettered {sorted(set(bad) - set(keys))[:5]}")
    both = {r.message_id for r in dead if r.state == "DEAD" and r.message_id} & set(ids)
    assert not both, f"DEAD in the DLQ and published in the target: {sorted(both)[:5]}"


def assert_exactly_once(spark, cfg, pipeline, client, valid_ids, bad) -> None:
    """Every valid id once in the target, the bad messages (a count, or their places) once in the
    DLQ, nothing pending."""
    ids = target_ids(spark, cfg, pipeline)
    assert len(ids) == len(set(ids)), "a message id appears twice in the target"
    assert set(ids) == set(valid_ids), (f"missing {sorted(set(valid_ids) - set(ids))[:5]}, "
                                        f"unexpected {sorted(set(ids) - set(valid_ids))[:5]}")
    assert_dead_letters(dlq_rows(spark, cfg, pipeline), ids, bad)
    assert pending(client, pipeline) == 0


# The drains a test started; the `no_drain_left` fixture kills those still running when it ends.
SPAWNED: list[subprocess.Popen] = []


def cli_drain(config: Path, pipeline: str, env: dict | None = None, timeout: int = 600,
              args: tuple[str, ...] = ()) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-m", "deltadrain.cli", "--config", str(config), "drain", pipeline, *args],
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
    import os

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
