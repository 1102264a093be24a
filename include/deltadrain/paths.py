"""Where things live on disk. Everything the project writes sits under one state home."""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

# include/deltadrain/paths.py -> the repository root (editable install keeps it in place).
PROJECT_ROOT = Path(__file__).resolve().parents[2]


def _env_path(name: str, default: Path) -> Path:
    value = os.environ.get(name)
    return Path(value).expanduser().resolve() if value else default


def state_home() -> Path:
    """Services' data, logs and pid files, Delta tables (by default) and Airflow's home."""
    return _env_path("DELTADRAIN_HOME", PROJECT_ROOT / ".deltadrain")


# A run's staging directory untouched this long belongs to a run that was killed before removing it.
STAGING_ABANDONED_S = 24 * 3600


# A run id names a directory (staging), a Valkey consumer and commits: no separators, no "." or "..".
RUN_ID = re.compile(r"(?!\.\.?\Z)[A-Za-z0-9_.-]{1,200}")


def check_run_id(run_id: str) -> str:
    if not RUN_ID.fullmatch(run_id):  # fullmatch: "$" would let a trailing newline through
        raise ValueError(f"run id {run_id!r}: use 1-200 letters, digits, '_', '.' or '-' (not '.' or '..' alone)")
    return run_id


def staging_dir(run_id: str, lake=None):
    """Where a run (drain, backfill, reprocess) stages its batch; the run removes it at its end
    (`remove_staging`). A run killed first (SIGKILL, a lost worker, Airflow's timeout) leaves it behind,
    with a batch of data in it, and a retry has a new run id: each run sweeps what such runs left a day
    ago or earlier. The run id is checked: the run removes this directory, which must never be anything
    but its own. With the lake on the object store (`lake`, an objectstore.LakeUrl) it is there too, under
    the lake's own `_deltadrain/staging`: executors on other machines write it, the driver reads it."""
    from deltadrain.objectstore import LakeUrl

    if isinstance(lake, LakeUrl):
        from deltadrain.objectstore import sweep_abandoned as sweep_store

        root = lake / "_deltadrain" / "staging"
        sweep_store(root, time.time() - STAGING_ABANDONED_S)
        return root / check_run_id(run_id)
    root = state_home() / "staging"
    sweep_abandoned(root, time.time() - STAGING_ABANDONED_S)
    return root / check_run_id(run_id)


def remove_staging(scratch) -> None:
    """Remove a run's staging directory (`staging_dir`), wherever it is; one already gone is no error."""
    from deltadrain.objectstore import is_s3_url, remove_tree

    if is_s3_url(scratch):
        remove_tree(scratch)
    else:
        shutil.rmtree(scratch, ignore_errors=True)


def sweep_abandoned(root: Path, before: float) -> list[str]:
    """Remove the directories under `root` in which nothing changed since `before` (epoch seconds)."""
    removed = []
    for child in root.iterdir() if root.is_dir() else ():
        try:
            newest = max([child.stat().st_mtime] + [os.stat(os.path.join(d, n)).st_mtime
                                                    for d, dirs, files in os.walk(child) for n in dirs + files])
        except OSError:
            continue  # removed meanwhile by its run or another sweep
        if child.is_dir() and newest < before:
            shutil.rmtree(child, ignore_errors=True)
            removed.append(child.name)
    return removed


def jar_cache() -> Path:
    """The git-ignored cache `make jars` fills from Maven Central."""
    return _env_path("DELTADRAIN_JARS", PROJECT_ROOT / ".cache" / "jars")


def config_path() -> Path:
    """The pipeline config the CLI, DAGs and Spark jobs read unless told otherwise."""
    return _env_path("DELTADRAIN_CONFIG", PROJECT_ROOT / "config" / "pipelines.yaml")


def jvm_dir() -> Path:
    return PROJECT_ROOT / "jvm"
