"""Named crash points for the kill tests: DELTADRAIN_FAILPOINT=<name> SIGKILLs the drain there.

Off unless the variable is set; the crash tests use them to stop a run exactly at a step boundary
(after claim, during MERGE, after commit before ack, during ack) and then check that the next runs
lose and duplicate nothing. DELTADRAIN_FAILPOINT_SKIP=K lets the point pass K times in a process
before it fires: a catch-up task killed in its second batch, after the first one committed.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

ENV = "DELTADRAIN_FAILPOINT"
DELAY_ENV = "DELTADRAIN_FAILPOINT_DELAY_MS"
SKIP_ENV = "DELTADRAIN_FAILPOINT_SKIP"

_passed: dict[str, int] = {}  # how often each armed point was reached in this process


def armed(name: str) -> bool:
    return os.environ.get(ENV) == name


def _fires(name: str) -> bool:
    """Armed, and reached more than DELTADRAIN_FAILPOINT_SKIP times before (counted here)."""
    if not armed(name):
        return False
    seen = _passed.get(name, 0)
    _passed[name] = seen + 1
    return seen >= int(os.environ.get(SKIP_ENV, "0"))


def fired(name: str) -> str:
    """The line a failpoint writes to stderr as it kills: a test that finds it knows the SIGKILL was
    this point's, not the OOM killer's or another point's."""
    return f"deltadrain failpoint {name}: SIGKILL"


def _kill(name: str, pid: int) -> None:
    sys.stderr.write(fired(name) + "\n")
    sys.stderr.flush()
    os.kill(pid, signal.SIGKILL)


def hit(name: str, pid: int | None = None) -> None:
    """SIGKILL the driver (or `pid`) when the failpoint `name` is armed."""
    if _fires(name):
        _kill(name, pid or os.getpid())


def hit_later(name: str) -> None:
    """For 'during' points: SIGKILL this process after DELTADRAIN_FAILPOINT_DELAY_MS, whatever it is doing."""
    if _fires(name):
        delay = int(os.environ.get(DELAY_ENV, "500")) / 1000
        timer = threading.Timer(delay, _kill, (name, os.getpid()))
        timer.daemon = True
        timer.start()


def pause(name: str) -> None:
    """Hold the run at `name` for DELTADRAIN_PAUSE_<NAME>_MS (race tests: lease theft, neighbours).

    With DELTADRAIN_PAUSE_<NAME>_UNTIL=<file> the hold ends as soon as that file exists: a test
    releases the run once its neighbour is done instead of idling out a pause sized for a slow day."""
    import time

    key = name.upper()
    ms = int(os.environ.get(f"DELTADRAIN_PAUSE_{key}_MS", "0"))
    release = os.environ.get(f"DELTADRAIN_PAUSE_{key}_UNTIL")
    deadline = time.monotonic() + ms / 1000
    while (left := deadline - time.monotonic()) > 0:
        if release and os.path.exists(release):
            return
        time.sleep(min(0.2, left))


class InjectedFailure(RuntimeError):
    """Raised by `fail()`: a step that did its work but reported an error (a lost reply)."""


def fail(name: str) -> None:
    if _fires(name):
        raise InjectedFailure(f"failpoint {name}")


# An in-process stand-in for a run's death, for the tests that need many of them in a row (the
# crash loops): a test transform raises an error carrying ABANDON, and the run stops where it is, as
# a SIGKILL stops it, its claims and claim notices left behind and none of its cleanup run. The real
# SIGKILLs stay in the kill tests.
ABANDON = "deltadrain-abandon-run"


class Abandoned(BaseException):
    """A run stopped as a SIGKILL stops it (BaseException: no `except Exception` handles it)."""


def abandons(exc: BaseException) -> bool:
    return isinstance(exc, Abandoned) or ABANDON in str(exc)


def reraise_abandon(exc: BaseException) -> None:
    """In a handler that would take a transform's error for the data's: let an abandon through."""
    if abandons(exc):
        raise Abandoned(ABANDON) from None
