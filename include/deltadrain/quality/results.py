"""The results table `<lake>/_deltadrain/quality/results`: every check appends one row (write_result)
of its QualityReport."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path

from deltadrain.config import DeltadrainConfig, PipelineConfig
from deltadrain.config.lakeurl import LakeUrl
from deltadrain.lake.delta import add_missing_columns, append_rows, ensure_table, is_table, retry_conflicts

log = logging.getLogger(__name__)

RESULTS_SCHEMA = ("pipeline STRING NOT NULL, scope STRING NOT NULL, batch BIGINT, table_version BIGINT, "
                  "run_id STRING, batch_run_id STRING, suite STRING, policy STRING, success BOOLEAN, "
                  "rows_checked BIGINT, unexpected_count BIGINT, failed STRING, results STRING, "
                  "quarantined BIGINT, checked_at TIMESTAMP, data_docs STRING, table_id STRING, "
                  "adopted_runs ARRAY<STRING>")


@dataclass
class QualityReport:
    pipeline: str
    scope: str  # "batch" or "table"
    batch: int | None
    suite: str
    policy: str
    success: bool
    rows_checked: int
    results: list[dict] = field(default_factory=list)  # one per expectation
    failed: list[str] = field(default_factory=list)  # names of the failed expectations
    quarantined: int = 0
    taken_back: int = 0  # rows rewritten during the check, left in the target (take_back_rewritten)
    table_version: int | None = None
    run_id: str = ""
    batch_run_id: str | None = None
    checked_at: datetime | None = None
    data_docs: str = ""
    results_table: str = ""
    table_id: str | None = None  # the target's Delta id: which table `batch` is a batch of
    adopted_runs: list[str] = field(default_factory=list)  # checks that moved rows, then died unreported (unreported)
    adopted_failed: list[str] = field(default_factory=list)  # the checks the rows those runs moved broke

    @property
    def unexpected_count(self) -> int:
        return sum(r.get("unexpected_count") or 0 for r in self.results)

    def as_dict(self) -> dict:
        return {**asdict(self), "unexpected_count": self.unexpected_count}


def results_path(cfg: DeltadrainConfig) -> Path | LakeUrl:
    return cfg.quality_results_path()


def write_result(spark, cfg: DeltadrainConfig, report: QualityReport) -> None:
    """Append the check's row: with delta-rs (no Spark job; its first append creates the table), else
    through Spark (a table that lacks a newer column gains it first)."""
    from pyspark.sql.types import _parse_datatype_string

    path = str(results_path(cfg))
    schema = _parse_datatype_string(RESULTS_SCHEMA)
    row = (report.pipeline, report.scope, report.batch, report.table_version, report.run_id, report.batch_run_id,
           report.suite, report.policy, report.success, report.rows_checked, report.unexpected_count,
           json.dumps(report.failed), json.dumps(report.results, default=str), report.quarantined,
           report.checked_at, report.data_docs, report.table_id, report.adopted_runs)
    try:
        append_rows(path, schema, [row])
        return
    except Exception as exc:
        log.debug("quality result append with delta-rs failed (%s); appending with Spark", exc)
    ensure_table(spark, path, schema)
    add_missing_columns(spark, path, schema)  # a results table from before `table_id`
    df = spark.createDataFrame([row], schema)
    retry_conflicts(lambda: df.write.format("delta").mode("append").save(path))  # blind append: idempotent enough


def last_results(spark, cfg: DeltadrainConfig, pipeline: PipelineConfig, n: int = 10) -> list[dict]:
    from pyspark.sql import functions as F

    path = str(results_path(cfg))
    if not is_table(spark, path):
        return []
    df = spark.read.format("delta").load(path).where(F.col("pipeline") == F.lit(pipeline.name))
    return [r.asDict() for r in df.orderBy(F.col("checked_at").desc()).limit(n).collect()]
