"""A pipeline's Assets in Airflow: what its source names (each Valkey stream, the Kafka topic), which an
`on_data` ingest DAG is scheduled on and an AssetWatcher marks; its target table and its dead-letter
table, the drain task's outlets, which a continuous or on_data pipeline's quality DAG is scheduled on.

Airflow's asset graph then reads source -> ingest -> target (and dead letters) -> quality."""

from __future__ import annotations

import urllib.parse

from airflow.sdk import Asset, AssetWatcher

from deltadrain.config import DeltadrainConfig, PipelineConfig
from deltadrain.observe.lineage import source_namespace
from deltadrain.sources import NamesPartitions, source_of


def source_uri(kind: str, address: str, name: str) -> str:
    """`kafka://host:port/topic`, `valkey://host:port/stream`: the source's kind as the scheme, its first
    server (as OpenLineage names a Kafka topic's namespace by its first bootstrap server, and Airflow's
    Kafka provider its Assets) and the stream or topic, quoted where a URL path needs it. The namespace is
    the one the tasks' lineage names the source by (deltadrain.observe.lineage), so both name it alike."""
    return f"{source_namespace(kind, address)}/{urllib.parse.quote(name, safe=':{}@')}"


def watched(cfg: DeltadrainConfig, pipeline: PipelineConfig) -> list[tuple[str, list[str] | None]]:
    """(URI, the probe's partitions its watcher decides on) per Asset of the pipeline's source: one per
    stream of a Valkey pipeline, one for a Kafka topic (all its partitions: None)."""
    source = source_of(pipeline)
    address = source.address(cfg, pipeline)
    if isinstance(source, NamesPartitions):
        return [(source_uri(source.kind, address, key), [key]) for key in source.partition_names(pipeline)]
    return [(source_uri(source.kind, address, name), None) for name in source.reads(pipeline)]


def watcher_name(pipeline: PipelineConfig) -> str:
    return f"deltadrain__{pipeline.name}"


def source_assets(cfg: DeltadrainConfig, pipeline: PipelineConfig, config: str | None) -> list[Asset]:
    """The source's Assets, each watched by a `SourceDataTrigger` on the pipeline (by name and config file:
    no login in the trigger's kwargs). Named by their URI: the Asset is the stream or topic, whichever
    pipeline reads it."""
    from deltadrain.orchestration.triggers import SourceDataTrigger

    af = pipeline.airflow
    return [Asset(name=uri, uri=uri, watchers=[AssetWatcher(
                name=watcher_name(pipeline),
                trigger=SourceDataTrigger(pipeline.name, config, poll_seconds=af.poll_interval.total_seconds(),
                                          again_seconds=af.wait_timeout.total_seconds(), watch=watch))])
            for uri, watch in watched(cfg, pipeline)]


def target_asset(cfg: DeltadrainConfig, pipeline: PipelineConfig) -> Asset:
    return Asset(name=f"deltadrain.{pipeline.name}", uri=cfg.target_path(pipeline).as_uri())


def dlq_asset(cfg: DeltadrainConfig, pipeline: PipelineConfig) -> Asset:
    return Asset(name=f"deltadrain.{pipeline.name}.dlq", uri=cfg.dlq_path(pipeline).as_uri())
