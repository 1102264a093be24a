"""Plain JSON states decoded column by column (`UpsertDecoder._columnwise`) must give exactly what `event` gives
message by message: the same key texts, changes, orders, typed fields and dead letters, row for row."""

import json
import random

import pyarrow as pa
import pytest

from deltadrain.formats.changes import UpsertDecoder, UpsertSpec
from tests.support.decode_cases import FIELDS, MAX, REQUIRED, TRICKY, TYPES, enc, good

KEYS = [("event_id",), ("quantity",), ("quantity", "customer")]


def decoders(key, order_by, delete_when) -> tuple[UpsertDecoder, UpsertDecoder]:
    spec = UpsertSpec("none", key, order_by, *(delete_when or (None, None)))
    types = {**TYPES, "_dd_order": TYPES.get(order_by, pa.int64())}

    def make() -> UpsertDecoder:
        return UpsertDecoder(spec, fields=FIELDS, id_field="", required=REQUIRED, max_bytes=MAX, types=types)

    columnwise, one_by_one = make(), make()
    one_by_one.columnwise = False
    assert columnwise.columnwise
    return columnwise, one_by_one


def rows_of(columns: dict) -> list[tuple]:
    return list(zip(*(col.to_pylist() for col in columns.values()), strict=True))


def batch(seed: int) -> tuple[list, list]:
    """Values and record keys: good states (some keys many times), TRICKY payloads, key texts that need
    escaping, tombstones with and without a key."""
    rng = random.Random(seed)
    values = [enc(good(i % 300, flag=rng.random() < 0.2, status=rng.choice(["paid", "void"]))) for i in range(1500)]
    values += TRICKY
    values += [enc(good(i, event_id=text)) for i, text in enumerate(['a"b', "back\\slash", "tab\tin", "caf\u00e9",
                                                                       "\u2028line", "emoji \U0001f600", "ctl\x7f"])]
    keys: list = [None] * len(values)
    values += [None] * 5
    keys += [b'{"event_id": "evt-000001"}', b"evt-000002", None, b"", b'{"quantity": 3, "customer": "c3"}']
    order = list(range(len(values)))
    rng.shuffle(order)
    return [values[i] for i in order], [keys[i] for i in order]


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("order_by,delete_when", [("position", None), ("quantity", ("flag", True)),
                                                  ("event_time", ("status", "void"))])
def test_columnwise_states_equal_the_message_by_message_decode(key, order_by, delete_when):
    columnwise, one_by_one = decoders(key, order_by, delete_when)
    for seed in range(3):
        values, keys = batch(seed)
        preset = {i: (f"pre-{i}", "max_retries", "stopped runs", values[i], None) for i in range(0, len(values), 97)}
        got = columnwise.columns(values, preset=preset, keys=keys)
        want = one_by_one.columns(values, preset=preset, keys=keys)
        assert list(got) == list(want)
        assert {n: c.type for n, c in got.items()} == {n: c.type for n, c in want.items()}
        for i, (a, b) in enumerate(zip(rows_of(got), rows_of(want), strict=True)):
            assert a == b, (i, values[i])


def test_the_columnwise_path_settles_the_plain_states_and_leaves_the_rest():
    """Not a vacuous equality: most good states take the column-wise path."""
    columnwise, _ = decoders(("event_id",), "quantity", None)
    values = [enc(good(i)) for i in range(200)] + [enc(good(1, event_id='a"b')), enc(good(2, customer=None))]
    slow: list[int] = []
    rows, _ = columnwise._columnwise(values, list(range(len(values))), slow)
    assert len(rows) == 200 and sorted(slow) == [200, 201]
    assert json.loads(columnwise.columns(values)["_dd_key"][0].as_py()) == {"event_id": "evt-000000"}


def test_other_payloads_are_decoded_message_by_message():
    spec = UpsertSpec("debezium", ("event_id",), "position")
    assert not UpsertDecoder(spec, fields=FIELDS, id_field="", required=[], max_bytes=MAX, types=TYPES).columnwise
    spec = UpsertSpec("none", ("flag",), "position")  # a boolean key column
    assert not UpsertDecoder(spec, fields=FIELDS, id_field="", required=[], max_bytes=MAX, types=TYPES).columnwise
