"""Catch-up decisions (deltadrain.catchup): when a drain task goes on with another batch, what it reports,
and which batches its quality task checks. Pure."""

from __future__ import annotations

from datetime import timedelta

import pytest

from deltadrain.catchup import CatchUp, batch_run_id, next_batch
from deltadrain.config import AirflowSettings
from deltadrain.quality.owed import batches_to_check
from deltadrain.run.summary import RunSummary


def run(batch: int, outcome: str = "committed", claimed: int = 100, **more) -> RunSummary:
    return RunSummary("orders", f"r{batch}", batch=batch, outcome=outcome, claimed=claimed, written=claimed,
                      acked=claimed, seconds=2.0, **more)


def test_a_full_committed_batch_is_followed_by_another_until_a_limit():
    assert next_batch(run(1), 100, done=1, elapsed_s=5, max_batches=10, max_seconds=600) is None
    assert next_batch(run(2, "already_committed"), 100, 2, 5, 10, 600) is None
    assert "not full" in next_batch(run(1, claimed=99), 100, 1, 5, 10, 600)
    # A batch narrowed after dead runs (deltadrain.sources.valkey.crashes, kafka.crashes) is short on purpose.
    narrowed = run(1, claimed=8, dead_runs=[{"partition": "s", "ids": ["1-0", "9-0"], "entries": 16}])
    assert next_batch(narrowed, 100, 1, 5, 10, 600) is None
    assert "max_batches_per_run (3)" in next_batch(run(3), 100, 3, 5, 3, 600)
    assert "max_drain_time (600 s)" in next_batch(run(3), 100, 3, 600, 10, 600)
    for outcome in ("empty", "ahead", "mismatch"):
        assert outcome in next_batch(run(1, outcome), 100, 1, 5, 10, 600)
    assert "with an error" in next_batch(run(1, error="group offsets were not committed"), 100, 1, 5, 10, 600)


def test_later_batches_get_their_own_run_ids():
    assert [batch_run_id("manual__x-try1", i) for i in range(3)] == ["manual__x-try1", "manual__x-try1-2",
                                                                       "manual__x-try1-3"]


def test_a_catch_up_reports_the_last_commit_with_the_counts_summed():
    runs = [run(4), run(5, filtered=3), run(6, claimed=30, filtered=2), run(6, "empty", claimed=0)]
    out = CatchUp(runs, "the last batch was not full: the backlog is drained", batches=[4, 5, 6]).as_dict()
    assert (out["batch"], out["outcome"], out["run_id"]) == (6, "committed", "r6")
    assert (out["claimed"], out["written"], out["acked"], out["seconds"]) == (230, 230, 230, 8.0)
    assert out["filtered"] == 5 and out["batches"] == [4, 5, 6] and [r["batch"] for r in out["runs"]] == [4, 5, 6, 6]
    assert out["later_error"] is None and "drained" in out["stopped"]
    # One batch: its summary as it was, plus what the catch-up adds.
    single = CatchUp([run(7)], "not full", batches=[7]).as_dict()
    assert single["claimed"] == 100 and "runs" not in single and single["batches"] == [7]


def test_the_quality_task_checks_every_batch_of_a_catch_up():
    assert batches_to_check({"outcome": "committed", "batch": 6, "batches": [4, 5, 6]}) == [4, 5, 6]
    assert batches_to_check({"outcome": "empty", "batch": 3, "batches": []}) == []
    # A single run's summary (the CLI's, or a job before catch-up existed).
    assert batches_to_check({"outcome": "committed", "batch": 4}) == [4]
    assert batches_to_check({"outcome": "ahead", "batch": 4}) == []


def test_max_drain_time_must_leave_the_last_batch_time_to_finish():
    assert AirflowSettings().max_batches_per_run == 10
    with pytest.raises(ValueError, match="max_drain_time .* must be shorter than execution_timeout"):
        AirflowSettings(max_drain_time=timedelta(minutes=30), execution_timeout=timedelta(minutes=30))
    with pytest.raises(ValueError):
        AirflowSettings(max_batches_per_run=0)


def test_a_failpoint_with_a_skip_count_passes_that_often_before_it_fires(monkeypatch):
    """What the catch-up kill tests rely on: DELTADRAIN_FAILPOINT_SKIP=1 lets the first batch through."""
    from deltadrain import failpoints

    monkeypatch.setattr(failpoints, "_passed", {})
    monkeypatch.setenv(failpoints.ENV, "after_merge")
    monkeypatch.setenv(failpoints.SKIP_ENV, "1")
    failpoints.fail("after_claim")  # not armed: neither fires nor counts
    failpoints.fail("after_merge")  # the first batch passes
    with pytest.raises(failpoints.InjectedFailure):
        failpoints.fail("after_merge")
    with pytest.raises(failpoints.InjectedFailure):
        failpoints.fail("after_merge")  # and it keeps firing, as an unskipped point does
    assert failpoints._passed == {"after_merge": 3}


def test_a_pause_ends_when_its_release_file_appears_and_otherwise_lasts_its_time(monkeypatch, tmp_path):
    """The race tests hold one run with a long pause and release it once its neighbour is done."""
    import threading
    import time

    from deltadrain import failpoints

    release = tmp_path / "go"
    monkeypatch.setenv("DELTADRAIN_PAUSE_BEFORE_COMMIT_MS", "30000")
    monkeypatch.setenv("DELTADRAIN_PAUSE_BEFORE_COMMIT_UNTIL", str(release))
    threading.Timer(0.3, release.touch).start()
    started = time.monotonic()
    failpoints.pause("before_commit")
    assert 0.3 <= time.monotonic() - started < 10  # released, not the 30 s
    monkeypatch.setenv("DELTADRAIN_PAUSE_BEFORE_COMMIT_UNTIL", str(tmp_path / "never"))
    monkeypatch.setenv("DELTADRAIN_PAUSE_BEFORE_COMMIT_MS", "400")
    started = time.monotonic()
    failpoints.pause("before_commit")
    assert time.monotonic() - started >= 0.4  # no release: the pause's own length
    started = time.monotonic()
    failpoints.pause("after_commit")  # not set: no pause
    assert time.monotonic() - started < 0.1
