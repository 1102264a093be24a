"""What a task read and wrote, named as OpenLineage names datasets (docs/observability.md).

- a Kafka topic: namespace `kafka://{host}:{port}` of the first bootstrap server, name the topic
  (OpenLineage's naming spec);
- a Valkey stream: namespace `valkey://{host}:{port}` of the server (a cluster: its first seed node),
  name the stream key; the spec has no entry for Valkey, so deltadrain's follows the Kafka one;
- a Delta table: namespace `file` and the absolute path on a local lake; on the object store the
  namespace `s3://{bucket}` (the spec's, for s3a:// too) and the key.

`task_datasets` decides, purely from the config and the job's summary, which datasets a job of the
DAGs read and wrote and how many rows it wrote to each: the orchestration layer turns them into the
provider's facets. `table_fields` reads a Delta table's columns for the schema facet (delta-rs, no JVM).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from deltadrain.config import DeltadrainConfig, PipelineConfig
from deltadrain.config.lakeurl import LakeUrl

__all__ = ["DatasetName", "Dataset", "source_namespace", "source_datasets", "table_dataset", "task_datasets",
           "field_type", "table_fields"]


@dataclass(frozen=True)
class DatasetName:
    namespace: str
    name: str

    @property
    def uri(self) -> str:
        """One string for the dataset: `kafka://host:port/topic`, `file:///lake/orders`, `s3://bucket/key`."""
        if self.namespace == "file":
            return Path(self.name).as_uri()
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Dataset:
    """A dataset a job read or wrote: its name, the Delta table's path when it is one (for its schema),
    and the rows the job wrote to it when it is an output and the count is known."""

    name: DatasetName
    table: str | None = None
    rows: int | None = None


def source_namespace(kind: str, address: str) -> str:
    """`kafka://host:port` or `valkey://host:port` from the source's address (`host:port`, several joined
    by commas: the first names the namespace, as OpenLineage's Kafka naming takes the first bootstrap server)."""
    first = address.split(",")[0].strip()
    for scheme in ("PLAINTEXT://", "SSL://", "SASL_PLAINTEXT://", "SASL_SSL://"):  # a listener-style address
        first = first.removeprefix(scheme)
    return f"{kind}://{first}"


def source_datasets(cfg: DeltadrainConfig, pipeline: PipelineConfig) -> list[DatasetName]:
    """The topic, or each stream key, the pipeline reads (the embedded service's address when the config
    names none)."""
    from deltadrain.sources import source_of

    source = source_of(pipeline)
    namespace = source_namespace(pipeline.source.kind, source.address(cfg, pipeline))
    return [DatasetName(namespace, name) for name in source.reads(pipeline)]


def table_dataset(path: Path | LakeUrl | str) -> DatasetName:
    if isinstance(path, LakeUrl) or str(path).startswith(("s3a://", "s3://")):
        url = path if isinstance(path, LakeUrl) else LakeUrl(str(path))
        return DatasetName(f"s3://{url.bucket}", url.key)
    return DatasetName("file", str(Path(path).absolute()))


def _table(path: Path | LakeUrl, rows: int | None = None) -> Dataset:
    return Dataset(table_dataset(path), str(path), rows)


def _count(summary: dict | None, key: str) -> int | None:
    value = (summary or {}).get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def task_datasets(job: str, cfg: DeltadrainConfig, pipeline: PipelineConfig | None, summary: dict | None,
                  request: dict | None = None) -> tuple[list[Dataset], list[Dataset]]:
    """(inputs, outputs) of one task of deltadrain's DAGs: `job` as in deltadrain.jobs, `summary` what it
    returned (None: it failed before it had one, and no output's row count is known), `request` a
    replay's. A drain or backfill reads the source and writes the target, and the DLQ only when it
    wrote dead letters; a DLQ replay reads the DLQ and appends to the source; a reprocess reads the
    source and rewrites target rows; maintenance rewrites the files of its tables; a batch check reads
    the target and appends results. A dry run writes nothing."""
    if job == "maintain":
        if pipeline is None:
            tables = {"metrics": cfg.metrics_path(), "quality_results": cfg.quality_results_path()}
        else:
            tables = {"target": cfg.target_path(pipeline), "dlq": cfg.dlq_path(pipeline),
                      "quarantine": cfg.quarantine_path(pipeline)}
        done = [t for t in (summary or {}).get("tables") or [] if t.get("skipped") is None]
        kept = {t["table"] for t in done} if summary is not None else set(tables)
        return [], [_table(path) for name, path in tables.items() if name in kept]
    if pipeline is None:
        return [], []
    source = [Dataset(name) for name in source_datasets(cfg, pipeline)]
    target, dlq = cfg.target_path(pipeline), cfg.dlq_path(pipeline)
    if job == "drain":
        outputs = [_table(target, _count(summary, "written"))]
        dead = _count(summary, "dead_lettered")
        if dead:
            outputs.append(_table(dlq, dead))
        return source, outputs
    if job == "replay":
        request = request or {}
        mode = (summary or {}).get("mode") or request.get("mode")
        dry = (summary or {}).get("dry_run", request.get("dry_run", True))
        if mode == "reprocess":
            return source, [] if dry else [_table(target, _count(summary, "written"))]
        if mode == "dlq":
            if dry:
                return [_table(dlq)], []
            # The dead letters go back to their partitions; with one, the count is that partition's.
            sent = _count(summary, "replayed") if len(source) == 1 else None
            return [_table(dlq)], [Dataset(s.name, rows=sent) for s in source] + [_table(dlq)]
        return [], []
    if job == "quality":
        return [_table(target)], [_table(cfg.quality_results_path())]
    return [], []


# -- the schema facet's columns (I/O: the table's log, through delta-rs) ------------------------------


def field_type(data_type) -> str:
    """A delta-rs column type as the schema facet shows it: `string`, `long`, `struct`, `array`, `map`,
    `decimal(10,2)` (pure)."""
    kind = getattr(data_type, "type", None)
    if isinstance(kind, str):  # a primitive, or the name of a complex type
        return kind
    return type(data_type).__name__.removesuffix("Type").lower() or str(data_type)


def table_fields(path: str) -> list[tuple[str, str]] | None:
    """(column, type) of the Delta table at `path`, or None when it cannot be read (no table yet)."""
    from deltadrain.observe.tables import open_table

    try:
        table = open_table(path)
        if table is None:
            return None
        return [(f.name, field_type(f.type)) for f in table.schema().fields]
    except Exception:  # lineage is best effort: a table it cannot read gets no schema facet
        return None
