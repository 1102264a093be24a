"""The errors of a data-quality check."""

from __future__ import annotations

from typing import TYPE_CHECKING

from deltadrain.errors import DeltadrainError

if TYPE_CHECKING:
    from deltadrain.quality.results import QualityReport


class QualityError(DeltadrainError):
    """A check that cannot run (no table, batch not committed, GX failure)."""


class QualityFailed(DeltadrainError):
    """The data failed its suite and the pipeline's policy is `fail`."""

    def __init__(self, report: QualityReport):
        self.report = report
        where = f"batch {report.batch}" if report.scope == "batch" else "the whole table"
        super().__init__(f"pipeline '{report.pipeline}': {where} failed data quality: "
                         f"{'; '.join(report.failed)} (results in {report.results_table}, Data Docs {report.data_docs})")


class BatchesFailed(DeltadrainError):
    """check_batches: a batch failed under `on_failure: fail`; `summary` holds every batch's outcome."""

    def __init__(self, summary: dict, first: QualityFailed):
        self.summary = summary
        super().__init__(str(first))
