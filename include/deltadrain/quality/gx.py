"""Great Expectations: validate rows with a pipeline's suite, and render its Data Docs.

GX 1.x is called directly with an ephemeral context (nothing written but the Data Docs) and its
Spark dataframe datasource. Analytics are off: nothing outside the machine is contacted. Data Docs
are rendered under `$DELTADRAIN_HOME/quality/data_docs/<pipeline>/index.html`.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

from deltadrain.config import PipelineConfig
from deltadrain.paths import state_home
from deltadrain.quality.checks import Check, gx_expectation, suite_name
from deltadrain.quality.errors import QualityError

DOCS_KEEP = 200  # validation pages kept per pipeline; the results table keeps the whole history


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
    # One GX left out counts as failed rather than silently passed.
    return [item if item is not None else
            {"expectation": check.name, "kind": check.kind, "column": check.column, "success": False,
             "error": "no result from Great Expectations"} for check, item in zip(checks, out, strict=True)]


def docs_dir(pipeline: PipelineConfig) -> Path:
    return state_home() / "quality" / "data_docs" / pipeline.name


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
