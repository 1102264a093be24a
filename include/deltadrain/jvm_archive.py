"""The driver JVM's class-data archive: the classes a drain loads, parsed and verified once.

Every drain task starts a JVM that loads some 25 000 classes (Spark, Delta, Parquet, Arrow) before
its first commit. HotSpot can map them from an archive instead (AppCDS, `-XX:SharedArchiveFile`).
`make install` builds one by running a small real drain (a private Valkey, a throwaway lake) with
`-XX:ArchiveClassesAtExit`; a one-message drain process then ends about 4 s sooner
(docs/benchmarks.md, "JVM start: one-message drains and the class-data archive").

An archive belongs to one JDK and one set of jars. Its file name is their fingerprint, so after a
JDK or jar change a session finds no archive and starts as before, until the next `make install`.
The JVM checks the archive itself too and, if it does not match, starts without it (-Xshare:auto).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from deltadrain.paths import PROJECT_ROOT, jar_cache

# The JVM's own warnings (an archive it cannot use, for one) go to stderr: stdout carries a run's
# JSON summary.
JVM_LOGGING = "-Xlog:disable -Xlog:all=warning:stderr"
TRAINING_MESSAGES = 3_000
TRAINING_BATCH = 1_000
TRAINING_TIMEOUT = 600  # seconds; the training takes about a minute on 2 cores


def archive_dir() -> Path:
    return jar_cache() / "cds"


def java_home() -> Path | None:
    """The JDK spark-submit starts (spark.java_binary's), or None without one: no archive then."""
    from deltadrain.errors import PrerequisiteError
    from deltadrain.spark import java_binary

    try:
        return Path(java_binary()).resolve().parent.parent
    except PrerequisiteError:
        return None


def _stat(path: Path) -> tuple[str, int, int]:
    st = path.stat()
    return str(path), st.st_size, st.st_mtime_ns


def fingerprint(jdk: list[tuple[str, int, int]], jars: list[tuple[str, int, int]]) -> str:
    """What an archive depends on: the JDK's files and every jar on the driver's class path, by
    name, size and modification time (the same things HotSpot checks before it maps one)."""
    digest = hashlib.sha256()
    for name, size, mtime in [*sorted(jdk), *sorted(jars)]:
        digest.update(f"{name}\0{size}\0{mtime}\n".encode())
    return digest.hexdigest()[:20]


def archive_path() -> Path | None:
    """Where the archive for this JDK and this jar set is (or would be); None without a JDK."""
    from deltadrain.jars import classpath, pyspark_jars_dir

    home = java_home()
    if home is None:
        return None
    jdk = [_stat(p) for p in (home / "release", home / "lib" / "server" / "libjvm.so",
                              home / "lib" / "modules") if p.exists()]
    jars = [_stat(p) for p in [*pyspark_jars_dir().glob("*.jar"), *classpath("spark")]]
    return archive_dir() / f"drain-{fingerprint(jdk, jars)}.jsa"


def java_options() -> str:
    """The driver's extra JVM options: the archive's when one was built for this JDK and these jars."""
    path = archive_path()
    if path is not None and path.exists():
        return f"{JVM_LOGGING} -XX:SharedArchiveFile={path}"
    return JVM_LOGGING


def build(*, force: bool = False) -> tuple[Path, bool]:
    """Build the archive unless it exists: (its path, whether it was built now). Raises
    `ArchiveError` with the training's log when the JVM did not write one."""
    path = archive_path()
    if path is None:
        from deltadrain.spark import check_java

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
        child = subprocess.Popen([sys.executable, "-m", "deltadrain.jvm_archive", "--train", str(partial),
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
    from deltadrain.services.process import pid_alive

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
    from deltadrain import services
    from deltadrain.config import load_config
    from deltadrain.drain import drain
    from deltadrain.produce import produce
    from deltadrain.spark import DEFAULT_CONF, get_spark

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
        opts = f"{DEFAULT_CONF['spark.driver.extraJavaOptions']} {JVM_LOGGING} -XX:ArchiveClassesAtExit={out}"
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
        sys.exit("usage: python -m deltadrain.jvm_archive --train OUT.jsa WORKDIR")
