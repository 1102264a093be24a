"""The protocol's pure decisions: positions, decoding, claim planning, compare-and-set outcomes."""

import json
import re

import pytest

from deltadrain.formats.decode import decode
from deltadrain.positions import StreamId, max_position, merge_positions
from deltadrain.run.outcome import Outcome, decide
from deltadrain.sources.valkey.claim import TASK_QUOTA, allocate, plan

FIELDS = {"event_id": "string", "amount": "double", "quantity": "long", "event_time": "timestamp",
          "ok": "boolean"}


def dec(obj, **kw):
    data = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    opts = {"fields": FIELDS, "id_field": "event_id", "required": ["event_id", "amount"], "max_bytes": 1000}
    return decode(data, **{**opts, **kw})


def test_stream_ids_compare_as_integer_pairs_not_strings():
    assert "5-10" < "5-9"  # the bug this guards against
    assert StreamId.parse("5-10") > StreamId.parse("5-9")
    assert StreamId.parse("10-0") > StreamId.parse("9-99")
    assert max_position(["5-9", "5-10", "4-100"]) == "5-10"
    assert merge_positions({"a": "5-9", "b": "1-0"}, {"a": "5-10", "c": "2-2"}) == {"a": "5-10", "b": "1-0", "c": "2-2"}
    assert merge_positions({"a": "5-10"}, {"a": "5-9"}) == {"a": "5-10"}
    with pytest.raises(ValueError):
        StreamId.parse("5-x")


def test_decode_good_message():
    got = dec({"event_id": "e1", "amount": 3, "quantity": 2, "event_time": "2026-01-01T00:00:00Z", "ok": True})
    assert got.error is None and got.message_id == "e1"
    assert got.values[1] == 3.0 and got.values[2] == 2 and got.values[3].year == 2026


@pytest.mark.parametrize("data,kind,words", [
    (b"", "empty", "empty payload"),
    (b"x" * 1001, "oversized", "1001 bytes exceeds"),
    (b'{"event_id": "\xff"}', "invalid_utf8", "not valid UTF-8"),
    (b'{"event_id": "e1", ', "invalid_json", "not valid JSON"),
    (b"[1, 2]", "not_an_object", "JSON list"),
    ({"amount": 1}, "missing_id", "'event_id' is missing"),
    ({"event_id": None, "amount": 1}, "missing_id", "is null"),
    ({"event_id": "", "amount": 1}, "missing_id", "invalid"),
    ({"event_id": "e", "amount": "ten"}, "schema", "'amount' should be double"),
    ({"event_id": "e", "amount": 1, "quantity": 1.5}, "schema", "'quantity' should be long"),
    ({"event_id": "e", "amount": 1, "ok": "yes"}, "schema", "'ok' should be boolean"),
    ({"event_id": "e", "amount": 1, "event_time": "yesterday"}, "schema", "'event_time' should be timestamp"),
    ({"event_id": "e"}, "schema", "required field 'amount' is missing"),
    ({"event_id": "e", "amount": True}, "schema", "should be double"),
])
def test_decode_bad_input_is_data_with_a_reason(data, kind, words):
    got = dec(data)
    assert got.values is None and got.error_type == kind and words in got.error


def test_integer_ids_become_strings_and_fallback_ids_apply_only_when_absent():
    assert dec({"event_id": 42, "amount": 1}).message_id == "42"
    assert dec({"amount": 1}, fallback_id="t-0-7").message_id == "t-0-7"
    assert dec({"event_id": None, "amount": 1}, fallback_id="t-0-7").message_id == "t-0-7"
    assert dec({"event_id": [1], "amount": 1}, fallback_id="t-0-7").error_type == "missing_id"


def test_allocate_is_fair_bounded_and_never_exceeds_backlog():
    assert allocate(100, {"a": 10, "b": 1000, "c": 0, "d": 1000}) == {"a": 10, "b": 45, "c": 0, "d": 45}
    assert allocate(10, {"a": 3, "b": 3}) == {"a": 3, "b": 3}
    assert sum(allocate(7, {"a": 10, "b": 10, "c": 10}).values()) == 7
    assert allocate(5, {}) == {}


def test_plan_splits_big_quotas_into_tasks_and_reclaims_once_per_stream():
    tasks = plan({"a": 2 * TASK_QUOTA + 5, "b": 3})
    assert [(t.stream, t.quota, t.reclaim) for t in tasks] == [
        ("a", TASK_QUOTA, True), ("a", TASK_QUOTA, False), ("a", 5, False), ("b", 3, True)]
    assert plan({"a": 0}) == []


@pytest.mark.parametrize("expected,observed,ours,now,outcome", [
    (4, 5, True, True, Outcome.COMMITTED),
    (4, 5, True, False, Outcome.ALREADY_COMMITTED),
    (4, 5, False, False, Outcome.AHEAD),  # a neighbour wrote batch 5
    (4, 7, False, False, Outcome.AHEAD),  # a neighbour is far ahead
    (4, 6, True, True, Outcome.COMMITTED),  # ours landed as 5 and someone went on
    (4, 4, False, False, Outcome.MISMATCH),  # nothing landed: our write was refused as stale
    (4, 2, False, False, Outcome.MISMATCH),  # the table went backwards (restore)
    (0, None, False, False, Outcome.MISMATCH),  # table replaced by one without our txn
])
def test_compare_and_set_outcomes(expected, observed, ours, now, outcome):
    assert decide(expected, observed, ours, now) == outcome


@pytest.mark.parametrize("expected,observed,outcome", [
    (4, 4, Outcome.CONFLICT),  # writers that did not move the batch kept winning: retry later
    (0, None, Outcome.CONFLICT),  # the same before the first batch
    (4, 5, Outcome.AHEAD),  # a neighbour's batch won the conflict
    (4, 2, Outcome.MISMATCH),  # conflicts do not explain a table that went backwards
])
def test_a_commit_that_lost_every_retry_to_conflicts(expected, observed, outcome):
    assert decide(expected, observed, False, False, conflicted=True) == outcome


def test_a_commits_commit_info_gives_the_checkpoint_metadata_and_its_time():
    from datetime import UTC, datetime

    from deltadrain.lake.delta import commit_info

    meta = {"pipeline": "orders", "batch": 7, "positions": {"s:0": "5-10"}, "run_id": "r1"}
    info = {"timestamp": 1_795_394_389_275, "operation": "MERGE", "userMetadata": json.dumps(meta),
            "operationMetrics": {"numTargetRowsInserted": "3"}}
    got = commit_info(info)
    assert got == {"operation": "MERGE", "metrics": {"numTargetRowsInserted": "3"}, "meta": meta,
                   "timestamp": datetime.fromtimestamp(1_795_394_389.275, UTC)}
    # A table with in-commit timestamps: that is the commit's time. Metadata that is not ours: no meta.
    got = commit_info({**info, "inCommitTimestamp": 1_000, "userMetadata": "not json"})
    assert got["timestamp"] == datetime.fromtimestamp(1, UTC) and got["meta"] is None
    assert commit_info({"operation": "WRITE"}) == {"operation": "WRITE", "metrics": {}, "meta": None, "timestamp": None}


def test_an_unparsed_xreadgroup_reply_gives_positions_and_payloads():
    from deltadrain.sources.valkey.claim import Entries, payload_of

    assert payload_of([b"data", b"{}"], b"data") == b"{}"
    assert payload_of([b"other", b"x", b"data", b"{}"], b"data") == b"{}"  # not the first field
    assert payload_of([b"data", b"x"], b"other") is None
    assert payload_of([], b"data") is None and payload_of(None, b"data") is None
    chunk = Entries.unparsed("s", [[b"5-9", [b"data", b"a"]], [b"5-10", [b"x", b"1"]]])
    assert (chunk.positions, chunk.data, chunk.attempts, chunk.reclaimed) == (
        ["5-9", "5-10"], [b"a", None], [1, 1], [False, False])


def _claim_schema_and_decoder():
    """A claim schema with an `event_id` payload field, and its decoder."""
    import pyarrow as pa

    from deltadrain.formats.decode import BatchDecoder

    schema = pa.schema([("_dd_partition", pa.string()), ("_dd_position", pa.string()), ("_dd_pos_hi", pa.int64()),
                        ("_dd_pos_lo", pa.int64()), ("_dd_source_ts", pa.timestamp("us", tz="UTC")),
                        ("_dd_attempts", pa.int32()), ("_dd_reclaimed", pa.bool_()), ("_dd_message_id", pa.string()),
                        ("_dd_error_type", pa.string()), ("_dd_error", pa.string()), ("_dd_original", pa.binary()),
                        ("_dd_first_failure_at", pa.timestamp("us", tz="UTC")), ("event_id", pa.string())])
    decoder = BatchDecoder(fields={"event_id": "string"}, id_field="event_id", required=[], max_bytes=100,
                           types={"event_id": pa.string()})
    return schema, decoder


def test_claim_record_batches_split_positions_into_integer_pairs():
    from deltadrain.sources.valkey.claim import Entries, record_batch

    schema, decoder = _claim_schema_and_decoder()
    chunk = Entries.unparsed("s", [[b"1795472338020-9", [b"data", b'{"event_id": "a"}']],
                                   [b"1795472338020-10", [b"data", b"{"]]])
    got = record_batch(chunk, decoder, schema).to_pydict()
    assert got["_dd_pos_hi"] == [1795472338020, 1795472338020] and got["_dd_pos_lo"] == [9, 10]
    assert [t.timestamp() for t in got["_dd_source_ts"]] == [1795472338.02, 1795472338.02]
    assert got["event_id"] == ["a", None] and got["_dd_error_type"] == [None, "invalid_json"]


def test_a_replay_that_would_trim_undrained_entries_past_maxlen_is_refused_per_stream():
    from deltadrain.sources.valkey.replay import over_maxlen

    assert over_maxlen(None, {"s0": 10**6}, {"s0": 10**6}) == []  # no MAXLEN: nothing is trimmed
    assert over_maxlen(100, {"s0": 60, "s1": 60}, {"s0": 40, "s1": 41}) == [
        "s1: 60 copies + 41 entries not yet drained > maxlen 100"]
    assert over_maxlen(100, {"s0": 101}, {}) == ["s0: 101 copies + 0 entries not yet drained > maxlen 100"]


def test_a_constraint_that_refuses_most_of_a_batch_refuses_the_data_not_a_few_messages():
    from deltadrain.run.rows import MAX_REFUSED, REFUSED_BATCH_MIN, refuses_the_data

    assert not refuses_the_data(4, 41)
    assert not refuses_the_data(REFUSED_BATCH_MIN - 1, REFUSED_BATCH_MIN - 1)  # a small batch of bad messages
    assert refuses_the_data(REFUSED_BATCH_MIN // 2 + 1, REFUSED_BATCH_MIN)
    assert not refuses_the_data(REFUSED_BATCH_MIN // 2, REFUSED_BATCH_MIN)
    assert refuses_the_data(MAX_REFUSED + 1, 100 * MAX_REFUSED)
    assert not refuses_the_data(MAX_REFUSED, 100 * MAX_REFUSED)


def test_a_stream_id_beyond_what_the_position_columns_hold_fails_its_claim_naming_the_entry_and_the_fix():
    """Valkey ids go up to 2^64 - 1 in both halves (explicit XADD ids): the claim says which entry,
    not a bare cast error, every run."""
    from deltadrain.sources.valkey.claim import MAX_MS, MAX_SEQ, Entries, record_batch, unstorable_id

    schema, decoder = _claim_schema_and_decoder()
    ok = f"{MAX_MS}-{MAX_SEQ}"
    got = record_batch(Entries.unparsed("s", [[ok.encode(), [b"data", b'{"event_id": "a"}']]]), decoder, schema)
    assert got.to_pydict()["_dd_pos_hi"] == [MAX_MS] and got.to_pydict()["_dd_pos_lo"] == [MAX_SEQ]
    for bad in (f"{MAX_MS + 1}-0", f"{2**64 - 1}-0", f"5-{MAX_SEQ + 1}", f"{2**64 - 1}-{2**64 - 1}"):
        assert unstorable_id(["1-1", bad, "2-2"]) == bad
        chunk = Entries.unparsed("orders:{0}", [[b"1-1", [b"data", b"{}"]], [bad.encode(), [b"data", b"{}"]]])
        with pytest.raises(ValueError, match=re.escape(f"stream 'orders:{{0}}': entry {bad} has an id deltadrain "
                                                       "cannot store") + r" .* explicit XADD id.*XADD \*"):
            record_batch(chunk, decoder, schema)
    assert unstorable_id(["1-1", ok]) is None


def test_a_reprocess_hands_the_drained_batches_of_the_rows_it_rewrote_to_the_quality_check():
    from deltadrain.heal.replay import rewritten_batches

    picked = [{"_dd_partition": "s:{0}", "_dd_position": f"1-{i}", "_dd_batch": batch}
              for i, batch in enumerate([3, 3, 5, 0, 8, None])]
    # Batch 0 (a backfill's rows) and a row without one are in no drained batch; a skipped row was not rewritten.
    skipped = [{"partition": "s:{0}", "position": "1-4", "reason": "no longer retained by the source"}]
    assert rewritten_batches(picked, skipped) == [3, 5]
    assert rewritten_batches(picked, []) == [3, 5, 8]
    assert rewritten_batches([], []) == []


def test_the_transform_filtered_the_messages_it_kept_no_row_for_never_below_zero():
    from deltadrain.run.rows import filtered_out

    assert filtered_out(100, 88) == 12
    assert filtered_out(100, 100) == 0
    assert filtered_out(100, 130) == 0  # an explode that filtered nothing (or less than it added)
    assert filtered_out(0, 0) == 0
