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


DEFAULT_HOME = PROJECT_ROOT / ".deltadrain"
DEFAULT_CONFIG = PROJECT_ROOT / "config" / "pipelines.yaml"


def state_home() -> Path:
    """Services' data, logs and pid files, Delta tables (by default) and Airflow's home."""
    return _env_path("DELTADRAIN_HOME", DEFAULT_HOME)


# A run's staging directory untouched this long belongs to a run that was killed before removing it.
STAGING_ABANDONED_S = 24 * 3600


# A run id names a directory (staging), a Valkey consumer and commits: no separators, no "." or "..".
RUN_ID = re.compile(r"(?!\.\.?\Z)[A-Za-z0-9_.-]{1,200}")


def check_run_id(run_id: str) -> str:
    if not RUN_ID.fullmatch(run_id):  # fullmatch: "$" would let a trailing newline through
        raise ValueError(f"run id {run_id!r}: use 1-200 letters, digits, '_', '.' or '-' (not '.' or '..' alone)")
    return run_id


def staging_dir(run_id: str) -> Path:
    """Where a run (drain, backfill, reprocess) on a local lake stages its batch (scratch.staging_dir)."""
    root = state_home() / "staging"
    sweep_abandoned(root, time.time() - STAGING_ABANDONED_S)
    return root / check_run_id(run_id)


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


def jar_store() -> Path | None:
    """Where finished jar caches are kept per user by the hash of what made them, so that another clone
    of the same poms links them instead of running Maven again; None when DELTADRAIN_JAR_STORE is `off`."""
    if os.environ.get("DELTADRAIN_JAR_STORE", "").strip().lower() == "off":
        return None
    cache_home = _env_path("XDG_CACHE_HOME", Path.home() / ".cache")
    return _env_path("DELTADRAIN_JAR_STORE", cache_home / "deltadrain" / "jar-store")


def config_path() -> Path:
    """The pipeline config the CLI, DAGs and Spark jobs read unless told otherwise."""
    return _env_path("DELTADRAIN_CONFIG", DEFAULT_CONFIG)


def _shown(path: Path) -> str:
    """A path as a command line shows it: relative to the current directory when it lies under it."""
    path = path.resolve()
    try:
        here = Path.cwd()
        return str(path.relative_to(here)) if here != Path(here.anchor) else str(path)
    except (ValueError, OSError):  # outside the current directory, or that directory was removed
        return str(path)


def command_line(words: str, config: Path | str | None = None, program: str = "deltadrain") -> str:
    """`deltadrain WORDS` as deltadrain prints it for a user to run next: with `--config` when the
    config it ran with (`config`: a loaded config's source_file; None: $DELTADRAIN_CONFIG or the default)
    is not config/pipelines.yaml, and with DELTADRAIN_HOME when the state home is not .deltadrain/. The
    command then reads the same pipelines, services and lake whatever the shell it is pasted into has
    set (a bare `deltadrain status` would read the default config's Valkey)."""
    import shlex

    chosen = Path(config) if config is not None else config_path()
    parts = []
    if (home := state_home().resolve()) != DEFAULT_HOME.resolve():
        parts.append(f"DELTADRAIN_HOME={shlex.quote(_shown(home))}")
    parts.append(program)
    if chosen.resolve() != DEFAULT_CONFIG.resolve():
        parts += ["--config", shlex.quote(_shown(chosen))]
    return " ".join([*parts, words])


def jvm_dir() -> Path:
    return PROJECT_ROOT / "jvm"
