"""Pure parts of the operator's view: a selection becomes exactly the replay confs that replay it."""

from __future__ import annotations

import json

import pytest

from deltadrain.observe.tables import PREVIEW_BYTES, preview
from deltadrain.orchestration.view.actions import (
    MAX_RUNS,
    SelectionError,
    parse_entry,
    same_origin,
    selection_to_confs,
)
from deltadrain.orchestration.view.app import self_api_url

DEAD = {("orders:{0}", "1-0"): "a", ("orders:{0}", "2-0"): None, ("orders:{1}", "1-1"): "b",
        ("orders:{1}", "9-0"): "a", ("t-3", "42"): None}


def test_parse_entry_splits_at_the_last_at_sign():
    assert parse_entry("orders:{0}@1-0") == ("orders:{0}", "1-0")
    assert parse_entry("odd@name@7") == ("odd@name", "7")
    for bad in ("", "x@", "@1-0", "no-at"):
        with pytest.raises(SelectionError):
            parse_entry(bad)


def test_ids_go_in_one_run_and_idless_entries_one_run_each():
    confs = selection_to_confs("orders", [("orders:{0}", "1-0"), ("orders:{1}", "1-1"), ("orders:{0}", "2-0"),
                                          ("t-3", "42"), ("orders:{0}", "1-0")], DEAD)
    assert confs[0] == {"pipeline": "orders", "mode": "dlq", "message_ids": ["a", "b"], "limit": 10_000,
                        "dry_run": False}
    assert confs[1:] == [
        {"pipeline": "orders", "mode": "dlq", "partition": "orders:{0}", "position_from": "2-0",
         "position_to": "2-0", "limit": 1, "dry_run": False},
        {"pipeline": "orders", "mode": "dlq", "partition": "t-3", "position_from": "42", "position_to": "42",
         "limit": 1, "dry_run": False}]


def test_confs_are_valid_replay_requests():
    from deltadrain.heal.replay import ReplayRequest

    for conf in selection_to_confs("orders", list(DEAD), DEAD):
        request = ReplayRequest.model_validate(conf)
        assert request.mode == "dlq" and request.dry_run is False


def test_entries_that_are_not_dead_are_refused():
    with pytest.raises(SelectionError, match=r"not DEAD.*orders:\{0\}@3-0"):
        selection_to_confs("orders", [("orders:{0}", "1-0"), ("orders:{0}", "3-0")], DEAD)
    with pytest.raises(SelectionError, match="nothing selected"):
        selection_to_confs("orders", [], DEAD)


def test_too_many_idless_entries_are_refused():
    dead = {("s", f"{i}-0"): None for i in range(MAX_RUNS + 1)}
    with pytest.raises(SelectionError, match="no message id"):
        selection_to_confs("orders", list(dead), dead)
    assert len(selection_to_confs("orders", list(dead)[:MAX_RUNS], dead)) == MAX_RUNS


def test_same_origin():
    assert same_origin({"origin": "http://127.0.0.1:8080"}, "127.0.0.1:8080")
    assert same_origin({"referer": "http://127.0.0.1:8080/deltadrain/pipelines/x"}, "127.0.0.1:8080")
    assert not same_origin({"origin": "http://evil.example"}, "127.0.0.1:8080")
    assert not same_origin({"origin": "null"}, "127.0.0.1:8080")
    assert not same_origin({}, "127.0.0.1:8080")


def test_preview_is_truncated_and_decodes_bad_bytes():
    assert preview(None) is None
    assert preview(b"\xff{") == "\ufffd{"
    long = preview(b"x" * (PREVIEW_BYTES + 50))
    assert long == "x" * PREVIEW_BYTES + "…"


def test_gap_rows_show_valkey_id_ranges_and_kafka_offsets_alike():
    from deltadrain.observe.tables import gap_row

    valkey = gap_row({"partition": "orders:{0}", "kind": "unread", "from": "5-0", "to": "9-3", "missing": None,
                      "reason": "trimmed"})
    assert valkey == {"partition": "orders:{0}", "kind": "unread", "range": "5-0 to 9-3", "missing": None,
                      "reason": "trimmed"}
    kafka = gap_row({"partition": 2, "start": 100, "end": 140, "missing": 40})  # end exclusive
    assert (kafka["partition"], kafka["kind"], kafka["range"], kafka["missing"]) == ("2", "retention",
                                                                                     "offsets 100 to 139", 40)


def test_kafka_pending_is_end_offset_minus_the_lake_checkpoint():
    # The view and status share kafka.offsets.start_offsets (the drain's own start rule).
    from deltadrain.sources.kafka.offsets import start_offsets

    def pending(marks, positions, starting):
        starts, _ = start_offsets(positions, marks, starting)
        return {str(p): marks[p][1] - s for p, s in starts.items()}

    marks = {0: (0, 100), 1: (50, 80), 2: (0, 10)}
    assert pending(marks, {"0": "60", "1": "20"}, "earliest") == {"0": 40, "1": 30, "2": 10}
    assert pending(marks, {}, "latest") == {"0": 0, "1": 0, "2": 0}
    # A partition added after the first run starts at its earliest offset, whatever `starting` says.
    assert pending(marks, {"0": "100"}, "latest") == {"0": 0, "1": 30, "2": 10}


def test_the_view_calls_the_api_where_the_server_listens_not_where_the_browser_was():
    # Compose: the browser's (and base_url's) 127.0.0.1:8088 is mapped to the container's 8080.
    assert self_api_url("0.0.0.0", 8080, "http://127.0.0.1:8088", tls=False) == "http://127.0.0.1:8080"
    assert self_api_url("0.0.0.0", 8080, None, tls=False) == "http://127.0.0.1:8080"
    # Served under a path: the path of base_url, the host and port of the listener.
    assert self_api_url("0.0.0.0", 8080, "https://airflow.example.com/af/", tls=False) == "http://127.0.0.1:8080/af"
    assert self_api_url("10.1.2.3", 9000, "", tls=False) == "http://10.1.2.3:9000"
    assert self_api_url("::", 8080, None, tls=False) == "http://[::1]:8080"
    # TLS: the certificate names base_url's host.
    assert self_api_url("0.0.0.0", 8443, "https://airflow.example.com/", tls=True) == "https://airflow.example.com"
    assert self_api_url("0.0.0.0", 8443, None, tls=True) == "https://127.0.0.1:8443"


def test_airflow_base_url_reads_the_api_servers_own_settings(monkeypatch):
    from deltadrain.orchestration.view.app import airflow_base_url

    monkeypatch.setenv("AIRFLOW__API__HOST", "0.0.0.0")
    monkeypatch.setenv("AIRFLOW__API__PORT", "8080")
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "http://127.0.0.1:8088")
    assert airflow_base_url() == "http://127.0.0.1:8080"


def test_a_replay_range_ending_at_a_bare_millisecond_takes_that_whole_millisecond():
    # The form's help says so; the check of the range used to read "5" as 5-0 and refuse 5-1 .. 5.
    from pydantic import ValidationError

    from deltadrain.heal.replay import LONG_MAX, ReplayRequest
    from deltadrain.positions import StreamId

    request = ReplayRequest(pipeline="orders", position_from="5-1", position_to="5")
    assert request.upper_bound() == StreamId(5, LONG_MAX)
    assert ReplayRequest(pipeline="orders", position_to="5-3").upper_bound() == StreamId(5, 3)
    assert ReplayRequest(pipeline="orders").upper_bound() is None
    with pytest.raises(ValidationError, match="position range is inverted: 6-0 > 5"):
        ReplayRequest(pipeline="orders", position_from="6-0", position_to="5")
    with pytest.raises(ValidationError, match="beyond the largest position"):  # not a Spark cast error later
        ReplayRequest(pipeline="orders", position_from=str(2**63))


def test_a_batch_shows_its_newest_check_of_the_current_target():
    from datetime import UTC, datetime

    from deltadrain.observe.tables import newest_checks

    def row(batch, hour, success, table="t2", failed=(), quarantined=0):
        return {"batch": batch, "success": success, "failed": json.dumps(list(failed)), "quarantined": quarantined,
                "policy": "quarantine", "checked_at": datetime(2026, 11, 27, hour, tzinfo=UTC), "table_id": table}

    rows = [row(1, 10, False, failed=["amount_between"], quarantined=3), row(1, 12, True),  # checked again later
            row(2, 11, False, failed=["id_unique"]), row(2, 13, True, table="t1"),  # a table made anew: not ours
            row(3, 9, True, table=None)]  # from before results named their table: counts
    got = newest_checks(rows, "t2")
    # Batch 1 passes its re-check; the rows the first check moved still count.
    assert {b: (c["success"], c["failed"], c["quarantined"]) for b, c in got.items()} == {
        1: (True, [], 3), 2: (False, ["id_unique"], 0), 3: (True, [], 0)}
    assert got[1]["checked_at"].hour == 12 and newest_checks(rows, "t9") == {3: got[3]}


def test_batch_checks_read_a_results_table_from_before_table_id(tmp_path, cfg):
    """A results table an older deltadrain wrote has no `table_id` until the next check's row adds
    it: the view must still show its checks (a real delta-rs table, no JVM)."""
    from datetime import UTC, datetime

    import pyarrow as pa
    from deltalake import write_deltalake

    from deltadrain.observe.tables import batch_checks, owed_from
    from deltadrain.quality.results import results_path

    c = cfg.model_copy(update={"data_dir": str(tmp_path / "lake")})
    p = c.pipelines[0]
    write_deltalake(str(c.target_path(p)), pa.table({"event_id": ["a"], "_dd_batch": pa.array([1], pa.int64())}))
    at = datetime(2026, 11, 27, 12, tzinfo=UTC)
    old = pa.table({"pipeline": [p.name, p.name, "other"], "scope": ["batch", "table", "batch"],
                    "batch": pa.array([1, None, 1], pa.int64()), "success": [False, True, True],
                    "failed": ['["id_unique"]', "[]", "[]"], "quarantined": pa.array([2, 0, 0], pa.int64()),
                    "policy": ["quarantine"] * 3, "checked_at": pa.array([at] * 3, pa.timestamp("us", "UTC"))})
    write_deltalake(str(results_path(c)), old)
    got = batch_checks(c, p, [1, 2])
    assert {b: (q["success"], q["failed"], q["quarantined"]) for b, q in got.items()} == {1: (False, ["id_unique"], 2)}
    assert batch_checks(c, p, []) == {}
    assert owed_from(c, p) == 1  # its rows name no table: they count for the current one


def test_batches_are_owed_from_the_lowest_check_of_this_table_or_else_from_the_ingest_dags_first(tmp_path, cfg):
    """What the view says of an unchecked batch follows quality.owed.owed_batches: owed from the lowest
    batch checked on this target table; with none, from the oldest batch the ingest DAG drained
    (its run id says so); else owed to no check (real delta-rs tables, commit metadata as a drain's)."""
    from datetime import UTC, datetime

    import pyarrow as pa
    from deltalake import CommitProperties, DeltaTable, write_deltalake

    from deltadrain.names import ingest_run_prefix
    from deltadrain.observe.tables import owed_from
    from deltadrain.quality.results import results_path

    c = cfg.model_copy(update={"data_dir": str(tmp_path / "lake")})
    p = c.pipelines[0]
    target = str(c.target_path(p))
    assert owed_from(c, p) is None  # no table yet
    for batch, run_id in ((1, "host-cli-1"), (2, f"{ingest_run_prefix(p.name)}scheduled__x-try1"), (3, "host-cli-2")):
        meta = json.dumps({"pipeline": p.name, "batch": batch, "run_id": run_id})
        write_deltalake(target, pa.table({"event_id": [str(batch)], "_dd_batch": pa.array([batch], pa.int64())}),
                        mode="append", commit_properties=CommitProperties(custom_metadata={"userMetadata": meta}))
    assert owed_from(c, p) == 2  # no check yet: from the ingest DAG's batch; the CLI's batch 1 is owed nothing
    at = pa.array([datetime(2026, 11, 27, 12, tzinfo=UTC)] * 2, pa.timestamp("us", "UTC"))
    write_deltalake(str(results_path(c)), pa.table({
        "pipeline": [p.name] * 2, "scope": ["batch"] * 2, "batch": pa.array([1, 3], pa.int64()),
        "success": [True] * 2, "failed": ["[]"] * 2, "quarantined": pa.array([0, 0], pa.int64()),
        "policy": ["fail"] * 2, "checked_at": at, "table_id": ["an-older-table", DeltaTable(target).metadata().id]}))
    assert owed_from(c, p) == 3  # the older table's check of its batch 1 does not count


def test_the_ingest_dags_first_batch_is_looked_for_as_far_back_as_the_quality_task_looks(tmp_path, cfg):
    """Past the HISTORY commits the page reads for itself: with no check yet, an ingest DAG batch
    followed by more than 100 other commits is still where owed batches start (quality.owed.first_scheduled)."""
    import pyarrow as pa
    from deltalake import CommitProperties, write_deltalake

    from deltadrain.names import ingest_run_prefix
    from deltadrain.observe.tables import HISTORY, one_read, owed_from
    from deltadrain.quality.owed import FIRST_SCHEDULED_SCAN

    c = cfg.model_copy(update={"data_dir": str(tmp_path / "lake")})
    p = c.pipelines[0]
    target, rows = str(c.target_path(p)), pa.table({"event_id": ["x"], "_dd_batch": pa.array([1], pa.int64())})
    meta = json.dumps({"pipeline": p.name, "batch": 1, "run_id": f"{ingest_run_prefix(p.name)}scheduled__x-try1"})
    write_deltalake(target, rows, commit_properties=CommitProperties(custom_metadata={"userMetadata": meta}))
    for _ in range(HISTORY + 5):  # maintenance, replays, quarantines: commits that carry no batch
        write_deltalake(target, rows, mode="append")
    assert HISTORY + 6 <= FIRST_SCHEDULED_SCAN
    with one_read():
        assert owed_from(c, p) == 1


def test_a_run_recorded_as_an_error_that_committed_its_batch_shows_its_check(monkeypatch, cfg):
    from deltadrain.observe import tables as lakeview
    from deltadrain.orchestration.view.data import with_checks

    monkeypatch.setattr(lakeview, "committed_runs", lambda cfg, pipeline: {(5, "try1"), (4, "older")})
    monkeypatch.setattr(lakeview, "owed_from", lambda cfg, pipeline: 6)
    monkeypatch.setattr(lakeview, "batch_checks", lambda cfg, pipeline, batches: {b: {"success": True}
                                                                                 for b in batches if b != 6})
    runs = [{"batch": 6, "outcome": "committed", "run_id": "try2"},
            {"batch": 5, "outcome": "error", "run_id": "try1"},  # committed, then its acknowledgement failed
            {"batch": 5, "outcome": "error", "run_id": "try0"},  # failed before its commit: 5 is try1's
            {"batch": 4, "outcome": "already_committed", "run_id": "again"}, {"batch": None, "outcome": "empty"}]
    got = with_checks(cfg, cfg.pipelines[0], runs)
    assert [r.get("quality", "-") for r in got] == [None, {"success": True}, "-", {"success": True}, "-"]
    assert [r.get("owed", "-") for r in got] == [True, "-", "-", "-", "-"]  # said of unchecked batches only

    def unreadable(cfg, pipeline):
        raise OSError("results table unreadable")

    # What is owed only qualifies "not checked": when it cannot be read, the runs are shown without it.
    monkeypatch.setattr(lakeview, "owed_from", unreadable)
    runs = [{"batch": 6, "outcome": "committed", "run_id": "try2"}]
    assert with_checks(cfg, cfg.pipelines[0], runs) == [{**runs[0], "quality": None}]


def test_one_read_opens_each_table_once(tmp_path):
    import pyarrow as pa
    from deltalake import write_deltalake

    from deltadrain.observe.tables import one_read, open_table

    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"x": [1]}))
    assert open_table(path) is not open_table(path)  # outside: a fresh snapshot each time
    with one_read():
        first = open_table(path)
        write_deltalake(path, pa.table({"x": [2]}), mode="append")
        assert open_table(path) is first and first.version() == 0  # one snapshot for the whole page
        assert open_table(str(tmp_path / "none")) is None
    assert open_table(path).version() == 1


def test_history_under_one_read_numbers_commits_made_after_the_table_was_opened(tmp_path, cfg):
    """delta-rs numbers commits made after a snapshot down from that snapshot's version: the
    checkpoint the page shows must carry the real version even when a batch lands mid-page."""
    import pyarrow as pa
    from deltalake import CommitProperties, write_deltalake

    from deltadrain.observe.tables import last_commit, one_read, open_table, published_count

    c = cfg.model_copy(update={"data_dir": str(tmp_path / "lake")})
    p = c.pipelines[0]
    path = str(c.target_path(p))

    def batch(n: int, mode: str) -> None:
        meta = json.dumps({"deltadrain": 1, "pipeline": p.name, "batch": n, "run_id": f"r{n}", "positions": {}})
        write_deltalake(path, pa.table({"event_id": [str(n)]}), mode=mode,
                        commit_properties=CommitProperties(custom_metadata={"userMetadata": meta}))

    batch(1, "error")
    with one_read():
        assert published_count(c, p) == 1 and open_table(path).version() == 0
        batch(2, "append")  # lands while the page reads
        assert (last_commit(c, p)["batch"], last_commit(c, p)["table_version"]) == (2, 1)
    assert last_commit(c, p)["table_version"] == 1


def test_an_index_row_says_what_it_could_not_read_and_the_others_still_show(monkeypatch, cfg):
    import time

    from deltadrain.observe import tables as lakeview
    from deltadrain.orchestration.view import data

    slow, broken = cfg.pipelines[0], cfg.pipelines[0].model_copy(update={"name": "broken"})

    def counts(cfg, pipeline, until=None):
        time.sleep(1.0 if pipeline is slow else 0)
        return {"PENDING": 5, "CLAIMED": 2, "STALE_CLAIMED": 0}

    def runs(cfg, pipeline, n, numbered=False):
        if pipeline is broken:
            raise OSError("the lake's disk is gone")
        return []

    monkeypatch.setattr(data, "source_counts", counts)
    monkeypatch.setattr(data, "SOURCE_WAIT_S", 0.2)
    monkeypatch.setattr(lakeview, "last_batches", runs)
    rows = {r["pipeline"]: r for r in data.pipeline_summaries(cfg, [slow, broken])}
    assert (rows[slow.name]["lag"], rows[slow.name]["source_note"]) == (None, "source did not answer within 0.2 s")
    assert rows[slow.name]["lake_note"] is None and rows[slow.name]["DEAD"] is not None
    assert (rows["broken"]["lag"], rows["broken"]["lake_note"]) == (7, "lake unreadable (OSError)")


def test_a_kafka_broker_that_is_down_is_a_grey_note_with_its_address_within_the_pages_wait(cfg, monkeypatch):
    """A broker nobody listens at is named at once (not after the broker calls' own 30 s), in a note
    with its address and the fix, not as a failure; what the client said stays out of the page."""
    import socket
    import time

    from deltadrain.orchestration.view import data

    with socket.socket() as s:  # a port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    kafka = next(p for p in cfg.pipelines if p.source.kind == "kafka")
    down = kafka.model_copy(update={"source": kafka.source.model_copy(
        update={"bootstrap_servers": f"127.0.0.1:{port}"})})
    monkeypatch.setattr(data, "SOURCE_WAIT_S", 3)
    began = time.monotonic()
    counts = data.bounded_source_counts(cfg, down)
    assert time.monotonic() - began < 3
    assert (counts["PENDING"], counts.get("source_note")) == (None, None)
    [note] = counts["notes"]
    assert note["state"] == "unreachable"
    assert note["note"] == (f"cannot reach Kafka at 127.0.0.1:{port} for pipeline 'clicks' (KafkaException): check "
                            f"source.bootstrap_servers of pipeline 'clicks' in {cfg.source_file} and that the server runs")
