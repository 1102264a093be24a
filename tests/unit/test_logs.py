"""Structured run logs: pipeline, batch and run id on every line; secrets never in them."""

from __future__ import annotations

import logging

from deltadrain.logs import fields, run_logger
from deltadrain.sources.valkey.claim import ClaimContext


def test_fields_are_key_value_pairs_without_empty_ones():
    assert fields(step="claim", seconds=1.5, error=None) == "step=claim seconds=1.5"
    assert fields(error="boom it broke") == "error='boom it broke'"


def test_run_lines_carry_pipeline_batch_and_run_id(caplog):
    with caplog.at_level(logging.INFO, logger="deltadrain"):
        run_logger("orders", "run-1", 7, source="valkey").info("%s", fields(step="commit", seconds=2.0))
    assert caplog.messages == ["pipeline=orders batch=7 run_id=run-1 source=valkey step=commit seconds=2.0"]


def test_the_claim_context_never_shows_its_password():
    ctx = ClaimContext(url="valkey://h:1/0", username="u", password="s3cr3t-pw", group="g", consumer="c",
                       min_idle_ms=1, max_attempts=4, fields={}, id_field="id", required=[], max_bytes=64,
                       failures_key="k")
    assert "s3cr3t-pw" not in repr(ctx) and "s3cr3t-pw" not in str(ctx)
