"""States of a pipeline that are no failure, said in words: what each is and what to do about it
(`deltadrain status`, the view). Each is a note, {"state": ..., "note": ...}, shown in grey.

Those of the lake and of reaching the server are the same for every source and are made here: a
pipeline never run (no target table yet) and a source that cannot be reached. A source's own (a
topic not created yet, a stream never written) come with its `counts` (sources/<kind>/status.py).
"""

from __future__ import annotations

from pathlib import Path

from deltadrain.config import DeltadrainConfig, PipelineConfig
from deltadrain.names import ingest_dag_id
from deltadrain.paths import command_line
from deltadrain.sources import LakeSide, SourceNote, source_of

NEVER_RUN = "never_run"


def note(state: str, text: str) -> dict:
    return {"state": state, "note": text}


def never_run(pipeline: PipelineConfig, has_target: bool, config: Path | None = None) -> dict | None:
    """The note of a pipeline whose target table does not exist yet (pure). `config`: the config file
    the command it names reads."""
    if has_target:
        return None
    return note(NEVER_RUN, f"never run: pipeline '{pipeline.name}' has no target table yet; the first drain run "
                           f"that commits a batch makes it (trigger the DAG {ingest_dag_id(pipeline.name)} in "
                           f"Airflow, or run `{command_line(f'drain {pipeline.name}', config)}`)")


def source_down(exc: BaseException, cfg: DeltadrainConfig, pipeline: PipelineConfig,
                with_reason: bool = True) -> dict | None:
    """The note of a source whose server cannot be reached or refused the login: its address and the
    fix; None when `exc` is no such failure."""
    from deltadrain.sources.connections import unreachable

    found = unreachable(exc, cfg, [pipeline], with_reason)
    return note(*found) if found is not None else None


def source_counts(cfg: DeltadrainConfig, pipeline: PipelineConfig, lake: LakeSide, until: float | None = None,
                  quick: bool = False, with_reason: bool = True) -> dict:
    """The source's counts (`Source.counts`, with its own notes), or for a server that cannot be
    reached PENDING and CLAIMED unknown (None) and a note that says so. What the source answered
    (SourceNote) and any other failure are raised."""
    try:
        return source_of(pipeline).counts(cfg, pipeline, lake, until=until, quick=quick)
    except SourceNote:
        raise
    except Exception as exc:
        down = source_down(exc, cfg, pipeline, with_reason)
        if down is None:
            raise
        return {"PENDING": None, "CLAIMED": None, "claimed_by": {}, "oldest_claim_idle_ms": None, "partitions": {},
                "notes": [down]}
