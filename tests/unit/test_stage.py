"""Staging: what the claim tasks write and report, and what the driver makes of the reports."""

from datetime import UTC, datetime
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from deltadrain.positions import StreamId
from deltadrain.run.stage import Staged, report_arrow_schema, tally, write_and_report

SCHEMA = pa.schema([("_dd_partition", pa.string()), ("_dd_pos_hi", pa.int64()), ("_dd_pos_lo", pa.int64()),
                    ("_dd_source_ts", pa.timestamp("us", tz="UTC")), ("_dd_attempts", pa.int32()),
                    ("_dd_reclaimed", pa.bool_()), ("_dd_error_type", pa.string()), ("event_id", pa.string())])


def ts(second: int) -> datetime:
    return datetime(2026, 11, 23, 12, 0, second, tzinfo=UTC)


def batch(rows):
    """rows: (partition, position "ms-seq", second, attempts, reclaimed, error_type, id)."""
    cols = list(zip(*rows, strict=True))
    pos = [StreamId.parse(p) for p in cols[1]]
    return pa.RecordBatch.from_arrays(
        [pa.array(cols[0]), pa.array([p.ms for p in pos], pa.int64()), pa.array([p.seq for p in pos], pa.int64()),
         pa.array([ts(s) for s in cols[2]], pa.timestamp("us", tz="UTC")), pa.array(cols[3], pa.int32()),
         pa.array(cols[4]), pa.array(cols[5], pa.string()), pa.array(cols[6], pa.string())], schema=SCHEMA)


def test_tally_counts_each_partition_and_compares_positions_as_integers():
    got = dict(tally(batch([
        ("s1", "5-9", 3, 1, False, None, "b"),
        ("s1", "5-10", 2, 2, True, None, "a"),  # "5-10" > "5-9" as integers, not as text
        ("s1", "4-0", 9, 1, False, "invalid_json", None),
        ("s2", "7-1", 1, 1, False, "gap", None),
        ("s2", "6-0", 8, 1, False, None, "c"),
    ]), "event_id"))
    s1, s2 = got["s1"], got["s2"]
    assert (s1.rows, s1.good, s1.bad, s1.gaps, s1.reclaimed, s1.again) == (3, 2, 1, 0, 1, 1)
    assert s1.pos == StreamId(5, 10) and s1.oldest == ts(2)  # the bad row's time does not count
    assert (s1.id_lo, s1.id_hi) == ("a", "b")
    assert (s2.rows, s2.good, s2.bad, s2.gaps) == (2, 1, 0, 1)
    assert s2.pos == StreamId(7, 1)  # gap markers move the position: they are reported, then passed


def test_source_times_outside_pythons_years_widen_the_window_instead_of_failing_the_task():
    # A stream id set by hand in microseconds (year ~55 000) or a time before year 1: Arrow and Delta
    # hold them, Python's datetime does not. The window start may only move earlier.
    year_55000 = 1_700_000_000_000_000 * 1_000  # µs of an id "1700000000000000-0"
    for micros, oldest in ((year_55000, datetime.max.replace(tzinfo=UTC)), (-70_000_000_000_000_000, None)):
        b = batch([("s", "1-0", 1, 1, False, None, "a"), ("s", "1-1", 2, 1, False, None, "b")])
        b = b.set_column(3, "_dd_source_ts", pa.array([micros, micros], pa.timestamp("us", tz="UTC")))
        (_, got), = tally(b, "event_id")
        assert got.oldest == oldest and got.good == 2


def test_write_and_report_stages_the_rows_and_reports_them(tmp_path):
    batches = [batch([("s1", "1-0", 1, 1, False, None, "x"), ("s1", "1-1", 2, 1, False, None, "y")]),
               batch([("s1", "2-0", 3, 1, False, None, "x")])]  # "x" again, in a later chunk
    reports = list(write_and_report(iter(batches), str(tmp_path / "staged"), SCHEMA, "event_id"))
    assert len(reports) == 1 and reports[0].schema == report_arrow_schema()
    rows = [SimpleNamespace(**r) for r in reports[0].to_pylist()]
    (path,) = {r.file for r in rows}
    assert pq.read_table(path).num_rows == 3
    assert [p.name for p in (tmp_path / "staged").iterdir()] == [path.rsplit("/", 1)[1]]  # no .tmp left behind

    staged = Staged.of(rows)
    assert staged.files == [path] and staged.positions == {"s1": "2-0"}
    stats = staged.stats()
    assert (stats.good, stats.distinct, stats.id_range, stats.bad) == (3, 2, ("x", "y"), 0)
    assert not stats.unique  # the repeated id is found across chunks (and across tasks: test below)


def test_a_task_without_rows_writes_nothing_and_reports_nothing(tmp_path):
    assert list(write_and_report(iter([batch([("s", "1-0", 1, 1, False, None, "a")]).slice(0, 0)]),
                                 str(tmp_path / "staged"), SCHEMA, "event_id")) == []
    assert not (tmp_path / "staged").exists()


def test_a_failing_task_leaves_no_file_a_reader_would_take(tmp_path):
    def failing():
        yield batch([("s", "1-0", 1, 1, False, None, "a")])
        raise RuntimeError("the executor died")

    with pytest.raises(RuntimeError):
        list(write_and_report(failing(), str(tmp_path), SCHEMA, "event_id"))
    assert [p.suffix for p in tmp_path.iterdir()] == [".tmp"]  # never named in a report, never renamed


def test_reports_of_several_tasks_sum_up(tmp_path):
    def report(rows, n):
        return [SimpleNamespace(**r) for r in next(write_and_report(
            iter([batch(rows)]), str(tmp_path / str(n)), SCHEMA, "event_id")).to_pylist()]

    one = report([("s1", "1-0", 5, 1, False, None, "m"), ("s2", "3-0", 4, 1, False, None, "n")], 1)
    two = report([("s1", "1-9", 6, 3, True, None, "o"), ("s1", "1-10", 2, 1, False, "empty", None)], 2)
    three = report([("s2", "2-0", 1, 1, False, None, "n")], 3)  # the id of task one, another stream
    staged = Staged.of(one + two + three)
    assert len(staged.files) == 3
    assert staged.positions == {"s1": "1-10", "s2": "3-0"}
    assert staged.partitions["s1"].rows == 3 and staged.partitions["s2"].rows == 2
    t = staged.total
    assert (t.rows, t.good, t.bad, t.reclaimed, t.again, t.oldest) == (5, 4, 1, 1, 1, ts(1))
    stats = staged.stats()
    assert (stats.good, stats.distinct, stats.id_range, stats.unique) == (4, 3, ("m", "o"), False)
    assert Staged.of(one + two).stats().unique


def test_an_upsert_batchs_changes_are_counted_by_the_staging_as_the_survey_would(tmp_path):
    """Deletes, truncates and changes without an order value among the good rows of each task, summed over the
    tasks: what spares an upsert batch its survey job (apply_upsert.Survey). A dead letter counts in none."""
    def changes(rows):
        b = batch([(part, pos, 1, 1, False, error, key) for part, pos, error, key, _, _ in rows])
        b = b.append_column("_dd_change", pa.array([r[4] for r in rows], pa.string()))
        return b.append_column("_dd_order", pa.array([r[5] for r in rows], pa.int64()))

    def report(rows, n):
        b = changes(rows)
        return [SimpleNamespace(**r) for r in next(write_and_report(
            iter([b]), str(tmp_path / str(n)), b.schema, "event_id")).to_pylist()]

    one = report([("s", "1-0", None, "k1", "upsert", 3), ("s", "1-1", None, "k1", "delete", None),
                  ("s", "1-2", "invalid_json", None, "delete", None)], 1)
    two = report([("s", "2-0", None, "k2", "delete", 4), ("s", "2-1", None, "t", "truncate", None),
                  ("s", "2-2", None, "k0", "upsert", None)], 2)
    got = Staged.of(one + two).stats()
    assert got.changes == (2, 1, 2) and got.id_range == ("k0", "t")
    assert Staged.of(one).stats().changes == (1, 0, 1)



def test_a_claim_here_on_threads_stages_a_file_per_task_and_sums_like_one_thread(tmp_path):
    from pyspark.sql.pandas.types import from_arrow_schema

    from deltadrain.run.stage import stage_here

    tasks = [{"stream": "s1", "n": 3}, {"stream": "s2", "n": 2}, {"stream": "s1", "n": 1}]

    def produce(batches, arrow_schema):  # one claim task's rows per task row, ids shared across tasks
        for b in batches:
            for t in b.to_pylist():
                yield batch([(t["stream"], f"{t['n']}-{i}", i, 1, False, None, f"id-{i}") for i in range(t["n"])])

    one = stage_here(tasks, produce, from_arrow_schema(SCHEMA), "event_id", str(tmp_path / "one"))
    many = stage_here(tasks, produce, from_arrow_schema(SCHEMA), "event_id", str(tmp_path / "many"), threads=2)
    assert len(one.files) == 1 and len(many.files) == 3 and many.schema == one.schema
    assert many.positions == one.positions == {"s1": "3-2", "s2": "2-1"}
    assert (many.total.rows, many.total.good, many.total.oldest) == (one.total.rows, one.total.good, ts(0)) == (
        6, 6, ts(0))
    assert many.stats() == one.stats() and not many.stats().unique  # "id-0" is in every task
    assert sorted(pq.read_table(many.files).column("event_id").to_pylist()) == sorted(
        pq.read_table(one.files).column("event_id").to_pylist())
