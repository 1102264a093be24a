"""What every config model shares: the base model (unknown keys and secrets refused, frozen), the checked
field types (schedules, durations, names) and the one rule for paths written relative to the config file.
"""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Annotated, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, model_validator

from deltadrain.config.lakeurl import is_s3_url
from deltadrain.schema.types import COLUMN_TYPES

NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
SECRET_KEYS = {"password", "passwd", "secret", "sasl_password", "token", "api_key", "ssl_key_password"}
# The column types the config accepts (deltadrain.schema.types).
SPARK_TYPES = COLUMN_TYPES

CRON_PRESETS = ("@hourly", "@daily", "@weekly", "@monthly", "@quarterly", "@yearly")  # Airflow's

# An ingest DAG that starts its next run as soon as one ends (Airflow's continuous timetable).
CONTINUOUS = "@continuous"
# An ingest DAG scheduled on its source's Assets, which an AssetWatcher marks when the source has work.
ON_DATA = "on_data"


def _schedule(v: str | None) -> str | None:
    """A cron expression or one of Airflow's presets, checked here rather than as a broken DAG."""
    if v is None or v in CRON_PRESETS:
        return v
    try:
        from croniter import croniter  # Airflow's own cron parser; jobs may run without it
    except ImportError:  # pragma: no cover
        return v
    if not croniter.is_valid(v):
        raise ValueError(f"'{v}' is not a cron expression (such as '*/5 * * * *') or one of {', '.join(CRON_PRESETS)}")
    return v


def _positive(v: timedelta) -> timedelta:
    if v <= timedelta(0):
        raise ValueError(f"must be a positive duration, got {v}")
    return v


def _not_negative(v: timedelta) -> timedelta:
    if v < timedelta(0):
        raise ValueError(f"must not be negative, got {v}")
    return v


def _ingest_schedule(v):
    return v if v in (CONTINUOUS, ON_DATA) else _schedule(v)


class RelativeToConfig:
    """Marks a path field: a relative path is read from the config file's directory (resolve_path), for
    every such field alike, when the config is loaded (deltadrain.config.loader)."""

    def __repr__(self) -> str:
        return "RelativeToConfig()"


RELATIVE_TO_CONFIG = RelativeToConfig()

# Checked field types: the error names the field like any other (parse_config).
Schedule = Annotated[str | None, AfterValidator(_schedule)]
IngestSchedule = Annotated[str | None, AfterValidator(_ingest_schedule)]
PositiveDuration = Annotated[timedelta, AfterValidator(_positive)]
NonNegativeDuration = Annotated[timedelta, AfterValidator(_not_negative)]
# A file (or, for data_dir, a directory or an s3a:// URL) named in the config.
ConfigPath = Annotated[str | None, RELATIVE_TO_CONFIG]


def resolve_path(value: str, config_file: Path | None) -> str:
    """A path as the config writes it -> absolute: `~` expanded, a relative one joined to the config
    file's directory (the working directory's when there is no file). An object store URL is kept."""
    if is_s3_url(value):
        return value
    path = Path(value).expanduser()
    if not path.is_absolute() and config_file is not None:
        path = config_file.resolve().parent / path
    return str(path.resolve())


M = TypeVar("M", bound=BaseModel)


def with_paths_resolved(model: M, config_file: Path | None) -> M:
    """`model` with every path field (ConfigPath), in it and in the models it holds, made absolute."""
    def resolved(value, field=None):
        if field is not None and RELATIVE_TO_CONFIG in field.metadata:
            return resolve_path(value, config_file) if isinstance(value, str) else value
        if isinstance(value, BaseModel):
            return with_paths_resolved(value, config_file)
        if isinstance(value, list):
            items = [resolved(v) for v in value]
            return items if any(a is not b for a, b in zip(items, value, strict=True)) else value
        return value

    update = {name: new for name, field in type(model).model_fields.items()
              if (new := resolved(old := getattr(model, name), field)) is not old}
    return model.model_copy(update=update) if update else model


class Model(BaseModel):
    """A block of the config: unknown keys are errors, a key that looks like a secret is refused with the
    way out named, and a loaded config never changes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _no_secrets(cls, data):
        if isinstance(data, dict):
            for key in data:
                if str(key).lower() in SECRET_KEYS:
                    raise ValueError(
                        f"'{key}' is a secret and is never read from YAML; name an Airflow connection "
                        "(connection_id) or an environment variable (password_env) instead")
        return data
