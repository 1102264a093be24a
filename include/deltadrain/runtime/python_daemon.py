"""The Spark Connect server's Python worker daemon: pyspark's own, which exits once it has been idle.

Spark 4.1 starts a worker daemon per Connect session and never stops it (SPARK-54055, fixed after
4.1): every task would leave about 55 MiB behind for the server's life. Spark itself stops a daemon's
idle workers after a minute; this module, named by the server's `spark.python.daemon.module`, runs
pyspark's daemon unchanged and lets it exit once it has had no worker and forked none for
`DELTADRAIN_PYTHON_DAEMON_IDLE_SECONDS` (default 30). A session that needs a worker after that gets a
new daemon: Spark restarts one it finds gone ("Assuming that daemon unexpectedly quit").

Workers the JVM forks itself (`spark.python.use.daemon=false`) would not leak either, but Spark waits
only 10 s for such a worker to connect back, which a loaded machine misses.

Before it forks, the daemon imports the modules deltadrain's tasks run (`warm`): every worker forked from it
has them, instead of importing them itself (about 0.4 CPU-s per worker; a worker idle for a minute is
stopped, and the next task forks a new one). Sessions that are not a Connect server run the same daemon
without the idle exit (`deltadrain.runtime.warm_daemon`).
"""

from __future__ import annotations

import importlib
import os
import select
import signal
import sys
import time
from pathlib import Path

IDLE_ENV = "DELTADRAIN_PYTHON_DAEMON_IDLE_SECONDS"
DEFAULT_IDLE_SECONDS = 30.0

# The modules whose functions deltadrain's Spark tasks run (mapInArrow bodies and what they decode with).
WARM_MODULES = ("deltadrain.run.stage", "deltadrain.sources.valkey.claim", "deltadrain.sources.kafka.drain")

_last_fork = time.monotonic()
_fork = os.fork


def warm(modules: tuple[str, ...] = WARM_MODULES) -> list[str]:
    """Import `modules` into the daemon, so that the workers it forks inherit them. One that does not import
    is left to the task that needs it, which then fails with the import's own error. -> those imported."""
    done = []
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # the daemon must start; the task that needs the module reports its error
            print(f"deltadrain: Python worker daemon could not import {name} in advance: {exc}", file=sys.stderr,
                  flush=True)
        else:
            done.append(name)
    return done


def idle_seconds() -> float:
    try:
        return max(float(os.environ.get(IDLE_ENV, DEFAULT_IDLE_SECONDS)), 1.0)
    except ValueError:
        return DEFAULT_IDLE_SECONDS


def parent_pids() -> dict[int, int]:
    """Every process's parent, from /proc: {pid: parent pid}."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:  # exited since the listing
                continue
            parents[int(entry.name)] = int(stat[stat.rindex(")") + 2:].split()[1])
    return parents


def has_children(pid: int) -> bool:
    """Whether `pid` has a live child (a worker it forked), from /proc."""
    listed = Path(f"/proc/{pid}/task/{pid}/children")
    try:
        return bool(listed.read_text().split())
    except OSError:  # a kernel without the children file: scan the process table
        return pid in parent_pids().values()


def should_exit(idle_for: float, limit: float, children: bool, pending: bool) -> bool:
    """Exit only when nothing could still need this daemon: idle long enough, no worker, nobody waiting."""
    return idle_for >= limit and not children and not pending


def _forking() -> int:
    global _last_fork
    _last_fork = time.monotonic()
    pid = _fork()
    if pid == 0:  # a worker: it keeps no timer of the daemon's
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
    return pid


def _pending(frame) -> bool:
    """Whether a connection waits on the daemon's listening socket (a worker asked for, not yet forked).
    The signal interrupted pyspark's loop, whose frame holds that socket."""
    while frame is not None:
        listening, accepted = frame.f_locals.get("listen_sock"), frame.f_locals.get("sock")
        if listening is not None:
            if accepted is not None and accepted.fileno() != -1:
                return True  # accepted, its worker not forked yet (the loop closes it after the fork)
            try:
                return bool(select.select([listening], [], [], 0)[0])
            except (OSError, ValueError):
                return False
        frame = frame.f_back
    return False


def _check(limit: float, every: int):
    def handler(_signum, frame) -> None:
        idle_for = time.monotonic() - _last_fork
        if should_exit(idle_for, limit, has_children(os.getpid()), _pending(frame)):
            print(f"deltadrain: Python worker daemon {os.getpid()} idle for {idle_for:.0f} s; exiting",
                  file=sys.stderr, flush=True)
            raise SystemExit(0)  # through pyspark's own shutdown
        signal.alarm(every)
    return handler


def main() -> None:
    from pyspark import daemon

    warm()
    limit = idle_seconds()
    every = max(1, min(30, int(limit / 2)))
    os.fork = _forking
    signal.signal(signal.SIGALRM, _check(limit, every))
    signal.alarm(every)
    daemon.manager()


if __name__ == "__main__":
    main()
