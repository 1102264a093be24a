"""Errors that reach users: each one says what is wrong and, where it can, what fixes it."""

import re


class DeltadrainError(Exception):
    """Base class: the CLI prints these as one clear line and exits non-zero, without a traceback."""


class ConfigError(DeltadrainError):
    """A pipeline config that cannot be used; the message names the file, pipeline and field."""


class PrerequisiteError(DeltadrainError):
    """Something the machine lacks (Java, Maven, the jar cache); the message names the fix."""


class ReplayError(DeltadrainError):
    """A replay that was refused or sent nothing (its parameters, or the source would not take it)."""


class ServiceError(DeltadrainError):
    """An embedded service that cannot start or answer (port taken, crashed, timed out)."""


USER_RAISED = "[USER_RAISED_EXCEPTION]"  # Spark's raise_error(): the transform's own message follows
TRACEBACK = "Traceback (most recent call last)"
JVM_CALL = "An error occurred while calling"  # Py4J's first line
# "ValueError: ...", "org.apache.spark.SparkException: ...": from the class's simple name on.
_EXCEPTION_NAME = re.compile(r"[A-Za-z_]\w*(?:Exception|Error)(?=:)")


def error_line(exc: BaseException, limit: int = 500) -> str:
    """The one line of a failure a user should read: the transform's or Python worker's own error,
    not the JVM stack or the "exception was thrown from the Python worker" banner around it."""
    text = str(exc)
    lines = [line for line in text.splitlines() if line.strip()]
    return (_own_line(lines) or (f"{type(exc).__name__}: {lines[0].strip()}" if lines else type(exc).__name__))[:limit]


def _own_line(lines: list[str]) -> str | None:
    for line in lines:
        if USER_RAISED in line:
            return line[line.index(USER_RAISED):].strip()
    # A Python traceback (a Spark worker's, inside a JVM error or PySpark's own): its exception line is
    # the first one after the last "Traceback" header that is not indented (frames and code are;
    # the JVM's frames that may follow start with a tab).
    header = max((i for i, line in enumerate(lines) if TRACEBACK in line), default=None)
    if header is not None:
        for line in lines[header + 1:]:
            if not line[0].isspace():
                return line.strip()
    if any(line.startswith("\tat ") or JVM_CALL in line for line in lines):  # a JVM error: its first exception
        for line in lines:
            if found := _EXCEPTION_NAME.search(line):
                return line[found.start():].strip()
    return None  # a one-line error is its own line, after its type
