"""Data quality: a Great Expectations suite per pipeline, run on one batch's rows or on the whole table.

Modules, lowest first (each imports only modules above it; nothing is re-exported here):
- checks: the suite in deltadrain's terms (pure): Check, build_checks, each check's GX expectation
  and, for a row-level check, the Spark condition of the rows that break it.
- results: the results table `<lake>/_deltadrain/quality/results` (one row per check), QualityReport.
- errors: QualityError (a check that cannot run), QualityFailed, BatchesFailed (`on_failure: fail`).
- gx: Great Expectations itself: the ephemeral context, run_gx, summarize, the Data Docs.
- quarantine: moving a batch's offending rows to `<lake>/_deltadrain/quarantine/<pipeline>` without
  losing any, and finding the rows a check that died moved (unreported).
- owed: which batches a drain task leaves to check, and which committed batches have no result yet.
- check: check_batch, check_batches, check_table: run the suite and apply the pipeline's failure policy.
"""

__all__ = ["check", "checks", "errors", "gx", "owed", "quarantine", "results"]
