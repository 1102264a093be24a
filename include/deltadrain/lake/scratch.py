"""A run's scratch: where a drain, backfill or reprocess stages its batch, on the disk or on the object store."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from deltadrain.config.lakeurl import LakeUrl
from deltadrain.paths import STAGING_ABANDONED_S, check_run_id
from deltadrain.paths import staging_dir as local_staging_dir


def staging_dir(run_id: str, lake: Path | LakeUrl) -> Path | LakeUrl:
    """Where a run stages its batch; the run removes it at its end (`remove_staging`). A run killed
    first (SIGKILL, a lost worker, Airflow's timeout) leaves it behind, with a batch of data in it, and a
    retry has a new run id: each run sweeps what such runs left a day ago or earlier. The run id is
    checked: the run removes this directory, which must never be anything but its own. With the lake on
    the object store it is there too, under the lake's own `_deltadrain/staging`: executors on other
    machines write it, the driver reads it."""
    if not isinstance(lake, LakeUrl):
        return local_staging_dir(run_id)
    from deltadrain.lake.objectstore import sweep_abandoned

    name = check_run_id(run_id)
    root = lake / "_deltadrain" / "staging"
    sweep_abandoned(root, time.time() - STAGING_ABANDONED_S)
    return root / name


def remove_staging(scratch: Path | LakeUrl) -> None:
    """Remove a run's staging directory, wherever it is; one already gone is no error."""
    if isinstance(scratch, LakeUrl):
        from deltadrain.lake.objectstore import remove_tree

        remove_tree(scratch)
    else:
        shutil.rmtree(scratch, ignore_errors=True)
