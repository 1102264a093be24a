"""Upsert mode's decoding (deltadrain.formats.changes) and the commit's pure parts (deltadrain.run.upsert, deltadrain.run.apply_upsert):
keys as one text of typed values, tombstones, delete_when, Debezium's envelope and logical types, dead letters
with their reasons, truncates, and which events a batch's decisions keep."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pyarrow as pa
import pytest

from deltadrain.formats.changes import DELETE, TRUNCATE, UPSERT, UpsertDecoder, UpsertSpec
from deltadrain.run.apply_upsert import key_ranges, merge_clauses, merge_condition
from deltadrain.run.upsert import Effect, Order, Position, decide_batch, events_of, state_of

FIELDS = {"id": "long", "name": "string", "version": "long", "gone": "boolean", "price": "decimal(18,2)",
          "at": "timestamp"}
TYPES = {"id": pa.int64(), "name": pa.string(), "version": pa.int64(), "gone": pa.bool_(),
         "price": pa.decimal128(18, 2), "at": pa.timestamp("us", tz="UTC"), "_dd_order": pa.int64()}


def decoder(envelope="none", key=("id",), order_by="position", delete_when=None) -> UpsertDecoder:
    spec = UpsertSpec(envelope, tuple(key), order_by, *(delete_when or (None, None)))
    return UpsertDecoder(spec, fields=FIELDS, id_field="", required=["name"], max_bytes=10_000, types=TYPES)


def j(obj) -> bytes:
    return json.dumps(obj).encode()


def test_a_state_a_tombstone_and_a_json_key_give_one_key_text_of_the_typed_values():
    d = decoder(order_by="version", delete_when=("gone", True))
    state = d.event(j({"id": 7, "name": "x", "version": 3}))
    assert (state.key, state.change, state.order) == ('{"id":7}', UPSERT, 3)
    for key in (b"7", b'{"id": 7}', j({"schema": {"type": "struct"}, "payload": {"id": 7}})):
        gone = d.event(None, key)
        assert (gone.key, gone.change, gone.order) == ('{"id":7}', DELETE, None)
    flagged = d.event(j({"id": 7, "name": "x", "version": 4, "gone": True}))
    assert flagged.change == DELETE and flagged.order == 4
    assert d.event(j({"id": 7, "name": "x", "gone": False})).change == UPSERT


@pytest.mark.parametrize(("value", "key", "kind", "says"), [
    (j({"name": "x"}), None, "missing_key", "key column id missing"),
    (j({"id": None, "name": "x"}), None, "missing_key", "key column id null"),
    (None, None, "missing_key", "has no record key"),
    (None, b'{"other": 1}', "missing_key", "holds not all key columns"),
    (j({"id": "seven", "name": "x"}), None, "schema", "field 'id' should be long"),
    (j({"id": 7}), None, "schema", "required field 'name' is missing"),
    (b"not json", None, "invalid_json", "not valid JSON"),
    (b"", None, "empty", "empty payload"),
])
def test_bad_states_are_dead_letters_with_their_reason(value, key, kind, says):
    got = decoder().event(value, key).decoded
    assert got.values is None and got.error_type == kind and says in (got.error or "")


def wrapped(op: str, after: dict | None, before: dict | None = None, lsn: int = 100) -> bytes:
    schema = {"type": "struct", "fields": [
        {"field": "before", "type": "struct", "fields": []},
        {"field": "after", "type": "struct", "fields": [
            {"field": "at", "type": "int64", "name": "io.debezium.time.MicroTimestamp"},
            {"field": "price", "type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
             "parameters": {"scale": "2"}}]}]}
    payload = {"op": op, "before": before, "after": after, "ts_ms": 1,
               "source": {"connector": "postgresql", "db": "d", "schema": "public", "table": "t", "lsn": lsn}}
    return j({"schema": schema, "payload": payload})


def test_debezium_events_upsert_delete_and_turn_logical_types_into_plain_values():
    d = decoder("debezium", key=(), order_by="source.lsn")
    key = j({"schema": {"type": "struct"}, "payload": {"id": 5}})
    price = base64.b64encode((1250).to_bytes(2, "big", signed=True)).decode()
    micros = 1_700_000_000_123_456
    up = d.event(wrapped("u", {"id": 5, "name": "n", "at": micros, "price": price}), key)
    assert (up.key, up.change, up.order) == ('{"id":5}', UPSERT, 100)
    row = dict(zip(["_key", *FIELDS], up.decoded.values, strict=True))
    assert row["price"] == Decimal("12.50")
    assert row["at"] == datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=micros)
    assert d.event(j({"op": "c", "after": {"id": 5, "name": "n", "price": "3.10"}}), key).decoded.values[5] == \
        Decimal("3.10")  # decimal.handling.mode string, without the wrapper
    gone = d.event(wrapped("d", None, {"id": 5}, lsn=200), key)
    assert (gone.key, gone.change, gone.order) == ('{"id":5}', DELETE, 200)
    tomb = d.event(None, key)
    assert (tomb.key, tomb.change, tomb.order) == ('{"id":5}', DELETE, None)
    truncate = d.event(j({"op": "t", "source": {"db": "d", "schema": "public", "table": "t", "lsn": 300}}), None)
    assert truncate.change == TRUNCATE and truncate.key == "d.public.t at lsn 300"


@pytest.mark.parametrize(("value", "key", "kind"), [
    (j({"op": "c", "after": {"id": 5, "name": "n"}}), None, "missing_key"),
    (j({"op": "x", "after": {"id": 5}}), b'{"id": 5}', "unknown_op"),
    (j({"after": {"id": 5}}), b'{"id": 5}', "invalid_envelope"),
    (j({"op": "u", "after": None}), b'{"id": 5}', "missing_after"),
    (j({"op": "c", "after": {"id": 5, "name": "n"}}), b'{"id": 5, "other": 1}', "missing_key"),
])
def test_bad_change_events_are_dead_letters_naming_their_key_when_it_is_known(value, key, kind):
    got = decoder("debezium", key=()).event(value, key).decoded
    assert got.values is None and got.error_type == kind
    if kind in ("unknown_op", "invalid_envelope", "missing_after"):
        assert got.message_id == '{"id":5}'  # a replayed copy carries it back as its record key


def test_columns_keep_one_row_per_record_with_the_upsert_columns():
    d = decoder(order_by="version")
    cols = d.columns([j({"id": 1, "name": "a", "version": 2}), None, b"bad"], keys=[b"1", b"1", b"2"])
    assert cols["_dd_key"].to_pylist() == ['{"id":1}', '{"id":1}', None]
    assert cols["_dd_change"].to_pylist() == [UPSERT, DELETE, None]
    assert cols["_dd_order"].to_pylist() == [2, None, None]
    assert cols["_dd_error_type"].to_pylist() == [None, None, "invalid_json"]
    assert cols["_dd_message_id"].to_pylist()[:2] == ['{"id":1}', '{"id":1}']


def test_a_truncate_drops_what_came_before_it_in_its_partition_and_the_rest_is_decided():
    rows = [("a", UPSERT, None, "0", 1, 0), ("d.public.t", TRUNCATE, None, "0", 2, 0), ("b", UPSERT, None, "0", 3, 0),
            ("c", UPSERT, None, "1", 1, 0)]
    events, truncated = events_of(rows)
    assert truncated == {"0": Position("0", 2, 0)}
    assert [(e.key, e.position.partition) for e in events] == [("b", "0"), ("c", "1")]
    assert "WHEN NOT MATCHED BY SOURCE THEN DELETE" in merge_clauses(["_dd_key", "x", "_dd_effect"], True)
    plain = merge_clauses(["_dd_key", "x", "_dd_effect"], False)
    assert "NOT MATCHED BY SOURCE" not in plain and "INSERT (`_dd_key`, `x`)" in plain


def test_the_newest_remembered_delete_is_the_keys_and_blocks_an_older_upsert():
    at = datetime(2026, 1, 1, tzinfo=UTC)
    old, new = Order(None, Position("0", 5, 0)), Order(None, Position("0", 9, 0))
    state = state_of(None, [(old, at), (new, at + timedelta(seconds=1))])
    assert state.deleted == new and state.deleted_at == at + timedelta(seconds=1)
    events, _ = events_of([("k", UPSERT, None, "0", 7, 0)])
    decided = decide_batch(events, {"k": state}, now=at, window=timedelta(days=7))
    assert decided["k"].effect == Effect.NOTHING


def test_a_batchs_keys_split_into_ranges_at_their_widest_gaps_in_text_order():
    """Recent ids and new ids are two clusters; as JSON text the new ones sort before the recent ones, far
    apart from them, so one range from the lowest to the highest key would cover nearly every file."""
    recent = [f'{{"id":{i}}}' for i in range(9_990_000, 9_990_050)]
    new = [f'{{"id":{i}}}' for i in range(10_000_000, 10_000_020)]
    keys = sorted([*recent, *new, '{"id":5}'])
    assert key_ranges(keys, 3) == [(new[0], new[-1]), ('{"id":5}', '{"id":5}'), (recent[0], recent[-1])]
    two = key_ranges(keys, 2)
    assert two[0] == (new[0], new[-1]) and two[1] == ('{"id":5}', recent[-1])
    assert key_ranges(keys, 1) == [(keys[0], keys[-1])]
    assert key_ranges([], 4) == [] and key_ranges(["k"], 4) == [("k", "k")]
    assert all(any(lo <= k <= hi for lo, hi in key_ranges(keys, n)) for n in (1, 2, 5, 80) for k in keys)
    on = merge_condition(("a", "z"), False, two)
    assert on.startswith("t._dd_key = s._dd_key AND ((t._dd_key >= ") and ") OR (" in on
    assert merge_condition(("a", "z"), True, two) == "t._dd_key = s._dd_key"
