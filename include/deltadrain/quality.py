"""Data quality: a Great Expectations suite per pipeline, run on one batch's rows or on the whole table.

- The suite comes from the pipeline's `quality` config (build_checks, a pure function); with no
  expectations declared, the default suite checks the message id (not null, unique) and the
  required columns (present, typed, not null).
- GX 1.x is called directly with an ephemeral context (nothing written but the Data Docs) and its
  Spark dataframe datasource. Analytics are off: nothing outside the machine is contacted.
- A batch's rows are the rows whose `_dd_batch` is the batch: every target row carries the batch
  that wrote it, so the filter is exact, and Delta's file statistics on `_dd_batch` skip every
  other file. The batch's commit (checkpoint.find_commit) supplies the table version and drain run.
- Every check appends one row to the results table `<lake>/_deltadrain/quality/results`, and
  renders Data Docs under `$DELTADRAIN_HOME/quality/data_docs/<pipeline>/index.html`.
- A batch check with `owed` first takes on the committed batches that have no result yet
  (owed_batches): a drain try that died after its commit hands its batch to no quality task,
  even when that was the pipeline's first Airflow drain (first_scheduled).
- Failure policy: `fail` raises QualityFailed (after the results row is written), `warn` logs and
  returns, `quarantine` moves the batch's offending rows to `<lake>/_deltadrain/quarantine/<pipeline>`.

Quarantine, and why it loses nothing: the offending rows are first MERGEd into the quarantine
table (insert-only, keyed on message id + batch + source position, so a rerun adds nothing), and
only then DELETEd from the target (a MERGE ... WHEN MATCHED DELETE on the same keys and the row's
`_dd_run_id`: a row a reprocess rewrote meanwhile stays, see take_back_rewritten). A crash
between the two leaves the rows in both tables; the next check of that batch finds them again in
the target, the quarantine MERGE skips them, and the DELETE completes. A crash after the DELETE and
before the results row leaves rows no result accounts for: the next check of the batch reports them
as its own (unreported, `adopted_runs`) rather than a clean pass. The DELETE commit carries no
SetTransaction and no `pipeline`/`batch` metadata, so the drain's checkpoint (the newest commit
naming the pipeline, else the txn) is untouched. It must not run concurrently with a drain of the
same pipeline (the drain's MERGE would lose the race and stop): the ingest DAG runs it right after
the drain, and a whole-table check never quarantines (it reports, with `quarantine` acting as `warn`).
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from deltadrain import failpoints
from deltadrain.checkpoint import carries_batch, committed_batch, find_commit
from deltadrain.config import DeltadrainConfig, PipelineConfig
from deltadrain.errors import DeltadrainError
from deltadrain.lake import (
    add_missing_columns,
    ensure_table,
    is_table,
    of_table,
    recent_commits,
    retry_conflicts,
    snapshot_txn,
    table_id,
)
from deltadrain.metrics import batch_finished_at
from deltadrain.orchestration.names import ingest_run_prefix
from deltadrain.paths import state_home

log = logging.getLogger(__name__)

ROW_LEVEL = ("not_null", "unique", "between", "in_set")  # a failing row can be named and moved
SPARK_TYPE_CLASS = {"string": "StringType", "long": "LongType", "int": "IntegerType", "integer": "IntegerType",
                    "double": "DoubleType", "float": "FloatType", "boolean": "BooleanType",
                    "timestamp": "TimestampType", "date": "DateType", "binary": "BinaryType"}
RESULTS_SCHEMA = ("pipeline STRING NOT NULL, scope STRING NOT NULL, batch BIGINT, table_version BIGINT, "
                  "run_id STRING, batch_run_id STRING, suite STRING, policy STRING, success BOOLEAN, "
                  "rows_checked BIGINT, unexpected_count BIGINT, failed STRING, results STRING, "
                  "quarantined BIGINT, checked_at TIMESTAMP, data_docs STRING, table_id STRING, "
                  "adopted_runs ARRAY<STRING>")
TXN_KEYS = ("spark.databricks.delta.write.txnAppId", "spark.databricks.delta.write.txnVersion")
USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"
DOCS_KEEP = 200  # validation pages kept per pipeline; the results table keeps the whole history
FIRST_SCHEDULED_SCAN = 200  # commits looked over for the ingest DAG's first batch (the view looks as far)
RECHECKS = 2  # a batch check checks again this often when rows were rewritten under it (take_back_rewritten)
CATCH_UP = 20  # owed batches a batch check takes on besides its own; the next check takes the rest


class QualityError(DeltadrainError):
    """A check that cannot run (no table, batch not committed, GX failure)."""


class QualityFailed(DeltadrainError):
    """The data failed its suite and the pipeline's policy is `fail`."""

    def __init__(self, report: QualityReport):
        self.report = report
        where = f"batch {report.batch}" if report.scope == "batch" else "the whole table"
        super().__init__(f"pipeline '{report.pipeline}': {where} failed data quality: "
                         f"{'; '.join(report.failed)} (results in {report.results_table}, Data Docs {report.data_docs})")


# -- the suite, in deltadrain's terms (pure) ---------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    """One expectation of a suite: what it checks, and its name in logs, errors and the results table."""

    kind: str  # not_null | unique | between | in_set | type | exists | fresh_within
    column: str
    min: float | None = None
    max: float | None = None
    values: tuple = ()
    type: str | None = None
    within: timedelta | None = None

    @property
    def row_level(self) -> bool:
        return self.kind in ROW_LEVEL

    @property
    def name(self) -> str:
        if self.kind == "between":
            return f"{self.column} between {self.min} and {self.max}"
        if self.kind == "in_set":
            return f"{self.column} in {list(self.values)}"
        if self.kind == "type":
            return f"{self.column} is {self.type}"
        if self.kind == "fresh_within":
            return f"{self.column} newest within {self.within}"
        return f"{self.column} {self.kind.replace('_', ' ')}"


def suite_name(pipeline: PipelineConfig) -> str:
    return f"deltadrain_{pipeline.name}"


def default_checks(pipeline: PipelineConfig) -> list[Check]:
    schema = pipeline.payload_schema
    checks = [Check("not_null", schema.id_field), Check("unique", schema.id_field)]
    for column in dict.fromkeys([schema.id_field, *schema.required]):
        checks += [Check("exists", column), Check("type", column, type=schema.fields[column])]
        if column != schema.id_field:
            checks.append(Check("not_null", column))
    return checks


def build_checks(pipeline: PipelineConfig) -> list[Check]:
    """The pipeline's suite: its declared expectations, or the default suite when it declares none."""
    declared = pipeline.quality.expectations
    if not declared:
        return default_checks(pipeline)
    return [Check(e.kind, e.column, e.min, e.max, tuple(e.values or ()), e.type.lower() if e.type else None,
                  e.within) for e in declared]


def gx_expectation(check: Check, index: int, now: datetime):
    """The GX expectation of a check; `meta.deltadrain` maps its result back to the check."""
    import great_expectations as gx

    ex, meta = gx.expectations, {"deltadrain": index}
    if check.kind == "not_null":
        return ex.ExpectColumnValuesToNotBeNull(column=check.column, meta=meta)
    if check.kind == "unique":
        return ex.ExpectColumnValuesToBeUnique(column=check.column, meta=meta)
    if check.kind == "between":
        return ex.ExpectColumnValuesToBeBetween(column=check.column, min_value=check.min, max_value=check.max,
                                                meta=meta)
    if check.kind == "in_set":
        return ex.ExpectColumnValuesToBeInSet(column=check.column, value_set=list(check.values), meta=meta)
    if check.kind == "type":
        kind = "DecimalType" if check.type.startswith("decimal") else SPARK_TYPE_CLASS[check.type]
        return ex.ExpectColumnValuesToBeOfType(column=check.column, type_=kind, meta=meta)
    if check.kind == "exists":
        return ex.ExpectColumnToExist(column=check.column, meta=meta)
    if check.kind == "fresh_within":
        # PySpark hands timestamps to Python as naive local times, so "now" must be naive local too.
        return ex.ExpectColumnMaxToBeBetween(column=check.column, min_value=now - check.within, meta=meta)
    raise ValueError(f"unknown expectation kind {check.kind!r}")


def violation(check: Check, df):
    """A boolean Column: this row breaks `check` (row-level checks only; nulls break only not_null, as in GX)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    col = F.col(f"`{check.column}`")
    if check.kind == "not_null":
        return col.isNull()
    if check.kind == "unique":
        return col.isNotNull() & (F.count(F.lit(1)).over(Window.partitionBy(col)) > 1)
    if check.kind == "between":
        low = col < F.lit(check.min) if check.min is not None else F.lit(False)
        high = col > F.lit(check.max) if check.max is not None else F.lit(False)
        return col.isNotNull() & (low | high)
    if check.kind == "in_set":
        return col.isNotNull() & ~col.isin(list(check.values))
    raise ValueError(f"{check.kind} is not a row-level check")


# -- the report ------------------------------------------------------------------------------------------


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


def gx_error(info) -> str | None:
    """The exception GX met evaluating an expectation, if any. GX 1.x reports it either flat or, when
    a metric failed (a missing column), as one entry per metric."""
    if not isinstance(info, dict):
        return None
    if info.get("raised_exception"):
        return info.get("exception_message") or "raised an exception"
    nested = [gx_error(v) for v in info.values() if isinstance(v, dict)]
    return next((e for e in nested if e), None)


def summarize(checks: list[Check], gx_result) -> list[dict]:
    """GX's validation result -> one plain dict per check, in the suite's order."""
    out: list[dict | None] = [None] * len(checks)
    for r in gx_result.results:
        index = (r.expectation_config.meta or {}).get("deltadrain")
        if index is None:
            continue
        check, res, exc = checks[index], r.result or {}, r.exception_info or {}
        observed = res.get("observed_value")
        out[index] = {
            "expectation": check.name, "kind": check.kind, "column": check.column, "success": bool(r.success),
            "unexpected_count": res.get("unexpected_count"), "element_count": res.get("element_count"),
            "observed": observed.isoformat() if isinstance(observed, datetime) else observed,
            "partial_unexpected": [str(v) for v in (res.get("partial_unexpected_list") or [])[:10]],
            "error": gx_error(exc),
        }
    for i, item in enumerate(out):
        if item is None:  # GX left it out: count it as failed rather than silently passed
            out[i] = {"expectation": checks[i].name, "kind": checks[i].kind, "column": checks[i].column,
                      "success": False, "error": "no result from Great Expectations"}
    return out


# -- paths -----------------------------------------------------------------------------------------------


def results_path(cfg: DeltadrainConfig) -> Path:
    return cfg.lake_dir() / "_deltadrain" / "quality" / "results"


def quarantine_path(cfg: DeltadrainConfig, pipeline: PipelineConfig) -> Path:
    return cfg.quarantine_path(pipeline)


def docs_dir(pipeline: PipelineConfig) -> Path:
    return state_home() / "quality" / "data_docs" / pipeline.name


# -- Great Expectations ----------------------------------------------------------------------------------


def gx_context(site_dir: Path):
    """An ephemeral GX context whose only Data Docs site is `site_dir`; no analytics, no progress bars."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    import great_expectations as gx
    from great_expectations.data_context.types.base import (
        DataContextConfig,
        InMemoryStoreBackendDefaults,
        ProgressBarsConfig,
    )

    config = DataContextConfig(
        store_backend_defaults=InMemoryStoreBackendDefaults(init_temp_docs_sites=False),
        analytics_enabled=False, progress_bars=ProgressBarsConfig(globally=False),
        data_docs_sites={"deltadrain": {
            "class_name": "SiteBuilder", "show_how_to_buttons": False,
            "store_backend": {"class_name": "TupleFilesystemStoreBackend", "base_directory": str(site_dir)},
            "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"}}})
    return gx.get_context(mode="ephemeral", project_config=config)


def run_gx(df, pipeline: PipelineConfig, checks: list[Check], run_name: str, now: datetime):
    """Validate `df` with the pipeline's suite and render Data Docs; returns (GX result, index.html path)."""
    import great_expectations as gx
    from great_expectations.core.run_identifier import RunIdentifier

    site = docs_dir(pipeline)
    site.mkdir(parents=True, exist_ok=True)
    context = gx_context(site)
    asset = context.data_sources.add_spark(f"{pipeline.name}_spark").add_dataframe_asset(pipeline.name)
    batch_definition = asset.add_batch_definition_whole_dataframe("rows")
    suite = context.suites.add(gx.ExpectationSuite(
        name=suite_name(pipeline), expectations=[gx_expectation(c, i, now) for i, c in enumerate(checks)]))
    validation = context.validation_definitions.add(
        gx.ValidationDefinition(name=f"{pipeline.name}_{run_name}", data=batch_definition, suite=suite))
    try:
        result = validation.run(batch_parameters={"dataframe": df}, result_format="SUMMARY",
                                run_id=RunIdentifier(run_name=run_name, run_time=now.astimezone(UTC)))
    except Exception as exc:
        raise QualityError(f"pipeline '{pipeline.name}': Great Expectations could not validate: {exc}") from exc
    context.build_data_docs(site_names=["deltadrain"])
    prune_docs(site)
    return result, site / "index.html"


def prune_docs(site: Path, keep: int = DOCS_KEEP) -> None:
    """Keep the newest `keep` validation pages; the index lists only the latest check anyway."""
    pages = sorted((site / "validations").rglob("*.html"), key=lambda p: p.stat().st_mtime, reverse=True)
    for page in pages[keep:]:
        page.unlink(missing_ok=True)


# -- results and quarantine tables -----------------------------------------------------------------------


def write_result(spark, cfg: DeltadrainConfig, report: QualityReport) -> None:
    from pyspark.sql.types import _parse_datatype_string

    path = str(results_path(cfg))
    schema = _parse_datatype_string(RESULTS_SCHEMA)
    ensure_table(spark, path, schema)
    add_missing_columns(spark, path, schema)  # a results table from before `table_id`
    row = (report.pipeline, report.scope, report.batch, report.table_version, report.run_id, report.batch_run_id,
           report.suite, report.policy, report.success, report.rows_checked, report.unexpected_count,
           json.dumps(report.failed), json.dumps(report.results, default=str), report.quarantined,
           report.checked_at, report.data_docs, report.table_id, report.adopted_runs)
    df = spark.createDataFrame([row], schema)
    retry_conflicts(lambda: df.write.format("delta").mode("append").save(path))  # blind append: idempotent enough


def offending_rows(df, checks: list[Check], failed: list[dict]):
    """The rows breaking a failed row-level check, each with `_dq_reason` naming every check it breaks."""
    from pyspark.sql import functions as F

    # A check GX could not evaluate (its column missing, say) names no rows: it is reported, not moved on.
    bad = [checks[i] for i, r in enumerate(failed)
           if not r["success"] and checks[i].row_level and not r.get("error") and checks[i].column in df.columns]
    if not bad:
        return None
    flagged = df.select("*", *[violation(c, df).alias(f"_dq_v{i}") for i, c in enumerate(bad)])
    reason = F.concat_ws("; ", *[F.when(F.col(f"_dq_v{i}"), F.lit(c.name)) for i, c in enumerate(bad)])
    any_bad = F.lit(False)
    for i in range(len(bad)):
        any_bad = any_bad | F.col(f"_dq_v{i}")
    return flagged.where(any_bad).withColumn("_dq_reason", reason).drop(*[f"_dq_v{i}" for i in range(len(bad))])


def quarantine_keys(id_field: str, left: str):
    """`left` row is source row `s`: null-safe on the id (a null id is itself a reason to quarantine),
    and the source position keeps duplicates of one id apart."""
    from pyspark.sql import functions as F

    cond = F.col(f"{left}._dd_batch") == F.col("s._dd_batch")
    for column in (f"`{id_field}`", "_dd_partition", "_dd_position"):
        cond = cond & F.col(f"{left}.{column}").eqNullSafe(F.col(f"s.{column}"))
    return cond


def quarantine(spark, cfg: DeltadrainConfig, pipeline: PipelineConfig, batch: int, rows, run_id: str,
               table: str | None) -> int:
    """Move `rows` (offending rows of `batch` of the target whose Delta id is `table`, with
    `_dq_reason`) from the target to the quarantine table.

    Quarantine first (idempotent), then delete from the target: see the module docstring.
    """
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    target, qpath = str(cfg.target_path(pipeline)), str(quarantine_path(cfg, pipeline))
    id_field = pipeline.payload_schema.id_field
    staged = (rows.withColumn("_dq_run_id", F.lit(run_id)).withColumn("_dq_quarantined_at", F.current_timestamp())
              .withColumn("_dq_table_id", F.lit(table).cast("string")))
    staged = staged.localCheckpoint()  # the window and the delete below must not re-evaluate against a changed target
    moved = staged.count()
    if moved == 0:
        return 0
    ensure_table(spark, qpath, staged.schema)
    add_missing_columns(spark, qpath, staged.schema)  # a quarantine table from before `_dq_table_id`
    # A copy another target table of this name left at the same place (the table and the source made
    # anew: batch 1 again at the same positions) is not this row's: matching it would insert nothing,
    # and the DELETE below would then leave the row in neither table. Copies from before the column
    # (null) still match, as they did.
    same_table = F.col("q._dq_table_id").isNull() | F.col("q._dq_table_id").eqNullSafe(F.col("s._dq_table_id"))
    retry_conflicts(lambda: DeltaTable.forPath(spark, qpath).alias("q").merge(
        staged.alias("s"), quarantine_keys(id_field, "q") & same_table).whenNotMatchedInsertAll().execute())
    failpoints.fail("before_quarantine_delete")  # tests: a crash here leaves the rows in both tables
    keys = staged.select(f"`{id_field}`", "_dd_batch", "_dd_partition", "_dd_position", "_dd_run_id").distinct()
    # Only the rows as they were checked: one a reprocess replay rewrote since (a new _dd_run_id) stays.
    cond = (quarantine_keys(id_field, "t") & F.col("t._dd_run_id").eqNullSafe(F.col("s._dd_run_id"))
            & (F.col("t._dd_batch") == F.lit(batch)))  # the batch prunes other batches' files
    # No txn and no pipeline/batch keys in this commit's metadata: the drain's checkpoint ignores it.
    for key in TXN_KEYS:
        spark.conf.unset(key)
    spark.conf.set(USER_METADATA, json.dumps({"deltadrain_quality": 1, "quarantine": {
        "pipeline": pipeline.name, "of_batch": batch, "rows": moved, "run_id": run_id}}, sort_keys=True))
    try:
        retry_conflicts(lambda: DeltaTable.forPath(spark, target).alias("t").merge(keys.alias("s"), cond)
                        .whenMatchedDelete().execute())
    finally:
        spark.conf.unset(USER_METADATA)
    failpoints.fail("after_quarantine_delete")  # tests: a crash here leaves moved rows no results row names
    return moved


@dataclass
class Unreported:
    """Rows of a batch in the quarantine table that no results row accounts for (see unreported)."""

    runs: list[str]  # the checks that moved them
    rows: int  # of those, the rows no longer in the target: this check will not move them again
    reasons: list[str]  # the checks those rows broke


def unreported(spark, cfg: DeltadrainConfig, pipeline: PipelineConfig, batch: int, table: str | None) -> Unreported:
    """The quarantine rows of `batch` moved by checks that wrote no results row: a check that died
    after its DELETE (or between its MERGE and DELETE) and before write_result. Without this, the
    next check would find the batch clean and report it passed with nothing quarantined.

    A results row accounts for the rows of its own `run_id` and of its `adopted_runs`. Copies of
    rows still in the target are the next quarantine's to move and count; they are adopted but not
    counted here. Rows of another target table of the same name (deleted and created again) are not
    this batch's: `_dq_table_id` tells them apart. Rows from before it (null) count for any table,
    and only when moved after the batch's last result: before this function, the check that finished
    a crashed check's move counted that check's rows as its own.
    """
    from pyspark.sql import functions as F

    qpath, rpath = str(quarantine_path(cfg, pipeline)), str(results_path(cfg))
    if not is_table(spark, qpath):
        return Unreported([], 0, [])
    copies = of_table(spark.read.format("delta").load(qpath).where(F.col("_dd_batch") == F.lit(batch)), table)
    older = F.col("_dq_table_id").isNull() if "_dq_table_id" in copies.columns else F.lit(True)
    # Per run: one quarantine MERGE wrote its rows, with one table id and one timestamp.
    seen = copies.groupBy("_dq_run_id").agg(F.max(older.cast("int")).alias("older"),
                                             F.max("_dq_quarantined_at").alias("at")).collect()
    if not seen:  # most checks: the batch has nothing in the quarantine yet, and the results are not read
        return Unreported([], 0, [])
    accounted, last = set(), None
    if is_table(spark, rpath):
        results = spark.read.format("delta").load(rpath).where(
            (F.col("pipeline") == F.lit(pipeline.name)) & (F.col("scope") == F.lit("batch"))
            & (F.col("batch") == F.lit(batch)))
        adopted = F.col("adopted_runs") if "adopted_runs" in results.columns else F.array().cast("array<string>")
        for r in results.select("run_id", adopted.alias("adopted"), "checked_at").collect():
            accounted |= {r.run_id, *(r.adopted or [])}
            last = r.checked_at if last is None or (r.checked_at and r.checked_at > last) else last
    runs = {r._dq_run_id for r in seen if r._dq_run_id not in accounted
            and not (r.older and last is not None and r.at is not None and r.at <= last)}
    if not runs:
        return Unreported([], 0, [])
    rows = spark.read.format("delta").load(str(cfg.target_path(pipeline))).where(F.col("_dd_batch") == F.lit(batch))
    gone = (copies.where(F.col("_dq_run_id").isin(sorted(runs))).alias("s")
            .join(rows.alias("t"), quarantine_keys(pipeline.payload_schema.id_field, "t"), "left_anti"))
    counted = gone.groupBy("_dq_reason").count().collect()
    return Unreported(sorted(runs), sum(r["count"] for r in counted),
                      reasons_of([r._dq_reason for r in counted if r._dq_reason]))


def reasons_of(dq_reasons: list[str]) -> list[str]:
    """The check names in `_dq_reason` values (each names every check its row breaks, "; "-joined), once each."""
    return sorted({name for reason in dq_reasons for name in reason.split("; ") if name})


def with_unreported(failed: list[str], reasons: list[str]) -> list[str]:
    """The failed checks of a report that adopts unreported quarantine rows: its own, then the ones
    only those rows broke (the check that moved them judged them; this one no longer sees them)."""
    return [*failed, *(name for name in reasons if name not in failed)]


def take_back_rewritten(spark, cfg: DeltadrainConfig, pipeline: PipelineConfig, batch: int,
                        table: str | None) -> int:
    """Drop the quarantine copies of `batch`'s rows that the target (Delta id `table`) still holds
    rewritten (another `_dd_run_id`): a reprocess replay rewrote them between a check and its DELETE,
    which then left them (see quarantine), or after a crash there. Their new values were never
    checked: they stay in the target for the next check, and a row is in one table or the other.
    Another table's copies at the same place are that table's, and stay. Returns how many."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    target, qpath = str(cfg.target_path(pipeline)), str(quarantine_path(cfg, pipeline))
    if not is_table(spark, qpath):
        return 0
    id_field = pipeline.payload_schema.id_field
    of_batch = F.col("_dd_batch") == F.lit(batch)  # both tables: Delta's statistics skip other batches' files
    copies = of_table(spark.read.format("delta").load(qpath).where(of_batch), table)
    rows = spark.read.format("delta").load(target).where(of_batch)
    rewritten = quarantine_keys(id_field, "t") & ~F.col("t._dd_run_id").eqNullSafe(F.col("s._dd_run_id"))
    stale = (copies.alias("s").join(rows.alias("t"), rewritten, "left_semi")
             .select(f"`{id_field}`", "_dd_batch", "_dd_partition", "_dd_position", "_dd_run_id").localCheckpoint())
    count = stale.count()
    if count:
        log.warning("pipeline %s batch %d: %d row(s) were rewritten after they were checked (a reprocess replay): "
                    "they stay in the target and leave the quarantine", pipeline.name, batch, count)
        same = quarantine_keys(id_field, "q") & F.col("q._dd_run_id").eqNullSafe(F.col("s._dd_run_id"))
        retry_conflicts(lambda: DeltaTable.forPath(spark, qpath).alias("q").merge(stale.alias("s"), same)
                        .whenMatchedDelete().execute())
    return count


# -- entry points ----------------------------------------------------------------------------------------


def new_check_id() -> str:
    return f"dq-{datetime.now(UTC).strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}"


def batch_rows(cfg: DeltadrainConfig, pipeline: PipelineConfig, spark, batch: int):
    """(rows the batch's commit added, table version, drain run id, commit time or None when
    find_commit does not reach the commit file: older than the newest 200 commits, or removed by
    log cleanup); raises if the batch is not committed."""
    from pyspark.sql import functions as F

    target = str(cfg.target_path(pipeline))
    if not is_table(spark, target):
        raise QualityError(f"pipeline '{pipeline.name}': no target table at {target}; nothing to check")
    commit = find_commit(spark, target, pipeline.name, batch)
    if commit is not None:
        version, drain_run, at = commit["version"], (commit["meta"] or {}).get("run_id"), commit.get("timestamp")
    else:  # commit file gone (log cleanup) or never written: the txn says which
        committed, version = snapshot_txn(spark, target, pipeline.name)
        if committed is None or batch > committed or batch < 1:
            raise QualityError(f"pipeline '{pipeline.name}': batch {batch} is not committed "
                               f"(the table holds batches up to {committed or 0})")
        drain_run = at = None
    rows = spark.read.format("delta").load(target).where(F.col("_dd_batch") == F.lit(batch))
    return rows, version, drain_run, at


def batch_to_check(summary) -> int | None:
    """The batch a drain run's summary (RunSummary or its JSON dict) leaves to check, or None.

    `already_committed` counts: its batch was written by an earlier attempt whose check may never
    have run, and checking twice is harmless (see quarantine).
    """
    get = summary.get if isinstance(summary, dict) else lambda key: getattr(summary, key, None)
    if get("outcome") in ("committed", "already_committed") and get("batch"):
        return int(get("batch"))
    return None


def batches_to_check(summary: dict) -> list[int]:
    """The batches a drain task's summary leaves to check: all the batches of a catch-up
    (`deltadrain.catchup`), or the one of a single run."""
    if summary.get("batches") is not None:
        return [int(b) for b in summary["batches"]]
    batch = batch_to_check(summary)
    return [] if batch is None else [batch]


def owed_batches(checked: set[int], requested: list[int], committed: int | None,
                 limit: int = CATCH_UP, settling: frozenset[int] = frozenset(),
                 first_scheduled: int | None = None) -> tuple[list[int], int]:
    """The committed batches with no result yet, besides `requested` and the `settling` ones (committed
    too recently: their own ingest run checks them): (the oldest `limit`, how many more).

    A drain try that commits and then fails (its acknowledgement, the group offsets, a kill) hands
    no batch to its quality task, and a check that dies (a crash between quarantine's MERGE and
    DELETE) writes no result: the next check takes them on. Owed means from the pipeline's first
    check on; before it, with none yet, from the batches asked for or `first_scheduled` (the oldest
    batch the ingest DAG's drain committed), whichever is older: a pipeline drained for a while with the
    CLI is not made to check its whole history, and the first Airflow drain that committed and then
    failed does not leave its batch unchecked.
    """
    starts = checked or {*requested, *(() if first_scheduled is None else (first_scheduled,))}
    if committed is None or not starts:
        return [], 0
    floor = max(1, min(starts))
    owed = [b for b in range(floor, committed + 1) if b not in checked and b not in requested and b not in settling]
    return owed[:limit], max(0, len(owed) - limit)


def checked_batches(spark, cfg: DeltadrainConfig, pipeline: PipelineConfig, table: str | None = None) -> set[int]:
    """The batches of `pipeline` with a batch-scope row in the results table, of the target table
    whose Delta id is `table`: after the target was deleted and created again, its batch numbers
    start over, and the old table's results must not make its new batches look checked. Rows
    written before results named their table (null) count for any."""
    from pyspark.sql import functions as F

    path = str(results_path(cfg))
    if not is_table(spark, path):
        return set()
    results = spark.read.format("delta").load(path)
    rows = results.where((F.col("pipeline") == F.lit(pipeline.name)) & (F.col("scope") == F.lit("batch"))
                         & F.col("batch").isNotNull())
    if table is not None and "table_id" in results.columns:
        rows = rows.where(F.col("table_id").isNull() | (F.col("table_id") == F.lit(table)))
    return {int(r.batch) for r in rows.select("batch").distinct().collect()}


def catch_up(cfg: DeltadrainConfig, pipeline: PipelineConfig, spark, requested: list[int],
             settle: timedelta = timedelta(0)) -> tuple[list[int], int]:
    """owed_batches against the results table and the target's newest committed batch, leaving out
    the batches committed less than `settle` ago."""
    target = str(cfg.target_path(pipeline))
    if not is_table(spark, target):
        return [], 0
    committed = committed_batch(spark, target, pipeline.name)
    settling = frozenset()
    if settle > timedelta(0) and committed is not None:
        since = datetime.now(UTC) - settle
        settling = frozenset(c["meta"]["batch"] for c in recent_commits(spark, target, 200, since=since)
                             if carries_batch(c["meta"], pipeline.name))
    checked = checked_batches(spark, cfg, pipeline, table_id(spark, target))
    first = None if checked or committed is None else first_scheduled(spark, target, pipeline.name)
    return owed_batches(checked, requested, committed, settling=settling, first_scheduled=first)


def first_scheduled(spark, target: str, pipeline: str, scan: int = FIRST_SCHEDULED_SCAN) -> int | None:
    """The oldest batch among the target's last `scan` commits that a drain of the pipeline's ingest
    DAG committed (its run id says so): its DAG run's quality task was to check it. Read only while
    the pipeline has no check yet; a batch whose commit file log cleanup removed is not found."""
    return oldest_scheduled((c["meta"] for c in recent_commits(spark, target, scan)), pipeline)


def oldest_scheduled(metas, pipeline: str) -> int | None:
    """The oldest batch among commit metadata `metas` that a drain of the pipeline's ingest DAG
    committed, by its run id's prefix. Pure: first_scheduled (Spark) and the view (delta-rs) share it."""
    prefix = ingest_run_prefix(pipeline)
    return min((m["batch"] for m in metas
                if carries_batch(m, pipeline) and str(m.get("run_id") or "").startswith(prefix)), default=None)


def check_batches(cfg: DeltadrainConfig, pipeline: PipelineConfig, spark, batches: list[int],
                  run_id: str | None = None, owed: bool = False, settle: timedelta = timedelta(0)) -> dict:
    """check_batch for each batch, all of them even when one fails. One batch: its report. Several:
    one summary of them (success, failed expectations per batch, rows, quarantined, each report).
    With `owed`, first the committed batches that have no result yet (catch_up); the summary then
    says which (`caught_up`) and how many are left for the next check (`still_owed`); `settle`
    leaves out the ones committed less than that long ago (the daily DAG leaves an hour).
    Raises BatchesFailed (with that summary) when a batch failed under `on_failure: fail`, after all ran."""
    caught_up, left = catch_up(cfg, pipeline, spark, batches, settle) if owed else ([], 0)
    if caught_up or left:
        log.warning("pipeline %s: batches %s were committed without a quality result; checking them now%s",
                    pipeline.name, caught_up, f" ({left} more are left for the next check)" if left else "")
    batches = [*caught_up, *batches]
    reports, failure, unchecked = [], None, {}
    for batch in batches:
        try:
            reports.append(check_batch(cfg, pipeline, spark, batch, run_id=run_id))
        except QualityFailed as exc:
            reports.append(exc.report)
            failure = failure or exc
        except Exception as exc:
            if batch not in caught_up:
                raise
            # One owed batch that cannot be checked must not keep the task's own batches unchecked.
            log.exception("pipeline %s: owed batch %d could not be checked", pipeline.name, batch)
            unchecked[batch] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
    if unchecked:
        # After the others ran: the task fails (and is retried); the batches stay owed until checked.
        raise QualityError(f"pipeline '{pipeline.name}': owed batches could not be checked: "
                           + "; ".join(f"batch {b}: {e}" for b, e in unchecked.items())
                           + f" (batches {[r.batch for r in reports]} were checked; the next quality task tries "
                           f"them again, or check one by hand: deltadrain quality {pipeline.name} --batch N)")
    if len(reports) == 1:
        out = reports[0].as_dict()
    else:  # several, or none (`deltadrain quality --owed` with nothing owed)
        out = {"pipeline": pipeline.name, "scope": "batches", "batches": batches,
               "policy": pipeline.quality.on_failure, "success": all(r.success for r in reports),
               "failed": [f"batch {r.batch}: {name}" for r in reports for name in r.failed],
               "rows_checked": sum(r.rows_checked for r in reports),
               "quarantined": sum(r.quarantined for r in reports),
               "data_docs": reports[-1].data_docs if reports else str(docs_dir(pipeline) / "index.html"),
               "results_table": str(results_path(cfg)), "reports": [r.as_dict() for r in reports]}
    if owed:
        out.update(caught_up=caught_up, still_owed=left)
    if failure is not None:
        raise BatchesFailed(out, failure)
    return out


class BatchesFailed(DeltadrainError):
    """check_batches: a batch failed under `on_failure: fail`; `summary` holds every batch's outcome."""

    def __init__(self, summary: dict, first: QualityFailed):
        self.summary = summary
        super().__init__(str(first))


def check_batch(cfg: DeltadrainConfig, pipeline: PipelineConfig, spark, batch: int,
                run_id: str | None = None) -> QualityReport:
    """Validate the rows batch `batch` wrote; apply the pipeline's failure policy.

    Under `quarantine`, rows a reprocess replay rewrote during the check are left in the target
    (take_back_rewritten) and the batch is checked again at once: their new values are judged too.
    """
    run_id = run_id or new_check_id()
    moved = taken_back = 0
    adopted_runs, adopted_failed = [], []
    for again in range(RECHECKS + 1):
        report = _check_batch_once(cfg, pipeline, spark, batch, run_id if not again else f"{run_id}.{again}")
        moved, taken_back = moved + report.quarantined, taken_back + report.taken_back
        adopted_runs += report.adopted_runs
        adopted_failed = with_unreported(adopted_failed, report.adopted_failed)
        if not report.taken_back:
            break
        if again < RECHECKS:
            log.warning("pipeline %s batch %d: checking it again for the %d rewritten row(s)", pipeline.name,
                        batch, report.taken_back)
        else:
            log.warning("pipeline %s batch %d: rows were rewritten under each of %d checks; the %d left in the "
                        "target are judged by the next whole-table check", pipeline.name, batch, RECHECKS + 1,
                        report.taken_back)
    # The last round's results, and what all rounds moved or adopted (each round's results row has its own).
    report.quarantined, report.taken_back = moved, taken_back
    report.adopted_runs, report.adopted_failed = adopted_runs, adopted_failed
    report.failed = with_unreported(report.failed, adopted_failed)
    report.success = not report.failed
    return report


def _check_batch_once(cfg: DeltadrainConfig, pipeline: PipelineConfig, spark, batch: int,
                      run_id: str) -> QualityReport:
    from pyspark import StorageLevel

    rows, version, drain_run, committed_at = batch_rows(cfg, pipeline, spark, batch)
    rows = rows.persist(StorageLevel.MEMORY_AND_DISK)  # GX runs one Spark job per metric
    try:
        # A batch that added no rows (all duplicates or dead letters) has no newest event to judge.
        skip = ("fresh_within",) if rows.isEmpty() else ()
        landed = None
        if not skip and any(c.kind == "fresh_within" for c in build_checks(pipeline)):
            landed = committed_at or batch_finished_at(spark, cfg, pipeline, batch)
            if landed is None:
                log.warning("pipeline %s batch %d: when it landed is unknown (no commit file among the recent "
                            "ones, no metrics row): fresh_within is not judged", pipeline.name, batch)
                skip = ("fresh_within",)
        return _check(cfg, pipeline, spark, rows, "batch", batch, version, drain_run, run_id, skip, fresh_at=landed)
    finally:
        rows.unpersist()


def check_table(cfg: DeltadrainConfig, pipeline: PipelineConfig, spark, run_id: str | None = None) -> QualityReport:
    """Validate the whole target table (the daily DAG). Never quarantines: `quarantine` acts as `warn`."""
    from deltadrain.lake import table_version

    target = str(cfg.target_path(pipeline))
    if not is_table(spark, target):
        raise QualityError(f"pipeline '{pipeline.name}': no target table at {target}; nothing to check")
    version = table_version(spark, target)
    rows = spark.read.format("delta").option("versionAsOf", version).load(target)
    return _check(cfg, pipeline, spark, rows, "table", None, version, None, run_id)


def freshness_reference(fresh_at: datetime | None) -> datetime:
    """The "now" `fresh_within` is judged at, as a naive local time like the timestamps PySpark
    collects (see gx_expectation): when a batch landed (aware, or naive local as collected), so that
    a batch checked late (owed, a retry, after a reprocess) is judged as it was when it landed, not
    failed for the time its check waited; else now (the whole table)."""
    return fresh_at.astimezone().replace(tzinfo=None) if fresh_at is not None else datetime.now()


def _check(cfg, pipeline: PipelineConfig, spark, rows, scope: str, batch: int | None, version: int | None,
           drain_run: str | None, run_id: str | None, skip: tuple[str, ...] = (),
           fresh_at: datetime | None = None) -> QualityReport:
    checks = [c for c in build_checks(pipeline) if c.kind not in skip]
    run_id = run_id or new_check_id()
    table = table_id(spark, str(cfg.target_path(pipeline)))  # the table `rows` were read from, before GX runs
    now = freshness_reference(fresh_at)
    run_name = f"{scope}-{batch}-{run_id}" if batch is not None else f"{scope}-{run_id}"
    gx_result, index = run_gx(rows, pipeline, checks, run_name, now)
    results = summarize(checks, gx_result)
    failed = [r["expectation"] for r in results if not r["success"]]
    counted = [r["element_count"] for r in results if r.get("element_count") is not None]
    report = QualityReport(
        pipeline=pipeline.name, scope=scope, batch=batch, suite=suite_name(pipeline),
        policy=pipeline.quality.on_failure, success=not failed,
        rows_checked=counted[0] if counted else rows.count(), results=results, failed=failed,
        table_version=version, run_id=run_id, batch_run_id=drain_run, checked_at=datetime.now(UTC),
        data_docs=str(index), results_table=str(results_path(cfg)), table_id=table)
    policy = pipeline.quality.on_failure
    if policy == "quarantine" and scope == "batch":
        # First the stale copies a crashed check left of rows rewritten since: this round's MERGE
        # would match such a copy, insert nothing, and its DELETE then remove the rewritten row.
        take_back_rewritten(spark, cfg, pipeline, batch, table)
        # Before this round moves anything: its own rows would otherwise look like an earlier check's.
        earlier = unreported(spark, cfg, pipeline, batch, table)
        offending = offending_rows(rows, checks, results) if failed else None
        if offending is not None:
            moved = quarantine(spark, cfg, pipeline, batch, offending, run_id, table)
            report.taken_back = take_back_rewritten(spark, cfg, pipeline, batch, table)
            report.quarantined = max(0, moved - report.taken_back)
        if earlier.runs:
            log.warning("pipeline %s batch %d: check(s) %s moved rows to the quarantine and died before writing "
                        "their result; this check reports them (%d row(s) no longer in the target%s)", pipeline.name,
                        batch, ", ".join(earlier.runs), earlier.rows,
                        f": {'; '.join(earlier.reasons)}" if earlier.reasons else "")
            report.adopted_runs, report.adopted_failed = earlier.runs, earlier.reasons
            report.quarantined += earlier.rows
            report.failed = failed = with_unreported(failed, earlier.reasons)
            report.success = not failed
    write_result(spark, cfg, report)
    where = f"batch {batch}" if scope == "batch" else "table"
    if not failed:
        log.info("pipeline %s %s: data quality passed (%d rows); Data Docs %s", pipeline.name, where,
                 report.rows_checked, index)
        return report
    if policy == "fail":
        raise QualityFailed(report)
    log.warning("pipeline %s %s: data quality failed: %s; %d row(s) quarantined; Data Docs %s", pipeline.name,
                where, "; ".join(failed), report.quarantined, index)
    return report


def last_results(spark, cfg: DeltadrainConfig, pipeline: PipelineConfig, n: int = 10) -> list[dict]:
    from pyspark.sql import functions as F

    path = str(results_path(cfg))
    if not is_table(spark, path):
        return []
    df = spark.read.format("delta").load(path).where(F.col("pipeline") == F.lit(pipeline.name))
    return [r.asDict() for r in df.orderBy(F.col("checked_at").desc()).limit(n).collect()]
