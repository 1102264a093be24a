"""The training drain that builds the driver's class-data archive (`make install`, `deltadrain
jvm-archive`): a small real drain on a private Valkey and a throwaway lake, in a JVM that writes the
classes it loaded when it exits (`-XX:ArchiveClassesAtExit`). Where the archive lives and how drivers
map it is the runtime's `deltadrain.runtime.archive`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from deltadrain.paths import PROJECT_ROOT
from deltadrain.runtime import archive as jvm_archive

TRAINING_MESSAGES = 3_000
TRAINING_BATCH = 1_000
TRAINING_TIMEOUT = 600  # seconds; the training takes about a minute on 2 cores


def build(*, force: bool = False) -> tuple[Path, bool]:
    """Build the archive unless it exists: (its path, whether it was built now). Raises
    `ArchiveError` with the training's log when the JVM did not write one."""
    path = jvm_archive.archive_path()
    if path is None:
        from deltadrain.runtime.session import check_java

        check_java()  # names the fix
        raise ArchiveError("no JDK found")
    if path.exists() and not force:
        return path, False
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.stem}.{os.getpid()}.partial")
    log = path.with_suffix(".log")
    workdir = Path(tempfile.mkdtemp(prefix="deltadrain-jvm-archive-"))
    with log.open("w") as out:
        # Its own process group: whatever it leaves behind (its JVM, if it was killed) can be stopped.
        child = subprocess.Popen([sys.executable, "-m", "deltadrain.dev.archive_training", "--train", str(partial),
                                  str(workdir)], stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            # The training stops itself after TRAINING_TIMEOUT (and its Valkey with it); this is the backstop.
            code = child.wait(timeout=TRAINING_TIMEOUT + 120)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            _clean_up(child.pid, workdir)
    if code != 0 or not partial.exists():
        partial.unlink(missing_ok=True)  # a JVM also writes an archive when its drain failed: not this one
        ended = "was killed after the time limit" if code is None else f"exited {code}"
        tail = log.read_text()[-1500:]
        raise ArchiveError(f"the training drain {ended} without an archive; its log is {log}:\n{tail}")
    os.replace(partial, path)  # sessions never see a half-written archive
    for old in path.parent.glob("drain-*.jsa"):
        if old != path:
            old.unlink(missing_ok=True)  # another JDK's or jar set's: never mapped again
    return path, True


class ArchiveError(RuntimeError):
    pass


def _clean_up(group: int, workdir: Path) -> None:
    """After the training, even a killed one: no JVM of it may write an archive later, and its Valkey
    (a service in a session of its own) and state home go. A no-op after a clean run."""
    from deltadrain.dev.services.process import pid_alive

    pids = [group]
    valkey_pid = workdir / "home" / "services" / "valkey" / "valkey.pid"
    if valkey_pid.exists():
        pids.append(int(valkey_pid.read_text().strip()))
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while any(pid_alive(p) for p in pids[1:]) and time.monotonic() < deadline:
        time.sleep(0.1)
    shutil.rmtree(workdir, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _training_config(workdir: Path) -> Path:
    """The sample Valkey pipeline (schema, transform) on the private Valkey, with a lake of its own."""
    import yaml

    doc = yaml.safe_load((PROJECT_ROOT / "config" / "pipelines.yaml").read_text())
    pipe = next(p for p in doc["pipelines"] if p["source"]["kind"] == "valkey")
    pipe.update(name="jvm_archive", batch_cap=TRAINING_BATCH)
    pipe["source"].update(streams=[f"jvm_archive:{{{i}}}" for i in range(2)], group="jvm-archive")
    pipe["source"].pop("url", None)
    pipe["target"] = {"path": "jvm_archive"}
    pipe.pop("quality", None)
    doc["pipelines"] = [pipe]
    doc["data_dir"] = str(workdir / "lake")
    path = workdir / "pipelines.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def train(out: Path, workdir: Path) -> None:
    """Run drains end to end in a JVM that writes the classes it loaded to `out` when it exits.

    Runs in a process of its own (`build`): the private Valkey and state home (in `workdir`) come
    from the environment, which must be set before deltadrain reads it."""
    os.environ["DELTADRAIN_HOME"] = str(workdir / "home")
    os.environ["DELTADRAIN_VALKEY_PORT"] = str(_free_port())
    # The private Valkey's login is made in that home: a connection inherited from the caller is another's.
    os.environ.pop("AIRFLOW_CONN_DELTADRAIN_VALKEY", None)
    from deltadrain.catchup import drain
    from deltadrain.config import load_config
    from deltadrain.dev import services
    from deltadrain.dev.produce import produce
    from deltadrain.runtime.session import DEFAULT_CONF, get_spark

    def give_up(*_):
        raise ArchiveError(f"the training drain took longer than {TRAINING_TIMEOUT} s")

    signal.signal(signal.SIGALRM, give_up)
    signal.alarm(TRAINING_TIMEOUT)
    cfg = load_config(_training_config(workdir))
    pipeline = cfg.pipelines[0]
    services.up(cfg, ["valkey"])
    spark = None
    try:
        # Malformed messages too, so the dead-letter MERGE's classes are in the archive.
        produce(cfg, pipeline, TRAINING_MESSAGES, seed=1, malformed_ratio=0.02, progress=False)
        opts = f"{DEFAULT_CONF['spark.driver.extraJavaOptions']} {jvm_archive.JVM_LOGGING} -XX:ArchiveClassesAtExit={out}"
        spark = get_spark("deltadrain-jvm-archive", extra={"spark.driver.extraJavaOptions": opts})
        for _ in range(TRAINING_MESSAGES // TRAINING_BATCH):  # the first creates the table, the rest MERGE
            summary = drain(cfg, pipeline, spark=spark)
            print(summary.line(), flush=True)
            if summary.outcome != "committed":
                raise ArchiveError(f"training batch {summary.batch} ended {summary.outcome}: {summary.error}")
    finally:
        signal.alarm(0)
        if spark is not None:
            _stop_jvm(spark)  # also after a failure, so that no JVM writes `out` once this process is gone
        services.down(cfg, ["valkey"])
        shutil.rmtree(workdir, ignore_errors=True)


def _stop_jvm(spark, timeout: float = 300) -> None:
    """Stop the session and wait for its JVM to exit: it writes the archive on the way out, after
    Python would otherwise be gone."""
    gateway = spark.sparkContext._gateway
    proc = getattr(gateway, "proc", None)
    spark.stop()
    if proc is None:
        raise ArchiveError("the Spark JVM was not started by this process")
    proc.stdin.close()  # the gateway JVM exits on EOF from its Python driver
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    if proc.poll() is None:
        raise ArchiveError(f"the Spark JVM did not exit within {timeout:.0f} s")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--train":
        train(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        sys.exit("usage: python -m deltadrain.dev.archive_training --train OUT.jsa WORKDIR")
