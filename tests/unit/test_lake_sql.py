"""The SQL text deltadrain writes Delta with (lake.sql_literal, create_table_sql, commit.merge_condition,
commit.dedup_window_start): every value stays a literal, whatever it holds, and the window's start holds
still over many batches. tests/integration/test_spark_connect.py runs such text on a real server."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from deltadrain.lake.delta import conflict_line, create_table_sql, is_conflict, sql_literal, table_ref
from deltadrain.run.commit import dedup_window_start, merge_condition


@pytest.mark.parametrize(("value", "text"), [
    ("evt-1", "'evt-1'"),
    ("it's", "'it\\'s'"),
    ("back\\slash", "'back\\\\slash'"),
    ("' OR 1=1 --", "'\\' OR 1=1 --'"),
    ("line\nbreak\x00", "'line\\u000abreak\\u0000'"),
    ("zürich ✓", "'zürich ✓'"),
    (7, "7"),
    (True, "TRUE"),
    (None, "NULL"),
    (datetime(2026, 5, 1, 12, 0, 1, 5, tzinfo=timezone(timedelta(hours=2))), "TIMESTAMP '2026-05-01 10:00:01.000005'"),
    (datetime(2026, 5, 1, tzinfo=UTC), "TIMESTAMP '2026-05-01 00:00:00'"),
])
def test_a_value_stands_in_sql_as_one_literal(value, text):
    assert sql_literal(value) == text


def test_a_literal_cannot_end_early():
    """Unescaped, a quote would end the literal: every quote in the text is escaped, and the
    backslashes before it come in pairs (each escapes the next)."""
    for nasty in ("'", "\\'", "\\\\'", "a'b\\", "'; DROP TABLE t; --", "\\"):
        body = sql_literal(nasty)[1:-1]
        i = 0
        while i < len(body):
            if body[i] == "\\":
                i += 2
                continue
            assert body[i] != "'", (nasty, body)
            i += 1


def test_no_sql_literal_for_what_it_does_not_know():
    with pytest.raises(TypeError):
        sql_literal(1.5)


def test_the_merge_condition_names_the_id_and_keeps_the_range_as_literals():
    cond = merge_condition("event`id", datetime(2026, 5, 1, tzinfo=UTC), ("a'", "z"))
    assert cond == ("t.`event``id` = s.`event``id` AND t._dd_source_ts >= TIMESTAMP '2026-05-01 00:00:00' "
                    "AND t.`event``id` >= 'a\\'' AND t.`event``id` <= 'z'")
    assert merge_condition("id", None, target="q") == "q.`id` = s.`id`"


@pytest.mark.parametrize("window", [timedelta(hours=1), timedelta(days=7), timedelta(seconds=5), timedelta(minutes=7)])
def test_the_window_starts_a_little_earlier_and_holds_still_for_many_batches(window):
    # Spark compiles the start into its generated code: it must not move with every batch.
    oldest = datetime(2026, 11, 29, 12, 7, 33, 123456, tzinfo=UTC)
    starts = {dedup_window_start(oldest + timedelta(milliseconds=i * window.total_seconds()), window)
              for i in range(100)}  # batches spread over a tenth of the window
    assert len(starts) <= 2
    for i in range(100):
        later = oldest + timedelta(milliseconds=i * window.total_seconds())
        start = dedup_window_start(later, window)
        # Never later than the window asks (an id inside it is always caught), at most an eighth earlier.
        assert later - window - window / 8 < start <= later - window


def test_a_window_of_nothing_starts_at_the_oldest_message():
    oldest = datetime(2026, 11, 29, 12, 7, 33, 123456, tzinfo=UTC)
    assert dedup_window_start(oldest, timedelta(0)) == oldest
    naive = datetime(2026, 11, 29, 12, 7, 33, 123456)
    assert dedup_window_start(naive, timedelta(days=7)) == datetime(2026, 11, 22, 12, 0)


def test_a_table_is_created_by_path_with_its_layout_and_properties():
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    schema = StructType([StructField("id", StringType(), False), StructField("n", LongType())])
    text = create_table_sql("/lake/a`b", schema, ["n"], [], {"delta.appendOnly": "true"})
    assert text == ("CREATE TABLE IF NOT EXISTS delta.`/lake/a``b` (`id` string NOT NULL, `n` bigint) USING delta "
                    "PARTITIONED BY (`n`) TBLPROPERTIES ('delta.appendOnly' = 'true')")
    assert table_ref("/x") == "delta.`/x`"


def test_a_lost_commit_race_is_named_by_delta_s_line_not_py4j_s():
    class Py4JJavaError(Exception):
        pass

    local = Py4JJavaError("An error occurred while calling o80.sql.\n: io.delta.exceptions."
                          "ConcurrentTransactionException: [DELTA_CONCURRENT_TRANSACTION] This error occurs when "
                          "multiple streaming queries are using the same checkpoint\n\tat io.delta.Foo(Foo.scala:1)")
    assert is_conflict(local)
    assert conflict_line(local) == (": io.delta.exceptions.ConcurrentTransactionException: [DELTA_CONCURRENT_TRANSACTION]"
                                    " This error occurs when multiple streaming queries are using the same checkpoint")
    connect = RuntimeError("[DELTA_CONCURRENT_APPEND] Files were added by a concurrent update.")
    assert conflict_line(connect) == "RuntimeError: [DELTA_CONCURRENT_APPEND] Files were added by a concurrent update."
    assert conflict_line(ValueError("x" * 400 + "\nmore")) == ("ValueError: " + "x" * 400)[:300]
