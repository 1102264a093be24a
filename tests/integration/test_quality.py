"""Data quality and run metrics against real Valkey, Spark, Delta and Great Expectations.

Each test drains a pipeline of its own, runs the checks, and judges them by reading the Delta
tables (target, quarantine, results, metrics) and the Data Docs back.
"""

from __future__ import annotations

import json
import logging
import shutil
from datetime import UTC, datetime, timedelta

import pytest

from deltadrain import cli
from deltadrain.catchup import drain
from deltadrain.dev.produce import generate, produce
from deltadrain.failpoints import InjectedFailure
from deltadrain.lake.checkpoint import find_commit, read_checkpoint
from deltadrain.lake.delta import table_id
from deltadrain.lake.metrics import last_runs, metrics_path, render_chart
from deltadrain.names import ingest_run_prefix
from deltadrain.observe import tables as lakeview
from deltadrain.quality.check import check_batch, check_table
from deltadrain.quality.errors import QualityFailed
from deltadrain.quality.owed import catch_up, checked_batches
from deltadrain.quality.quarantine import quarantine_path
from deltadrain.quality.results import RESULTS_SCHEMA, QualityReport, last_results, results_path, write_result
from deltadrain.run.drain import DrainError
from deltadrain.sources.valkey.client import valkey_client
from tests.support.lake import target_ids
from tests.support.valkey import make_pipeline, pending, valkey_admin

pytestmark = pytest.mark.usefixtures("valkey_server")

LIMIT = 250.0  # the sample amounts are uniform in 1..500: about half the rows break "amount <= 250"


def quality(policy: str, *extra: dict) -> dict:
    return {"on_failure": policy,
            "expectations": [{"column": "amount", "kind": "between", "min": 0, "max": LIMIT},
                             {"column": "status", "kind": "in_set", "values": ["new", "paid", "shipped", "cancelled"]},
                             *extra]}


def drained(tmp_path, spark, count: int, **overrides):
    path, c, p = make_pipeline(tmp_path, partitions=2, **overrides)
    client = valkey_client(c, p)
    result = produce(c, p, count, seed=7)
    summary = drain(c, p, spark=spark)
    assert summary.outcome == "committed" and summary.written == count
    return path, c, p, client, result


def table(spark, path):
    return spark.read.format("delta").load(str(path))


def over_limit(spark, c, p, batch: int) -> set[str]:
    rows = table(spark, c.target_path(p)).where(f"_dd_batch = {batch} AND amount > {LIMIT}")
    return {r.event_id for r in rows.select("event_id").collect()}


def docs_mention_suite(report) -> bool:
    return report.data_docs.endswith("index.html") and report.suite in open(report.data_docs).read()


def test_failing_expectation_fails_the_check_after_writing_results_and_docs(tmp_path, cfg, spark):
    _, c, p, _, _ = drained(tmp_path, spark, 200, quality=quality("fail"))
    bad = over_limit(spark, c, p, 1)
    assert 0 < len(bad) < 200
    with pytest.raises(QualityFailed) as info:
        check_batch(c, p, spark, 1)
    message = str(info.value)
    assert f"pipeline '{p.name}'" in message and "batch 1" in message and f"amount between 0.0 and {LIMIT}" in message
    assert "status in" not in message  # the passing expectation is not blamed
    report = info.value.report
    assert not report.success and report.rows_checked == 200 and report.quarantined == 0
    assert docs_mention_suite(report)
    [row] = table(spark, results_path(c)).where(f"pipeline = '{p.name}'").collect()
    assert (row.scope, row.batch, row.success, row.policy, row.rows_checked) == ("batch", 1, False, "fail", 200)
    assert row.unexpected_count == len(bad) and row.data_docs == report.data_docs
    per = {r["kind"]: r for r in json.loads(row.results)}
    assert per["between"]["unexpected_count"] == len(bad) and per["in_set"]["success"]
    assert row.batch_run_id and row.table_version is not None
    # Nothing moved: the target still holds every row.
    assert len(target_ids(spark, c, p)) == 200


def test_failing_expectation_warns_and_keeps_the_rows(tmp_path, cfg, spark, caplog):
    _, c, p, _, _ = drained(tmp_path, spark, 120, quality=quality(
        "warn", {"column": "event_time", "kind": "fresh_within", "within": "P1D"}))
    with caplog.at_level(logging.WARNING, logger="deltadrain.quality.check"):
        report = check_batch(c, p, spark, 1)
    assert not report.success
    # Sample events are dated in early 2026 + seed days: not within a day of now.
    assert report.failed == [f"amount between 0.0 and {LIMIT}", "event_time newest within 1 day, 0:00:00"]
    assert any("data quality failed" in r.getMessage() and p.name in r.getMessage() for r in caplog.records)
    assert len(target_ids(spark, c, p)) == 120 and docs_mention_suite(report)
    [result] = last_results(spark, c, p)
    assert result["success"] is False and json.loads(result["failed"]) == report.failed
    # A whole-table check reports on every row.
    whole = check_table(c, p, spark)
    assert whole.scope == "table" and whole.batch is None and whole.rows_checked == 120 and not whole.success
    # A batch that added no rows (only a repeated id) has no newest event: freshness is not judged.
    client = valkey_client(c, p)
    client.xadd(p.source.streams[0], {b"data": next(generate(p, 1, seed=7)).value})
    repeat = drain(c, p, spark=spark)
    assert (repeat.batch, repeat.written, repeat.duplicates_skipped) == (2, 0, 1)
    empty = check_batch(c, p, spark, 2)
    assert empty.success and empty.rows_checked == 0
    assert "fresh_within" not in {r["kind"] for r in empty.results}


@pytest.mark.slow
def test_quarantine_moves_offending_rows_loses_nothing_and_the_drain_continues(tmp_path, cfg, spark, monkeypatch):
    _, c, p, client, result = drained(tmp_path, spark, 300, quality=quality("quarantine"))
    target, dlq = str(c.target_path(p)), str(c.dlq_path(p))
    # Batch 2 lands before batch 1 is checked (a late check): the DELETE then sits on top of batch 2.
    more = produce(c, p, 100, seed=7, start=300)
    assert drain(c, p, spark=spark).batch == 2
    before = read_checkpoint(spark, target, p.name, dlq)
    bad = over_limit(spark, c, p, 1)
    # A crash between the quarantine MERGE and the target DELETE leaves the rows in both tables...
    monkeypatch.setenv("DELTADRAIN_FAILPOINT", "before_quarantine_delete")
    with pytest.raises(InjectedFailure):
        check_batch(c, p, spark, 1)
    monkeypatch.delenv("DELTADRAIN_FAILPOINT")
    assert {r.event_id for r in table(spark, quarantine_path(c, p)).collect()} == bad
    assert len(target_ids(spark, c, p)) == 400
    # ... and the next check finishes the move without copying anything twice.
    report = check_batch(c, p, spark, 1)
    assert not report.success and report.quarantined == len(bad)
    kept, moved = set(target_ids(spark, c, p)), table(spark, quarantine_path(c, p)).collect()
    assert len(moved) == len(bad) and {r.event_id for r in moved} == bad
    assert kept.isdisjoint(bad) and kept | bad == set(result.valid_ids) | set(more.valid_ids)
    assert all(r._dq_reason == f"amount between 0.0 and {LIMIT}" and r._dd_batch == 1 for r in moved)
    assert all(r.amount > LIMIT for r in moved)
    # Checking again is idempotent: nothing left to move, the tables stay as they are.
    again = check_batch(c, p, spark, 1)
    assert again.success and again.quarantined == 0
    assert set(target_ids(spark, c, p)) == kept and table(spark, quarantine_path(c, p)).count() == len(bad)
    # The DELETE commits did not disturb the checkpoint: still batch 2 with its positions.
    after = read_checkpoint(spark, target, p.name, dlq)
    assert (after.batch, after.positions, after.run_id) == (2, before.positions, before.run_id)
    assert after.table_version > before.table_version
    # The next drain is batch 3 and continues the streams where batch 2 stopped.
    last = produce(c, p, 100, seed=7, start=400)
    third = drain(c, p, spark=spark)
    assert (third.outcome, third.batch, third.written, third.acked) == ("committed", 3, 100, 100)
    assert pending(client, p) == 0
    cp = read_checkpoint(spark, target, p.name, dlq)
    assert cp.batch == 3
    for stream, pos in cp.positions.items():
        assert client.xrevrange(stream, count=1)[0][0].decode() == pos
    bad3 = over_limit(spark, c, p, 3)
    assert check_batch(c, p, spark, 3).quarantined == len(bad3)
    quarantined = {r.event_id for r in table(spark, quarantine_path(c, p)).collect()}
    assert set(target_ids(spark, c, p)) | quarantined == {*result.valid_ids, *more.valid_ids, *last.valid_ids}
    assert table(spark, quarantine_path(c, p)).count() + len(target_ids(spark, c, p)) == 500
    assert drain(c, p, spark=spark).batch == 3  # an empty run after all this still reads batch 3
    outcomes = [(r["batch"], r["success"], r["quarantined"]) for r in last_results(spark, c, p)]
    assert outcomes == [(3, False, len(bad3)), (1, True, 0), (1, False, len(bad))]


def test_a_batch_checked_late_is_judged_fresh_as_of_its_commit_not_of_its_check(tmp_path, cfg, spark, monkeypatch):
    """An owed batch checked a day on (the daily DAG), or a retried check, must not fail `fresh_within`
    for the time it waited: freshness is judged at the batch's commit."""
    import os
    import random
    from datetime import UTC, datetime, timedelta

    from deltadrain.dev.produce import _valid_payload
    from deltadrain.lake.checkpoint import find_commit

    _, c, p = make_pipeline(tmp_path, partitions=1, quality={"on_failure": "warn", "expectations": [
        {"column": "event_time", "kind": "fresh_within", "within": "PT1H"}]})
    client, target, rng = valkey_client(c, p), str(c.target_path(p)), random.Random(3)
    landed = datetime.now(UTC).replace(microsecond=0) - timedelta(days=2)

    def send(n: int, start: int) -> None:
        for i in range(start, start + n):
            payload = _valid_payload(rng, f"late-{i}", landed - timedelta(minutes=i))
            client.xadd(p.source.streams[0], {b"data": json.dumps(payload).encode()})

    send(5, 0)
    assert drain(c, p, spark=spark).batch == 1
    # Batch 1 landed two days ago, ten minutes after its newest event: its commit file says so.
    commit = find_commit(target, p.name, 1)
    log_file = c.target_path(p) / "_delta_log" / f"{commit['version']:020d}.json"
    lines = [json.loads(line) for line in log_file.read_text().splitlines() if line.strip()]
    for action in lines:
        if "commitInfo" in action:
            action["commitInfo"].pop("inCommitTimestamp", None)
            action["commitInfo"]["timestamp"] = int((landed + timedelta(minutes=10)).timestamp() * 1000)
    log_file.write_text("".join(json.dumps(a) + "\n" for a in lines))
    checksum = log_file.with_name(f".{log_file.name}.crc")  # Hadoop's, of the old bytes
    if checksum.exists():
        os.remove(checksum)
    assert find_commit(target, p.name, 1)["timestamp"] == landed + timedelta(minutes=10)
    late = check_batch(c, p, spark, 1)
    assert late.success and late.results[0]["kind"] == "fresh_within", late.results
    # Past the newest commits find_commit reads (or after log cleanup): the run metrics say when it
    # landed; with neither, freshness is not judged rather than judged at the check's time.
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    from deltadrain.quality import check as dq

    with monkeypatch.context() as m:
        m.setattr(dq, "find_commit", lambda *a, **k: None)
        runs = DeltaTable.forPath(spark, str(metrics_path(c)))
        mine = (F.col("pipeline") == F.lit(p.name)) & (F.col("batch") == F.lit(1))
        landed_local = (landed + timedelta(minutes=10)).astimezone().replace(tzinfo=None)  # as PySpark takes it
        runs.update(mine, {"finished_at": F.lit(landed_local)})
        from_metrics = check_batch(c, p, spark, 1)
        assert from_metrics.success and from_metrics.results[0]["kind"] == "fresh_within", from_metrics.results
        runs.delete(mine)
        unknown = check_batch(c, p, spark, 1)
        assert unknown.success and unknown.results == []
    # The same events committed now are two days old when they land: stale, and the check says so.
    send(3, 5)
    assert drain(c, p, spark=spark).batch == 2
    stale = check_batch(c, p, spark, 2)
    assert not stale.success and stale.failed == ["event_time newest within 1:00:00"]


def test_default_suite_catches_a_duplicate_id(tmp_path, cfg, spark):
    from pyspark.sql import functions as F

    path, c, p, _, _ = drained(tmp_path, spark, 40)
    assert p.quality.expectations == [] and p.quality.on_failure == "fail"
    passed = check_batch(c, p, spark, 1)
    assert passed.success and passed.rows_checked == 40
    assert {"event_id unique", "event_id not null", "amount is double", "event_time is timestamp"} <= {
        r["expectation"] for r in passed.results}
    # A writer that bypasses the drain appends a copy of an existing row to batch 1.
    target = str(c.target_path(p))
    copy = table(spark, target).limit(1).withColumn("_dd_position", F.lit("0-0"))
    copy.write.format("delta").mode("append").save(target)
    with pytest.raises(QualityFailed, match="event_id unique"):
        check_batch(c, p, spark, 1)
    with pytest.raises(QualityFailed, match="whole table failed data quality: event_id unique"):
        check_table(c, p, spark)
    # The CLI reports the same, as JSON, and exits non-zero.
    code = cli.main(["--config", str(path), "quality", p.name, "--table", "--json", "--local"])
    assert code == 1


def test_metrics_rows_for_each_drain_and_a_chart(tmp_path, cfg, spark, capsys):
    path, c, p = make_pipeline(tmp_path, partitions=2)
    produce(c, p, 150, seed=3)
    first = drain(c, p, spark=spark)
    produce(c, p, 50, seed=3, start=150)
    second = drain(c, p, spark=spark)
    empty = drain(c, p, spark=spark)
    runs = last_runs(spark, c, p, 10)
    assert [r["run_id"] for r in runs] == [empty.run_id, second.run_id, first.run_id]
    assert [(r["batch"], r["outcome"], r["claimed"], r["written"]) for r in runs] == [
        (2, "empty", 0, 0), (2, "committed", 50, 50), (1, "committed", 150, 150)]
    assert all(r["backlog"] == 0 and r["seconds"] > 0 for r in runs)
    assert runs[2]["rows_per_s"] == pytest.approx(150 / first.seconds, abs=0.001)
    assert "commit" in runs[2]["timings"] and runs[0]["rows_per_s"] == 0
    assert table(spark, metrics_path(c)).where(f"pipeline = '{p.name}'").count() == 3
    chart = render_chart(spark, c, p, tmp_path / "chart.html")
    page = chart.read_text()
    assert page.count("<svg") == 2 and page.count("<polyline") == 2 and p.name in page
    # The CLI: the last runs as JSON, and the chart written where asked.
    assert cli.main(["--config", str(path), "metrics", p.name, "--last", "2", "--json",
                     "--chart", str(tmp_path / "cli.html")]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [r["run_id"] for r in shown["runs"]] == [empty.run_id, second.run_id]
    assert shown["chart"] == str(tmp_path / "cli.html") and (tmp_path / "cli.html").exists()
    # `deltadrain status` lists the last runs too.
    assert cli.main(["--config", str(path), "status", p.name]) == 0
    out = capsys.readouterr().out
    assert out.count(" run ") == 3 and "batch 1 committed: claimed 150 written 150" in out



def test_the_first_runs_of_several_pipelines_at_once_create_the_metrics_table_and_each_row_lands_once(
        tmp_path, cfg, spark, caplog):
    """The metrics table is created by the first row appended to it (delta-rs, no Spark job). Four
    runs finishing at the same instant race for that creation: the losers append again, and the
    table holds each run once, readable by Spark with the metrics columns."""
    import threading

    from deltadrain.lake.metrics import METRICS_SCHEMA, record_run
    from deltadrain.run.summary import RunSummary

    _, c, p = make_pipeline(tmp_path, partitions=1)
    runs = [RunSummary(f"{p.name}_{i}", f"run-{i}", batch=1, outcome="committed", claimed=10 + i, written=10 + i,
                       seconds=1.0, timings={"commit": 0.5}) for i in range(4)]
    start, failed = threading.Barrier(len(runs)), []

    def finish(summary):
        start.wait()
        try:
            record_run(spark, c, p, summary, backlog=0)
        except Exception as exc:  # a thread's exception would otherwise vanish
            failed.append(exc)

    caplog.set_level(logging.DEBUG, logger="deltadrain.lake.metrics")
    threads = [threading.Thread(target=finish, args=(r,)) for r in runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failed == []
    got = table(spark, metrics_path(c))
    assert [f.name for f in got.schema.fields] == [col.split()[0] for col in METRICS_SCHEMA.split(", ")]
    assert sorted((r.run_id, r.claimed) for r in got.collect()) == [(f"run-{i}", 10 + i) for i in range(4)]
    # Nobody needed the Spark fallback: a lost creation race is retried by delta-rs itself.
    assert "appending with Spark" not in caplog.text

def drop_batch_column(df):
    """A broken handler for the test below: it loses a column the drain needs."""
    return df.drop("_dd_batch")


def test_a_failing_drain_is_recorded_as_an_error_run(tmp_path, cfg, spark):
    _, c, p = make_pipeline(tmp_path, partitions=1, transform=f"{__name__}.drop_batch_column")
    produce(c, p, 10, seed=5)
    with pytest.raises(DrainError, match="dropped columns"):
        drain(c, p, spark=spark)
    [run] = last_runs(spark, c, p, 5)
    assert run["outcome"] == "error" and run["batch"] == 1 and run["claimed"] == 10 and run["written"] == 0
    assert run["error"].startswith("DrainError: transform") and "_dd_batch" in run["error"]


@pytest.mark.slow
def test_the_spark_submit_entry_point_checks_a_batch(tmp_path, cfg, spark):
    """What the quality DAG submits: spark_jobs/quality.py under spark-submit. One submit (a driver JVM of
    its own) for the entry point; the job's body is the same deltadrain.jobs an Airflow task runs on the
    Spark Connect server, and the ingest DAG's submitted check is test_dags'."""
    import os
    import subprocess

    from deltadrain.paths import PROJECT_ROOT
    from deltadrain.runtime.session import spark_submit_command
    from tests.support.processes import summary_of

    path, c, p, _, _ = drained(tmp_path, spark, 60, quality=quality("fail"))
    with pytest.raises(QualityFailed):
        check_batch(c, p, spark, 1, run_id="dq1")
    # `--owed` alone (what the daily DAG submits first) checks the batches committed since with no result.
    produce(c, p, 30, seed=7, start=60)
    assert drain(c, p, spark=spark).batch == 2
    job = str(PROJECT_ROOT / "spark_jobs" / "quality.py")
    done = subprocess.run(spark_submit_command(job, [p.name, "--owed", "--config", str(path), "--run-id", "dq2"]),
                          capture_output=True, text=True, timeout=600, env={**os.environ})
    # spark-submit's PythonRunner merges the Python driver's stderr into its stdout. ~Half its amounts
    # exceed the limit: the job fails, with the check's own error and exit code 1.
    output = done.stdout + done.stderr
    assert done.returncode == 1 and f"pipeline '{p.name}': batch 2 failed data quality" in output, output[-3000:]
    report = summary_of(done.stdout)
    assert (report["run_id"], report["batch"], report["success"]) == ("dq2", 2, False)
    assert (report["caught_up"], report["still_owed"]) == ([2], 0)
    assert f"Data Docs: {report['data_docs']}" in done.stdout
    assert [(r["run_id"], r["batch"]) for r in last_results(spark, c, p)] == [("dq2", 2), ("dq1", 1)]


def test_a_catch_ups_batches_are_all_checked_even_when_the_first_fails(tmp_path, cfg, spark):
    from deltadrain.quality.check import check_batches
    from deltadrain.quality.errors import BatchesFailed

    path, c, p = make_pipeline(tmp_path, partitions=2, batch_cap=100, quality=quality("fail"))
    produce(c, p, 200, seed=7)
    assert [drain(c, p, spark=spark).batch for _ in range(2)] == [1, 2]
    with pytest.raises(BatchesFailed) as info:
        check_batches(c, p, spark, [1, 2])
    out = info.value.summary
    assert "batch 1 failed data quality" in str(info.value)
    assert out["batches"] == [1, 2] and not out["success"] and out["rows_checked"] == 200
    assert [r["batch"] for r in out["reports"]] == [1, 2]
    assert {f.split(":")[0] for f in out["failed"]} == {"batch 1", "batch 2"}
    rows = table(spark, results_path(c)).where(f"pipeline = '{p.name}'").collect()
    assert sorted(r.batch for r in rows) == [1, 2]  # the second batch was checked after the first failed


def test_run_times_are_utc_whatever_the_processs_time_zone(tmp_path, cfg, spark, monkeypatch):
    """PySpark hands timestamps to Python as naive times of the process's zone; the metrics chart and
    `metrics --json` label them UTC, so they must be converted, not taken as they come."""
    import time
    from datetime import UTC, datetime

    from deltadrain.lake.metrics import chart_html

    _, c, p = make_pipeline(tmp_path, partitions=1)
    produce(c, p, 5, seed=7)
    drain(c, p, spark=spark)
    now = datetime.now(UTC)
    monkeypatch.setenv("TZ", "Asia/Kathmandu")  # UTC+05:45: no whole-hour offset can pass by chance
    time.tzset()
    try:
        [run] = last_runs(spark, c, p, 5)
        page = chart_html(p.name, [run])
    finally:
        monkeypatch.undo()
        time.tzset()
    assert run["finished_at"].tzinfo is not None and abs((run["finished_at"] - now).total_seconds()) < 120
    assert f"<td>{run['finished_at']:%Y-%m-%d %H:%M}" in page and run["finished_at"].utcoffset().total_seconds() == 0


def test_a_backfill_leaves_quarantined_messages_in_the_quarantine(tmp_path, cfg, spark):
    """A backfill re-reads the same messages a batch check quarantined; put back by the MERGE on the
    id, they would sit in the target unchecked (the whole-table check never quarantines). An id sent
    again at a new position is a new message and is written."""
    from datetime import UTC, datetime, timedelta

    from deltadrain.heal.backfill import backfill
    from deltadrain.lake.checkpoint import positions_from_rows

    began = datetime.now(UTC) - timedelta(seconds=5)
    _, c, p, client, result = drained(tmp_path, spark, 300, quality=quality("quarantine"))
    bad = over_limit(spark, c, p, 1)
    first = read_checkpoint(spark, str(c.target_path(p)), p.name)
    assert bad and check_batch(c, p, spark, 1).quarantined == len(bad)
    healed = backfill(c, p, spark, began, datetime.now(UTC) + timedelta(seconds=1))
    assert (healed.read, healed.skipped_quarantined, healed.written) == (300, len(bad), 0), healed.line()
    assert set(target_ids(spark, c, p)).isdisjoint(bad)
    # The same id sent again (a new stream entry) is written.
    again = next(m for m in generate(p, 300, seed=7) if m.key in bad)
    client.xadd(p.source.streams[0], {b"data": again.value})
    assert drain(c, p, spark=spark).written == 1
    # Rows the quarantine holds count when positions must be read back from the rows (log cleanup):
    # batch 1's positions are those of all its 300 messages, quarantined or not.
    assert positions_from_rows(spark, str(c.target_path(p)), str(c.dlq_path(p)), 1,
                               str(quarantine_path(c, p))) == first.positions


@pytest.mark.slow
def test_a_batch_check_takes_on_the_committed_batches_that_have_no_result(tmp_path, cfg, spark, monkeypatch,
                                                                            capsys, spark_connect_server):
    """No quality task is told of a batch whose drain try died after its commit, and a check killed
    between quarantine's MERGE and DELETE writes no result: the next batch check takes both on."""
    from deltadrain import failpoints
    from deltadrain.quality.check import check_batches
    from tests.support.processes import cli_drain

    # The killed drain's claims stay its own for the whole test (min_idle_ms): on a slow day a later run
    # would otherwise retake them as a dead run's, a batch of duplicates in place of the new messages.
    path, c, p, client, first = drained(tmp_path, spark, 200, quality=quality("quarantine"), min_idle_ms=600_000)
    bad = {1: over_limit(spark, c, p, 1)}
    # Drained with the CLI before any check: the view says no batch check owes it; once checked, from it on.
    assert lakeview.owed_from(c, p) is None
    assert check_batches(c, p, spark, [1], owed=True)["caught_up"] == []  # the first check owes nothing
    assert lakeview.owed_from(c, p) == 1
    # Batch 2: committed by a drain killed before it acknowledged (the Airflow try fails, its summary is lost).
    sent = [first, produce(c, p, 100, seed=7, start=200)]
    killed = cli_drain(path, p.name, env={"DELTADRAIN_FAILPOINT": "after_commit"}, remote=True)
    _, err = killed.communicate(timeout=600)
    assert killed.returncode == -9 and failpoints.fired("after_commit") in err
    # Batch 3: its check dies between the quarantine MERGE and the target DELETE.
    sent.append(produce(c, p, 100, seed=7, start=300))
    assert drain(c, p, spark=spark).batch == 3
    bad |= {b: over_limit(spark, c, p, b) for b in (2, 3)}
    monkeypatch.setenv("DELTADRAIN_FAILPOINT", "before_quarantine_delete")
    with pytest.raises(InjectedFailure):
        check_batch(c, p, spark, 3)
    monkeypatch.delenv("DELTADRAIN_FAILPOINT")
    sent.append(produce(c, p, 100, seed=7, start=400))
    assert drain(c, p, spark=spark).batch == 4
    bad[4] = over_limit(spark, c, p, 4)
    assert all(bad.values())

    out = check_batches(c, p, spark, [4], owed=True)
    assert (out["caught_up"], out["still_owed"], out["batches"]) == ([2, 3], 0, [2, 3, 4])
    assert [r["quarantined"] for r in out["reports"]] == [len(bad[2]), len(bad[3]), len(bad[4])]
    rows = table(spark, results_path(c)).where(f"pipeline = '{p.name}'").collect()
    assert sorted(r.batch for r in rows) == [1, 2, 3, 4]
    # What the Airflow view shows of them (delta-rs, no JVM): each batch's check and the rows it moved.
    shown = lakeview.batch_checks(c, p, [1, 2, 3, 4, 5])
    assert {b: (q["success"], q["quarantined"]) for b, q in shown.items()} == {
        b: (False, len(bad[b])) for b in (1, 2, 3, 4)}
    assert all(q["failed"] == [f"amount between 0.0 and {LIMIT}"] for q in shown.values()), shown
    # Every offending row moved once, nothing else moved, nothing lost.
    moved = [r.event_id for r in table(spark, quarantine_path(c, p)).collect()]
    assert len(moved) == len(set(moved)) and set(moved) == set().union(*bad.values())
    kept = target_ids(spark, c, p)
    assert set(kept).isdisjoint(moved) and len(kept) + len(moved) == 500
    assert set(kept) | set(moved) == {i for r in sent for i in r.valid_ids}
    # Nothing is owed any more; a batch drained outside Airflow is, and `deltadrain quality --owed` checks it.
    assert check_batches(c, p, spark, [4], owed=True)["caught_up"] == []
    produce(c, p, 50, seed=7, start=500)
    assert drain(c, p, spark=spark).batch == 5
    # The daily DAG leaves a batch committed within the hour to its own ingest run's check.
    assert cli.main(["--config", str(path), "quality", p.name, "--owed", "--settle", "3600", "--json", "--local"]) == 0
    assert (json.loads(capsys.readouterr().out)["caught_up"], catch_up(c, p, spark, [], timedelta(hours=1))) == (
        [], ([], 0))
    # Committed longer ago than the settle time: owed.
    age = datetime.now(UTC) - find_commit(str(c.target_path(p)), p.name, 5)["timestamp"]
    assert age > timedelta(seconds=0.5) and catch_up(c, p, spark, [], age - timedelta(seconds=0.2)) == ([5], 0)
    assert cli.main(["--config", str(path), "quality", p.name, "--owed", "--json", "--local"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["caught_up"], shown["still_owed"], shown["batch"], shown["scope"]) == ([5], 0, 5, "batch")
    assert cli.main(["--config", str(path), "quality", p.name, "--owed", "--local"]) == 0
    assert f"pipeline {p.name}: batches owed a check: none" in capsys.readouterr().out

    # The target is deleted and made anew: its batches start again at 1, and the old table's results
    # (batches 1-5 checked) must not make the new table's look checked.
    old_table = table_id(str(c.target_path(p)))
    shutil.rmtree(c.target_path(p))
    spark._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()  # as the next task's own process sees it
    # Its first batch is drained by an Airflow try that fails after its commit (its check never runs),
    # the second by the CLI: no check yet, and both are owed, though the old table's 1 and 2 were checked.
    airflow_try = f"{ingest_run_prefix(p.name)}manual__2026-11-27T00_00_00-try1"
    for batch, start, run_id in ((1, 550, airflow_try), (2, 600, None)):
        produce(c, p, 50, seed=7, start=start)
        assert drain(c, p, spark=spark, run_id=run_id).batch == batch
    assert table_id(str(c.target_path(p))) != old_table
    assert catch_up(c, p, spark, []) == ([1, 2], 0)
    assert lakeview.owed_from(c, p) == 1  # the view agrees: from the ingest DAG's batch on
    assert check_batches(c, p, spark, [2], owed=True)["caught_up"] == [1]
    assert catch_up(c, p, spark, []) == ([], 0)


def test_a_target_and_source_made_anew_quarantine_their_own_rows_beside_the_old_tables(tmp_path, cfg, spark):
    """A development loop: the target table and the stream are deleted and filled again, so batch 1
    holds the same ids at the same stream ids once more, with other values. Its check quarantines its
    own offending rows. The old table's copies at the same places neither stand in for them (the
    target's DELETE would then have left the new rows in neither table) nor are taken back for them."""
    _, c, p = make_pipeline(tmp_path, partitions=1, quality=quality("quarantine"))
    client = valkey_client(c, p)
    stream = p.source.streams[0]
    payloads = [json.loads(m.value) for m in generate(p, 30, seed=9)]

    def fill(amount_over: float) -> set[str]:
        """The same entries at the same stream ids; every third one over the limit, by `amount_over`."""
        for i, payload in enumerate(payloads):
            amount = amount_over if i % 3 == 0 else 10.0
            client.xadd(stream, {b"data": json.dumps({**payload, "amount": amount}).encode()}, id=f"{1000 + i}-1")
        assert drain(c, p, spark=spark).batch == 1
        return {payload["event_id"] for i, payload in enumerate(payloads) if i % 3 == 0}

    bad = fill(300.0)
    assert check_batch(c, p, spark, 1).quarantined == len(bad) == 10
    old_table = table_id(str(c.target_path(p)))
    shutil.rmtree(c.target_path(p))
    spark._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()
    valkey_admin().delete(stream)  # and its group with it
    assert fill(400.0) == bad
    new_table = table_id(str(c.target_path(p)))
    report = check_batch(c, p, spark, 1)
    assert (report.quarantined, report.taken_back, report.adopted_runs) == (10, 0, [])
    copies = sorted((r._dq_table_id == new_table, r.event_id, r.amount)
                    for r in table(spark, quarantine_path(c, p)).collect())
    assert copies == sorted([*((False, i, 300.0) for i in bad), *((True, i, 400.0) for i in bad)])
    assert {r._dq_table_id for r in table(spark, quarantine_path(c, p)).collect()} == {old_table, new_table}
    assert set(target_ids(spark, c, p)) == {x["event_id"] for x in payloads} - bad


def test_quarantine_moves_rows_only_for_checks_that_could_name_them(tmp_path, cfg, spark):
    """An expectation on a column the table does not have fails with GX's error; the rows that break
    the other expectations are still quarantined, and the check does not crash."""
    _, c, p, _, _ = drained(tmp_path, spark, 120, quality=quality("quarantine", {"column": "no_such", "kind": "not_null"}))
    bad = over_limit(spark, c, p, 1)
    report = check_batch(c, p, spark, 1)
    assert report.failed == [f"amount between 0.0 and {LIMIT}", "no_such not null"]
    assert [r["error"] for r in report.results][:2] == [None, None]
    assert 'The column "no_such" in BatchData does not exist' in report.results[2]["error"]  # GX's, per metric
    assert report.quarantined == len(bad) > 0
    moved = table(spark, quarantine_path(c, p)).collect()
    assert {r.event_id for r in moved} == bad and {r._dq_reason for r in moved} == {f"amount between 0.0 and {LIMIT}"}
    assert len(target_ids(spark, c, p)) == 120 - len(bad)


def test_a_check_that_died_after_its_quarantine_delete_is_reported_by_the_next_not_passed(tmp_path, cfg, spark,
                                                                                          monkeypatch):
    """The rows left the target and no results row says so: the next check of the batch reports
    them (and the checks they broke) as its own, once, rather than a clean pass."""
    from pyspark.sql import functions as F

    _, c, p, _, result = drained(tmp_path, spark, 200, quality=quality("quarantine"))
    bad, qpath = over_limit(spark, c, p, 1), str(quarantine_path(c, p))
    # A quarantine table from before `_dq_table_id`: it gains the column at the first move.
    before = (table(spark, c.target_path(p)).limit(0).withColumn("_dq_reason", F.lit(None).cast("string"))
              .withColumn("_dq_run_id", F.lit(None).cast("string"))
              .withColumn("_dq_quarantined_at", F.lit(None).cast("timestamp")))
    before.write.format("delta").save(qpath)
    monkeypatch.setenv("DELTADRAIN_FAILPOINT", "after_quarantine_delete")
    with pytest.raises(InjectedFailure):
        check_batch(c, p, spark, 1, run_id="dq-died")
    monkeypatch.delenv("DELTADRAIN_FAILPOINT")
    assert over_limit(spark, c, p, 1) == set() and last_results(spark, c, p) == []
    moved = table(spark, qpath).collect()
    assert {r.event_id for r in moved} == bad and {r._dq_table_id for r in moved} == {table_id(str(c.target_path(p)))}

    report = check_batch(c, p, spark, 1)
    assert (report.success, report.quarantined, report.adopted_runs) == (False, len(bad), ["dq-died"])
    assert report.failed == [f"amount between 0.0 and {LIMIT}"] and report.rows_checked == 200 - len(bad)
    assert all(r["success"] for r in report.results)  # what GX saw: the rows left, all good
    [row] = table(spark, results_path(c)).collect()
    assert (row.success, row.quarantined, row.adopted_runs) == (False, len(bad), ["dq-died"])
    # Accounted for now: the next check is clean, and nothing was moved or counted twice.
    again = check_batch(c, p, spark, 1)
    assert (again.success, again.quarantined, again.adopted_runs) == (True, 0, [])
    kept = set(target_ids(spark, c, p))
    assert table(spark, qpath).count() == len(bad) and kept.isdisjoint(bad) and kept | bad == set(result.valid_ids)

    # Unreported rows of this pipeline's batch 1 in another target table (deleted and made anew) are
    # not this table's. Rows from before `_dq_table_id` (null) count for any table when moved after
    # the batch's last result; moved before it, that result counted them (the check that finished
    # an older version's crashed move did).
    sample = table(spark, qpath).limit(1)
    strays = sample.withColumn("_dq_run_id", F.lit("dq-other-table")).withColumn("_dq_table_id", F.lit("another"))
    older = sample.withColumn("_dq_table_id", F.lit(None).cast("string"))
    counted = older.withColumn("_dq_run_id", F.lit("dq-counted")).withColumn("_dd_position", F.lit("0-1"))
    unseen = (older.withColumn("_dq_run_id", F.lit("dq-older")).withColumn("_dd_position", F.lit("0-2"))
              .withColumn("_dq_quarantined_at", F.current_timestamp()))
    strays.unionByName(counted).unionByName(unseen).write.format("delta").mode("append").save(qpath)
    third = check_batch(c, p, spark, 1)
    assert (third.success, third.quarantined, third.adopted_runs) == (False, 1, ["dq-older"])
    assert third.failed == third.adopted_failed == [f"amount between 0.0 and {LIMIT}"]


@pytest.mark.slow
def test_a_row_a_reprocess_rewrites_during_quarantine_is_checked_again_not_lost(tmp_path, cfg, spark, monkeypatch):
    """A reprocess replay rewrites an offending row between the quarantine MERGE and the target
    DELETE. Before, the DELETE removed the rewritten row, and the quarantine kept the old values.
    Now the DELETE leaves it, its old copy leaves the quarantine, and the batch is checked again."""
    from pyspark.sql import functions as F

    from deltadrain.heal.replay import ReplayRequest, replay
    from deltadrain.quality import quarantine as q

    _, c, p, _, result = drained(tmp_path, spark, 120, quality=quality("quarantine"))
    bad = over_limit(spark, c, p, 1)
    victim = sorted(bad)[0]
    fail, replays = q.failpoints.fail, []

    def reprocess_then(name):  # the step boundary, run for real in between
        if name == "before_quarantine_delete" and not replays:
            replays.append(replay(c, spark, ReplayRequest(pipeline=p.name, mode="reprocess", message_ids=[victim],
                                                          dry_run=False)))
        fail(name)

    monkeypatch.setattr(q.failpoints, "fail", reprocess_then)
    report = check_batch(c, p, spark, 1, run_id="dq-race")
    [rewrite] = replays
    assert rewrite.written == 1
    # The second round moved the rewritten row (still over the limit), with its new values; the report
    # counts what both rounds moved and kept moved.
    assert (report.run_id, report.quarantined, report.taken_back) == ("dq-race.1", len(bad), 1)
    moved = table(spark, quarantine_path(c, p)).collect()
    assert sorted(r.event_id for r in moved) == sorted(bad)  # each once
    [copy] = [r for r in moved if r.event_id == victim]
    assert (copy._dd_run_id, copy._dq_run_id) == (rewrite.run_id, "dq-race.1")
    kept = target_ids(spark, c, p)
    assert set(kept).isdisjoint(bad) and set(kept) | bad == set(result.valid_ids)
    rounds = table(spark, results_path(c)).where(F.col("pipeline") == p.name).orderBy("checked_at").collect()
    assert [(r.run_id, r.quarantined) for r in rounds] == [("dq-race", len(bad) - 1), ("dq-race.1", 1)]


@pytest.mark.slow
def test_a_row_rewritten_after_a_crashed_quarantine_is_moved_with_its_new_values(tmp_path, cfg, spark, monkeypatch):
    """A check dies between the quarantine MERGE and the DELETE; a reprocess then rewrites an offending
    row. The next check must not match the stale copy (insert nothing) and then delete the rewritten row."""
    from deltadrain.heal.replay import ReplayRequest, replay

    _, c, p, _, result = drained(tmp_path, spark, 120, quality=quality("quarantine"))
    bad = over_limit(spark, c, p, 1)
    victim = sorted(bad)[0]
    monkeypatch.setenv("DELTADRAIN_FAILPOINT", "before_quarantine_delete")
    with pytest.raises(InjectedFailure):
        check_batch(c, p, spark, 1)
    monkeypatch.delenv("DELTADRAIN_FAILPOINT")
    rewrite = replay(c, spark, ReplayRequest(pipeline=p.name, mode="reprocess", message_ids=[victim], dry_run=False))
    assert rewrite.written == 1
    report = check_batch(c, p, spark, 1, run_id="dq-after")
    assert (report.quarantined, report.taken_back) == (len(bad), 0)
    moved = table(spark, quarantine_path(c, p)).collect()
    assert sorted(r.event_id for r in moved) == sorted(bad)
    [copy] = [r for r in moved if r.event_id == victim]
    assert (copy._dd_run_id, copy._dq_run_id) == (rewrite.run_id, "dq-after")
    kept = target_ids(spark, c, p)
    assert set(kept).isdisjoint(bad) and set(kept) | bad == set(result.valid_ids)


def test_a_results_table_from_before_table_id_gains_the_column_and_its_rows_count_for_any_table(tmp_path, spark):
    from datetime import datetime

    _, c, p = make_pipeline(tmp_path)
    old = RESULTS_SCHEMA.split(", table_id STRING")[0]  # nor adopted_runs, which came later
    assert old != RESULTS_SCHEMA
    row = (p.name, "batch", 1, 1, "check-1", "run-1", "s", "warn", True, 10, 0, "[]", "[]", 0, datetime.now(), "")
    spark.createDataFrame([row], old).write.format("delta").save(str(results_path(c)))
    write_result(spark, c, QualityReport(pipeline=p.name, scope="batch", batch=2, suite="s", policy="warn",
                                         success=True, rows_checked=10, run_id="check-2", table_id="table-a"))
    rows = table(spark, results_path(c)).collect()
    assert sorted((r.batch, r.table_id) for r in rows) == [(1, None), (2, "table-a")]
    assert checked_batches(spark, c, p, "table-a") == {1, 2} and checked_batches(spark, c, p, "table-b") == {1}
