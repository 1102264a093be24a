"""The Airflow pools deltadrain makes: one per pipeline, one slot, so that a pipeline's drains, checks,
replays and maintenance never run side by side. `deltadrain pools` and the embedded services' start
set them on the Airflow that AIRFLOW_HOME names, else on the embedded one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from deltadrain.config import DeltadrainConfig
from deltadrain.config.embedded import airflow_env
from deltadrain.errors import PrerequisiteError, ServiceError

POOL_DESCRIPTION = "deltadrain: drains of "  # marks the pools deltadrain made (and may prune)


def pool_specs(cfg: DeltadrainConfig) -> dict[str, dict]:
    """One pool per pipeline, one slot: a pipeline's drains and table checks never run side by side."""
    from deltadrain.names import pool_name

    return {pool_name(p.name): {"slots": 1, "description": f"{POOL_DESCRIPTION}{p.name}",
                                "include_deferred": False} for p in cfg.pipelines}


def stale_pools(listed: list[dict], cfg: DeltadrainConfig) -> list[str]:
    """The pools deltadrain made (by their description) for pipelines `cfg` no longer has. Pools of
    other origins are never touched, whatever their name."""
    wanted = pool_specs(cfg)
    return sorted(p["pool"] for p in listed
                  if str(p.get("description") or "").startswith(POOL_DESCRIPTION) and p["pool"] not in wanted)


def pools_env() -> dict[str, str] | None:
    """The environment of the Airflow whose pools `deltadrain pools` sets: the one AIRFLOW_HOME names
    when it is set (Compose's container, an Airflow of your own), else (None) the embedded one."""
    return dict(os.environ) if "AIRFLOW_HOME" in os.environ else None


def airflow_cli() -> str:
    """This environment's `airflow` (next to its python, else on PATH)."""
    sibling = Path(sys.executable).parent / "airflow"
    found = str(sibling) if sibling.exists() else shutil.which("airflow")
    if found is None:
        raise PrerequisiteError("the `airflow` command is not installed in this environment: run `make install`")
    return found


def ensure_airflow_pools(cfg: DeltadrainConfig, env: dict[str, str] | None = None) -> list[str]:
    """Create each pipeline's pool, or set it back to one slot (idempotent); returns the pool names.
    `env`: the environment of the Airflow to act on (`pools_env`); None, the embedded one.

    A task in a pool that does not exist is never scheduled, so this runs whenever the config gains
    a pipeline: `services up` and Compose's start call it, and `deltadrain pools` by hand."""
    import tempfile

    pools = pool_specs(cfg)
    with tempfile.NamedTemporaryFile("w", prefix="deltadrain-pools-", suffix=".json") as spec:
        json.dump(pools, spec, indent=2)
        spec.flush()
        airflow_pools(cfg, env, f"creating the Airflow pools {sorted(pools)}", "import", spec.name)
    return sorted(pools)


def prune_airflow_pools(cfg: DeltadrainConfig, env: dict[str, str] | None = None) -> list[str]:
    """Delete the pools of pipelines removed from the config (`stale_pools`); returns their names."""
    out = airflow_pools(cfg, env, "listing the Airflow pools", "list", "--output", "json").strip()
    try:
        listed = json.loads(out or "[]")
    except ValueError:
        raise ServiceError(f"`airflow pools list` did not answer in JSON: {out[-300:]}") from None
    stale = stale_pools(listed, cfg)
    for name in stale:
        airflow_pools(cfg, env, f"deleting the Airflow pool {name}", "delete", name)
    return stale


def airflow_pools(cfg: DeltadrainConfig, env: dict[str, str] | None, what: str, *args: str) -> str:
    """`airflow pools ARGS` on the Airflow of `env` (`pools_env`; None, the embedded one); its stdout."""
    env = env if env is not None else {**os.environ, **airflow_env(cfg)}
    done = subprocess.run([airflow_cli(), "pools", *args], env=env, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        # Airflow's own last lines say why (an unmigrated DB: "Please run `airflow db migrate`").
        raise ServiceError(f"{what} failed: {(done.stderr or done.stdout).strip()[-800:]}")
    return done.stdout
