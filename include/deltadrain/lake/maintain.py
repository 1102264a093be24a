"""Table maintenance: compact small files (OPTIMIZE), then delete the files it replaced (VACUUM).

Every batch commits files to the target, and its dead letters and metrics row are more: a month of
five-minute batches leaves thousands of small files that every read pays for (the MERGE, the quality
checks, the view). OPTIMIZE rewrites them into larger ones without changing the data. Its commit
has dataChange=false and no deltadrain metadata: it moves no batch, `find_commit` looks past it for
the checkpoint, and a drain whose MERGE read files it replaced loses the race and retries
(commit.py). VACUUM then deletes replaced files older than `maintenance.retain`.

The Airflow tasks of a pipeline's tables run in its one-slot pool, so they never meet its drains
there; the shared tables (metrics, quality results) only ever get appends, which OPTIMIZE does not
conflict with.
"""

from __future__ import annotations

import json
import logging
import os
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from deltadrain.config import DeltadrainConfig, MaintenanceConfig, PipelineConfig
from deltadrain.config.lakeurl import LakeUrl, is_s3_url
from deltadrain.lake.delta import is_table, retry_conflicts, table_ref
from deltadrain.lake.objectstore import objects_under

# Delta refuses a VACUUM that keeps less than this unless its check is switched off.
DELTA_MIN_RETAIN_HOURS = 168
RETENTION_CHECK = "spark.databricks.delta.retentionDurationCheck.enabled"

log = logging.getLogger("deltadrain.lake.maintain")


@dataclass
class TableReport:
    table: str  # target, dlq, quarantine, metrics, quality_results
    path: str
    files_before: int | None = None  # data files in the current snapshot
    files_after: int | None = None
    compacted: int = 0  # files OPTIMIZE replaced ...
    added: int = 0  # ... by these
    vacuumed: int = 0  # data files VACUUM deleted from disk (less any a writer added meanwhile)
    skipped: str | None = None
    seconds: float = 0.0


def pipeline_tables(cfg: DeltadrainConfig, pipeline: PipelineConfig) -> dict[str, Path | LakeUrl]:
    return {"target": cfg.target_path(pipeline), "dlq": cfg.dlq_path(pipeline),
            "quarantine": cfg.quarantine_path(pipeline)}


def shared_tables(cfg: DeltadrainConfig) -> dict[str, Path | LakeUrl]:
    return {"metrics": cfg.metrics_path(), "quality_results": cfg.quality_results_path()}


def files_on_disk(path: str | Path) -> int:
    """Parquet files under a table's directory, referenced or not (what VACUUM deletes from)."""
    if is_s3_url(path):
        return objects_under(path, ".parquet", skip="_delta_log")
    count = 0
    for _root, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if d != "_delta_log"]
        count += sum(1 for f in files if f.endswith(".parquet"))
    return count


def snapshot_files(spark, path: str) -> int:
    return int(spark.sql(f"DESCRIBE DETAIL {table_ref(path)}").select("numFiles").first()[0])


def retain_hours(settings: MaintenanceConfig) -> float:
    return settings.retain.total_seconds() / 3600


@contextmanager
def retention_allowed(spark, hours: float):
    """Delta's check refuses a retention under 7 days; the config's value is the operator's decision."""
    if hours >= DELTA_MIN_RETAIN_HOURS:
        yield
        return
    log.warning("maintenance.retain is %g h, below Delta's 7-day safety check, which is off for this VACUUM: "
                "a reader or writer of the table running longer than that can fail on a deleted file", hours)
    before = spark.conf.get(RETENTION_CHECK, None)
    spark.conf.set(RETENTION_CHECK, "false")
    try:
        yield
    finally:
        if before is None:
            spark.conf.unset(RETENTION_CHECK)
        else:
            spark.conf.set(RETENTION_CHECK, before)


def maintain_table(spark, name: str, path: str | Path | LakeUrl, settings: MaintenanceConfig) -> TableReport:
    began = time.monotonic()
    path = str(path)
    report = TableReport(name, path)
    if not is_table(spark, path):
        report.skipped = "no table yet"
        return report
    report.files_before = snapshot_files(spark, path)
    if settings.optimize:
        # Idempotent: a compaction that lost a race to another writer's commit is simply run again.
        metrics = retry_conflicts(lambda: spark.sql(f"OPTIMIZE {table_ref(path)}")
                                  .select("metrics.numFilesRemoved", "metrics.numFilesAdded").first())
        report.compacted, report.added = int(metrics[0]), int(metrics[1])
    if settings.vacuum:
        before = files_on_disk(path)
        hours = retain_hours(settings)
        with retention_allowed(spark, hours):
            spark.sql(f"VACUUM {table_ref(path)} RETAIN {hours!r} HOURS").collect()
        report.vacuumed = max(0, before - files_on_disk(path))
    report.files_after = snapshot_files(spark, path)
    report.seconds = round(time.monotonic() - began, 3)
    return report


@dataclass
class MaintenanceSummary:
    pipeline: str | None  # None: the shared tables
    optimize: bool
    vacuum: bool
    retain_hours: float
    tables: list[TableReport]

    def as_dict(self) -> dict:
        done = [t for t in self.tables if t.skipped is None]
        return {"pipeline": self.pipeline, "scope": "shared" if self.pipeline is None else "pipeline",
                "optimize": self.optimize, "vacuum": self.vacuum, "retain_hours": self.retain_hours,
                "files_before": sum(t.files_before or 0 for t in done),
                "files_after": sum(t.files_after or 0 for t in done),
                "compacted": sum(t.compacted for t in done), "vacuumed": sum(t.vacuumed for t in done),
                "seconds": round(sum(t.seconds for t in self.tables), 3),
                "tables": [asdict(t) for t in self.tables]}

    def line(self) -> str:
        """The one-line JSON summary a job prints (the Airflow task's XCom)."""
        return json.dumps(self.as_dict(), separators=(",", ":"))


def maintain(cfg: DeltadrainConfig, spark, pipeline: PipelineConfig | None = None) -> MaintenanceSummary:
    """Maintain one pipeline's tables (target, DLQ, quarantine), or with no pipeline the shared ones
    (metrics, quality results)."""
    tables = pipeline_tables(cfg, pipeline) if pipeline is not None else shared_tables(cfg)
    settings = cfg.maintenance
    return MaintenanceSummary(pipeline.name if pipeline is not None else None, settings.optimize, settings.vacuum,
                              retain_hours(settings),
                              [maintain_table(spark, name, path, settings) for name, path in tables.items()])


def describe(summary: dict) -> list[str]:
    """The summary as lines for a terminal or a task log."""
    who = summary["pipeline"] or "shared tables"
    lines = [f"maintained {who}: {summary['files_before']} -> {summary['files_after']} files, "
             f"{summary['compacted']} compacted, {summary['vacuumed']} deleted from disk "
             f"(retain {summary['retain_hours']:g} h) in {summary['seconds']} s"]
    for t in summary["tables"]:
        if t["skipped"]:
            lines.append(f"  {t['table']:<16} skipped: {t['skipped']}")
        else:
            lines.append(f"  {t['table']:<16} {t['files_before']} -> {t['files_after']} files, "
                         f"{t['compacted']} replaced by {t['added']}, {t['vacuumed']} deleted  {t['path']}")
    return lines
