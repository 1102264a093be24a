"""Transforms ("handlers"): functions DataFrame -> DataFrame named by dotted path in the config."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from deltadrain.errors import ConfigError

# The marker `deltadrain produce --poison-ratio` puts in a payload: the sample transform fails on it
# the way a buggy handler would, inside Spark at action time, not while the plan is built.
POISON_MARKER = "__poison__"


def load_transform(dotted: str | None, where: str = "") -> Callable:
    """The function `dotted` names. `where` ("FILE: pipeline 'P', field 'transform': ") starts the error."""
    if dotted is None:
        return identity
    module_name, _, func_name = dotted.rpartition(".")
    try:
        func = getattr(importlib.import_module(module_name), func_name)
    except Exception as exc:  # not only ImportError: the user's module may fail as it is imported
        shown = str(exc) if isinstance(exc, ImportError | AttributeError) else f"{type(exc).__name__}: {exc}"
        raise ConfigError(f"{where}transform '{dotted}' cannot be imported: {shown}") from None
    if not callable(func):
        raise ConfigError(f"{where}transform '{dotted}' is not callable")
    return func


def identity(df):
    return df


def sample_orders(df):
    """The example pipelines' handler: normalises status and fails on poison messages."""
    from pyspark.sql import functions as F

    return df.withColumn(
        "status",
        F.when(F.col("customer") == F.lit(POISON_MARKER),
               F.raise_error(F.concat(F.lit("poison message: transform refused event "), F.col("event_id"))))
        .otherwise(F.lower(F.col("status"))),
    )
