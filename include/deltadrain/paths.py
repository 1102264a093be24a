"""Where things live on disk. Everything the project writes sits under one state home."""

from __future__ import annotations

import os
from pathlib import Path

# include/deltadrain/paths.py -> the repository root (editable install keeps it in place).
PROJECT_ROOT = Path(__file__).resolve().parents[2]


def _env_path(name: str, default: Path) -> Path:
    value = os.environ.get(name)
    return Path(value).expanduser().resolve() if value else default


def state_home() -> Path:
    """Services' data, logs and pid files, Delta tables (by default) and Airflow's home."""
    return _env_path("DELTADRAIN_HOME", PROJECT_ROOT / ".deltadrain")


def jar_cache() -> Path:
    """The git-ignored cache `make jars` fills from Maven Central."""
    return _env_path("DELTADRAIN_JARS", PROJECT_ROOT / ".cache" / "jars")


def config_path() -> Path:
    """The pipeline config the CLI, DAGs and Spark jobs read unless told otherwise."""
    return _env_path("DELTADRAIN_CONFIG", PROJECT_ROOT / "config" / "pipelines.yaml")


def jvm_dir() -> Path:
    return PROJECT_ROOT / "jvm"
