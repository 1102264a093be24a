"""The pure parts of quality and metrics: suites from config, GX expectations, metric rows, the chart."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from deltadrain.config import parse_config
from deltadrain.errors import ConfigError
from deltadrain.lake.metrics import chart_html, metrics_row, panel_svg
from deltadrain.quality.check import freshness_reference
from deltadrain.quality.checks import Check, build_checks, gx_expectation, suite_name
from deltadrain.quality.owed import batch_to_check, owed_batches
from deltadrain.quality.quarantine import reasons_of, with_unreported
from deltadrain.run.summary import RunSummary

ROOT = Path(__file__).resolve().parents[2]


def orders(quality: dict | None = None):
    data = yaml.safe_load((ROOT / "config" / "pipelines.yaml").read_text())
    pipe = next(p for p in data["pipelines"] if p["name"] == "orders")
    if quality is None:
        pipe.pop("quality", None)
    else:
        pipe["quality"] = quality
    return parse_config(data, Path("pipes.yaml")).pipeline("orders")


def test_default_suite_checks_the_id_and_the_required_columns():
    p = orders()
    checks = build_checks(p)
    assert checks[:2] == [Check("not_null", "event_id"), Check("unique", "event_id")]
    names = [c.name for c in checks]
    for column, kind in (("event_id", "string"), ("customer", "string"), ("amount", "double"),
                         ("event_time", "timestamp")):
        assert f"{column} exists" in names and f"{column} is {kind}" in names
    assert {"customer not null", "amount not null", "event_time not null"} <= set(names)
    assert "event_id not null" in names and names.count("event_id not null") == 1
    assert not any(c.column in ("quantity", "status") for c in checks)  # optional columns are not required
    assert suite_name(p) == "deltadrain_orders"


def test_declared_expectations_replace_the_default_suite():
    p = orders({"on_failure": "quarantine", "expectations": [
        {"column": "amount", "kind": "between", "min": 0, "max": 10},
        {"column": "status", "kind": "in_set", "values": ["new", "paid"]},
        {"column": "quantity", "kind": "type", "type": "LONG"},
        {"column": "event_time", "kind": "fresh_within", "within": "PT2H"}]})
    checks = build_checks(p)
    assert [c.name for c in checks] == ["amount between 0.0 and 10.0", "status in ['new', 'paid']",
                                        "quantity is long", "event_time newest within 2:00:00"]
    assert [c.row_level for c in checks] == [True, True, False, False]


@pytest.mark.parametrize("expectation,error", [
    ({"column": "amount", "kind": "between"}, "between needs min and/or max"),
    ({"column": "amount", "kind": "between", "min": 5, "max": 1}, "min > max"),
    ({"column": "status", "kind": "in_set"}, "in_set needs values"),
    ({"column": "status", "kind": "type", "type": "varchar"}, "type needs type"),
    ({"column": "event_time", "kind": "fresh_within"}, "fresh_within needs a positive duration"),
    ({"column": "event_time", "kind": "fresh_within", "within": "PT0S"}, "fresh_within needs a positive duration"),
])
def test_bad_expectations_fail_at_config_load_naming_pipeline_and_column(expectation, error):
    with pytest.raises(ConfigError) as info:
        orders({"expectations": [expectation]})
    assert "pipeline 'orders'" in str(info.value) and error in str(info.value)
    assert f"'{expectation['column']}'" in str(info.value)


def test_checks_become_the_matching_gx_expectations():
    now = datetime(2026, 6, 1, 12, 0)
    cases = [
        (Check("not_null", "a"), "expect_column_values_to_not_be_null", {}),
        (Check("unique", "a"), "expect_column_values_to_be_unique", {}),
        (Check("between", "a", min=1, max=2), "expect_column_values_to_be_between", {"min_value": 1, "max_value": 2}),
        (Check("in_set", "a", values=("x", "y")), "expect_column_values_to_be_in_set", {"value_set": ["x", "y"]}),
        (Check("type", "a", type="long"), "expect_column_values_to_be_of_type", {"type_": "LongType"}),
        (Check("type", "a", type="decimal(18,2)"), "expect_column_values_to_be_of_type", {"type_": "DecimalType"}),
        (Check("exists", "a"), "expect_column_to_exist", {}),
        (Check("fresh_within", "a", within=timedelta(hours=1)), "expect_column_max_to_be_between",
         {"min_value": datetime(2026, 6, 1, 11, 0)}),
    ]
    for i, (check, kind, kwargs) in enumerate(cases):
        expectation = gx_expectation(check, i, now)
        config = expectation.configuration
        assert config.type == kind and config.kwargs["column"] == "a" and config.meta == {"deltadrain": i}
        for key, value in kwargs.items():
            assert config.kwargs[key] == value


def summary(**kw) -> RunSummary:
    base = {"pipeline": "orders", "run_id": "r1", "batch": 4, "outcome": "committed", "claimed": 110,
            "written": 100, "duplicates_skipped": 5, "dead_lettered": 5, "acked": 110, "seconds": 2.0,
            "timings": {"commit": 1.5, "claim": 0.5}}
    return RunSummary(**{**base, **kw})


def test_metrics_row_counts_every_handled_row_per_second():
    at = datetime(2026, 6, 1, tzinfo=UTC)
    row = metrics_row(summary(), 7, at)
    assert row[:9] == ("orders", "r1", 4, "committed", 110, 0, 100, 5, 5)
    assert row[13:17] == (2.0, 55.0, 7, '{"claim": 0.5, "commit": 1.5}') and row[-2:] == (at, 0)
    assert metrics_row(summary(seconds=0.0), None, at)[14] is None  # no rate out of a zero-second run
    # Messages the transform filtered out were handled too.
    filtering = metrics_row(summary(claimed=130, filtered=20), None, at)
    assert filtering[14] == 65.0 and filtering[-1] == 20


def test_chart_draws_throughput_and_backlog_and_copes_with_no_runs():
    t0 = datetime(2026, 6, 1, 12, 0)
    runs = [{"finished_at": t0 + timedelta(minutes=i), "batch": i, "outcome": "committed", "claimed": 10,
             "written": 10, "dead": 0, "seconds": 1.0, "rows_per_s": 10.0 * (i + 1), "backlog": 100 - 10 * i}
            for i in range(5)]
    page = chart_html("orders", list(reversed(runs)))
    assert page.count("<svg") == 2 and page.count("<polyline") == 2 and page.count("<circle") == 10
    assert "5 run(s)" in page and "2026-06-01 12:00:00" in page and "2026-06-01 12:04:00" in page
    assert "50 rows/s" in panel_svg("t", [(r["finished_at"], r["rows_per_s"]) for r in runs], "#000", "rows/s")
    assert "no data" in chart_html("orders", []) and "<polyline" not in chart_html("orders", [])
    assert "&lt;b&gt;" in chart_html("<b>", [])  # names are escaped


def test_only_a_committed_batch_is_left_to_check():
    assert batch_to_check(summary(outcome="committed", batch=4)) == 4
    assert batch_to_check({"outcome": "already_committed", "batch": 3}) == 3
    for outcome in ("empty", "ahead", "mismatch", "error"):
        assert batch_to_check({"outcome": outcome, "batch": 3}) is None
    assert batch_to_check({"outcome": "committed", "batch": None}) is None


def test_owed_batches_are_the_committed_ones_without_a_result_since_the_first_check():
    # Batch 5 was committed by a drain try that then failed: the check of batch 6 takes it on.
    assert owed_batches({1, 2, 3, 4}, [6], committed=6) == ([5], 0)
    # Nothing owed when every committed batch has a result, or nothing is committed.
    assert owed_batches({1, 2, 3}, [4], committed=4) == ([], 0)
    assert owed_batches({1}, [2], committed=None) == ([], 0)
    # Before the pipeline's first check, only the batches asked for count: no history is owed.
    assert owed_batches(set(), [40], committed=40) == ([], 0)
    assert owed_batches(set(), [40], committed=41) == ([41], 0)  # committed since the drain's summary
    # ... and from the oldest batch an Airflow drain committed: its try failed before its check ran.
    assert owed_batches(set(), [2], committed=2, first_scheduled=1) == ([1], 0)
    assert owed_batches(set(), [], committed=3, first_scheduled=2) == ([2, 3], 0)  # the daily owed task
    assert owed_batches(set(), [40], committed=40, first_scheduled=40) == ([], 0)
    assert owed_batches({5}, [7], committed=7, first_scheduled=1) == ([6], 0)  # once checked, checks rule
    # A batch asked for again (already_committed) is not counted twice.
    assert owed_batches({7}, [7, 8], committed=9) == ([9], 0)
    # The oldest first, at most `limit`; the rest are counted for the next check.
    owed, left = owed_batches({1}, [100], committed=100, limit=20)
    assert owed == list(range(2, 22)) and left == 78
    # The daily owed check: batches committed within its settle time are their ingest run's, not owed yet.
    assert owed_batches({1, 2}, [], committed=6, settling=frozenset({5, 6})) == ([3, 4], 0)
    assert owed_batches({1}, [], committed=3, settling=frozenset({2, 3})) == ([], 0)


def test_gx_errors_are_found_flat_or_per_metric():
    from deltadrain.quality.gx import gx_error

    assert gx_error({"raised_exception": True, "exception_message": "boom"}) == "boom"
    per_metric = {("column_values.nonnull.unexpected_count", "abc", ()): {
        "raised_exception": True, "exception_message": 'The column "x" does not exist.'}}
    assert gx_error(per_metric) == 'The column "x" does not exist.'
    assert gx_error({"raised_exception": False, "exception_message": None}) is None
    assert gx_error({}) is None and gx_error(None) is None


def test_an_owed_batch_that_cannot_be_checked_keeps_no_other_batch_unchecked(monkeypatch, cfg):
    """Pure control flow of check_batches: the check itself is faked (each batch's outcome is given)."""
    from deltadrain.quality import check
    from deltadrain.quality.check import check_batches
    from deltadrain.quality.errors import QualityError
    from deltadrain.quality.results import QualityReport

    pipeline, seen = cfg.pipelines[0], []

    def fake_check(cfg, pipeline, spark, batch, run_id=None):
        seen.append(batch)
        if batch == 2:
            raise QualityError("Great Expectations could not validate: boom")
        return QualityReport(pipeline.name, "batch", batch, "s", "fail", True, 10)

    monkeypatch.setattr(check, "catch_up", lambda cfg, pipeline, spark, requested, settle: ([2, 3], 0))
    monkeypatch.setattr(check, "check_batch", fake_check)
    with pytest.raises(QualityError, match=r"owed batches could not be checked: batch 2: QualityError: Great "
                                           r"Expectations could not validate: boom \(batches \[3, 5\] were checked"):
        check_batches(cfg, pipeline, None, [5], owed=True)
    assert seen == [2, 3, 5]
    # The task's own batch failing to run is the task's error, as before.
    monkeypatch.setattr(check, "catch_up", lambda cfg, pipeline, spark, requested, settle: ([], 0))
    with pytest.raises(QualityError, match="boom"):
        check_batches(cfg, pipeline, None, [2], owed=True)


def test_unreported_quarantine_rows_name_each_check_they_broke_once_after_the_checks_own_failures():
    reasons = reasons_of(["amount between 0 and 250", "amount between 0 and 250; status in set", "", "id not null"])
    assert reasons == ["amount between 0 and 250", "id not null", "status in set"]
    assert with_unreported([], reasons) == reasons  # the check itself saw a clean batch
    assert with_unreported(["status in set", "event_time fresh"], reasons) == [
        "status in set", "event_time fresh", "amount between 0 and 250", "id not null"]
    assert with_unreported(["type of amount"], []) == ["type of amount"]


def test_freshness_is_judged_at_the_batchs_commit_as_pyspark_hands_times_over(monkeypatch):
    """GX compares the column's max as PySpark collects it: naive, in the process's local zone
    (whatever the session time zone). The reference must be the same instant in that form."""
    import time

    from pyspark.sql.types import TimestampType

    committed = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    micros = int(committed.timestamp() * 1_000_000)
    try:
        for zone in ("America/New_York", "Asia/Kolkata", "UTC"):
            monkeypatch.setenv("TZ", zone)
            time.tzset()
            collected = TimestampType().fromInternal(micros)  # how the batch's max event time reaches GX
            assert freshness_reference(committed) == collected, zone
            assert freshness_reference(collected) == collected, zone  # a metrics row's time, as collected
    finally:
        monkeypatch.undo()
        time.tzset()
    now = freshness_reference(None)  # the whole table: judged now
    assert now.tzinfo is None and abs(now - datetime.now()) < timedelta(minutes=1)
