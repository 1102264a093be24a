"""Errors that reach users: each one says what is wrong and, where it can, what fixes it."""


class DeltadrainError(Exception):
    """Base class: the CLI prints these as one clear line and exits non-zero, without a traceback."""


class ConfigError(DeltadrainError):
    """A pipeline config that cannot be used; the message names the file, pipeline and field."""


class PrerequisiteError(DeltadrainError):
    """Something the machine lacks (Java, Maven, the jar cache); the message names the fix."""


class ServiceError(DeltadrainError):
    """An embedded service that cannot start or answer (port taken, crashed, timed out)."""
