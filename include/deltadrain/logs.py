"""Structured logs: every line of a run carries its pipeline, batch and run id as key=value pairs.

Plain `logging` underneath, so Airflow's task logs, spark-submit's output and the CLI all show them.
Only counts, ids, positions and timings are logged: never payloads or secrets (connection
passwords live in ClaimContext fields excluded from repr, and are never formatted into a message).
"""

from __future__ import annotations

import logging
import os

FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def configure() -> None:
    """For entry points (CLI, spark jobs): INFO lines on stderr unless logging is already set up."""
    level = os.environ.get("DELTADRAIN_LOG_LEVEL", "INFO").upper()
    if level not in LEVELS:
        from deltadrain.errors import DeltadrainError

        raise DeltadrainError(f"DELTADRAIN_LOG_LEVEL={level!r} is not a log level; use one of {', '.join(LEVELS)}")
    logging.basicConfig(level=level, format=FORMAT)
    logging.getLogger("deltadrain").setLevel(level)
    for noisy in ("py4j", "great_expectations"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def fields(**context) -> str:
    """`k=v` pairs, in order, values with spaces quoted; None values left out."""
    parts = []
    for key, value in context.items():
        if value is None:
            continue
        text = str(value)
        parts.append(f"{key}={text!r}" if (" " in text or not text) else f"{key}={text}")
    return " ".join(parts)


class RunLog(logging.LoggerAdapter):
    """A logger whose lines start with the run's context (pipeline, batch, run id)."""

    def process(self, msg, kwargs):
        return f"{fields(**self.extra)} {msg}", kwargs


def run_logger(pipeline: str, run_id: str, batch: int | None = None, **more) -> RunLog:
    return RunLog(logging.getLogger("deltadrain.run"), {"pipeline": pipeline, "batch": batch, "run_id": run_id,
                                                        **more})
