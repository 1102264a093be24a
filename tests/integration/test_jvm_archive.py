"""The class-data archive on real parts: the one `make install` built by a real training drain (its own
Valkey and lake), mapped by a driver that spark-submit starts with the project's conf; a training
killed in its first batch; and harmless when it is broken."""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from deltadrain.dev import archive_training
from deltadrain.runtime import archive as jvm_archive
from deltadrain.runtime.session import spark_submit_command

# Runs under spark-submit: a Delta round trip, then which archives the driver JVM has mapped.
PROBE = """
import json, sys
from pathlib import Path
from pyspark.sql import SparkSession

spark = SparkSession.builder.getOrCreate()
spark.sparkContext.setLogLevel("ERROR")
spark.range(100).write.format("delta").save(sys.argv[1])
rows = spark.read.format("delta").load(sys.argv[1]).count()
pid = int(spark._jvm.java.lang.ProcessHandle.current().pid())
maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
print(json.dumps({"rows": rows, "mapped": sorted({m.split()[-1] for m in maps if m.endswith(".jsa")})}))
"""


def _probe(tmp_path, name: str) -> tuple[dict, subprocess.CompletedProcess]:
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    done = subprocess.run(spark_submit_command(str(script), [str(tmp_path / name)]),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    # stdout is the script's alone: the JVM's warnings go to stderr.
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, done.stdout[-2000:]
    return json.loads(lines[0]), done


def _processes_naming(text: str) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(f"{proc.name}: {cmdline[:200]}")
    return found


@pytest.mark.slow
def test_a_training_killed_in_its_first_batch_leaves_no_archive_and_nothing_running(tmp_path, monkeypatch):
    cds = tmp_path / "cds"
    cds.mkdir()
    stale = cds / "drain-0123456789abcdef0123.jsa"  # another JDK's or jar set's
    stale.write_bytes(b"old")
    monkeypatch.setattr(jvm_archive, "archive_dir", lambda: cds)
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # the training's state home and Valkey

    # No archive, and nothing of it left running that could write one later (its JVM) or hold a port
    # (its Valkey); an older archive stays until a training succeeds. Killed once its JVM has claimed: a
    # SIGKILLed JVM writes no archive, whichever batch it was in.
    monkeypatch.setenv("DELTADRAIN_FAILPOINT", "after_claim")
    with pytest.raises(archive_training.ArchiveError, match="exited -9 without an archive"):
        archive_training.build()
    time.sleep(2)
    assert sorted(p.name for p in cds.iterdir()) == sorted([stale.name, jvm_archive.archive_path().with_suffix(".log").name])
    assert _processes_naming(str(tmp_path)) == [] and list((tmp_path / "tmp").iterdir()) == []


@pytest.mark.slow
def test_the_archive_make_install_trained_is_current_and_a_submitted_driver_maps_it(tmp_path):
    """`make install` trains the archive with a real drain (`deltadrain jvm-archive`): this test reads
    what that training left instead of training again."""
    path = jvm_archive.archive_path()
    assert path is not None and path.is_file(), (
        f"no class-data archive at {path}: `make install` builds it (or `.venv/bin/deltadrain jvm-archive`)")
    assert path.stat().st_size > 50 * 2**20 and not list(path.parent.glob("*.partial"))
    assert [p.name for p in path.parent.glob("drain-*.jsa")] == [path.name]  # older ones were removed
    # The training drained every batch for real, dead letters included.
    runs = [json.loads(line) for line in path.with_suffix(".log").read_text().splitlines()
            if line.startswith('{"pipeline"')]
    assert [r["outcome"] for r in runs] == ["committed"] * 3
    assert sum(r["claimed"] for r in runs) == archive_training.TRAINING_MESSAGES
    assert all(r["dead_lettered"] > 0 and r["acked"] == r["claimed"] for r in runs)
    assert archive_training.build() == (path, False)  # up to date: nothing to do

    out, _ = _probe(tmp_path, "t1")
    assert out["rows"] == 100 and str(path) in out["mapped"]


@pytest.mark.slow
def test_a_broken_archive_only_costs_the_faster_start(tmp_path, monkeypatch):
    path = tmp_path / "drain-broken.jsa"
    path.write_bytes(b"not an archive" * 1000)  # e.g. a copy cut short
    monkeypatch.setattr(jvm_archive, "archive_path", lambda: path)

    out, _ = _probe(tmp_path, "t2")  # HotSpot starts without sharing, and says so on stderr at most
    assert out["rows"] == 100 and str(path) not in out["mapped"]
