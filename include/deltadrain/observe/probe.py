"""Probe: is there work at a source? Cheap reads only (no Spark, no claims), for sensors and triggers.

- new: messages appended and not yet taken (Valkey group lag; Kafka end offsets beyond the group's
  committed offsets, which never lead the lake checkpoint, so this errs towards running a drain);
- reclaimable: Valkey entries pending longer than min_idle_ms (a dead drain's claims);
- gaps: entries the source deleted before any commit held them (Kafka retention; Valkey trimming,
  XDEL). A run must meet them even when nothing readable follows: under on_gap: fail it stops there,
  a failure the Airflow UI shows; under continue it commits past them, once.
"""

from __future__ import annotations

from deltadrain.config import DeltadrainConfig, PipelineConfig
from deltadrain.sources import Probe, source_of


def probe(cfg: DeltadrainConfig, pipeline: PipelineConfig) -> Probe:
    return source_of(pipeline).probe(cfg, pipeline)


def probe_named(config: str | None, pipeline: str) -> dict:
    """probe() of a pipeline named in a config file (what sensors and triggers carry around)."""
    from deltadrain.config import load_config

    cfg = load_config(config)
    return probe(cfg, cfg.pipeline(pipeline)).as_dict()
