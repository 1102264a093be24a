"""Healing a pipeline from the Airflow UI or the CLI: `backfill` re-reads an interval the source still
retains and MERGEs it (acknowledging nothing); `replay` sends dead letters back, or re-runs published
messages through the current transform.
"""

__all__ = ["backfill", "replay"]
