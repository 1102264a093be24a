"""The column-wise decoder must say exactly what `decode` says, message by message."""

import random
from decimal import Decimal

import pyarrow as pa

from deltadrain.formats.decode import BatchDecoder, decode
from tests.support.decode_cases import FIELDS, MAX, REQUIRED, TRICKY, TYPES, enc, good


def expected(value, fallback_id=None, message_id=None) -> tuple:
    got = decode(value, fields=FIELDS, id_field="event_id", required=REQUIRED, max_bytes=MAX,
                 fallback_id=fallback_id, message_id=message_id)
    if got.values is None:
        return (got.message_id or message_id, got.error_type, got.error, value, None, *([None] * len(FIELDS)))
    return (got.message_id, None, None, None, None, *got.values)


def rows_of(columns: dict) -> list[tuple]:
    names = ["_dd_message_id", "_dd_error_type", "_dd_error", "_dd_original", "_dd_first_failure_at", *FIELDS]
    return list(zip(*(columns[n].to_pylist() for n in names), strict=True))


def decoder() -> BatchDecoder:
    return BatchDecoder(fields=FIELDS, id_field="event_id", required=REQUIRED, max_bytes=MAX, types=TYPES)


def check(values, **kw) -> None:
    out = decoder().columns(values, **kw)
    assert all(len(col) == len(values) for col in out.values())
    fb, ids = kw.get("fallback_ids"), kw.get("message_ids")
    for i, (got, value) in enumerate(zip(rows_of(out), values, strict=True)):
        assert got == expected(value, fb[i] if fb else None, ids[i] if ids else None), (i, value)


def test_every_tricky_payload_alone_and_among_good_ones():
    for value in TRICKY:
        check([value])
    rng = random.Random(3)
    mixed = [enc(good(i)) for i in range(2000)]
    for value in TRICKY:
        mixed.insert(rng.randrange(len(mixed)), value)
    check(mixed)


def test_fallback_and_external_ids():
    values = [enc(good(i)) for i in range(300)] + TRICKY
    random.Random(5).shuffle(values)
    fallback = [f"topic-0-{i}" for i in range(len(values))]
    check(values, fallback_ids=fallback)
    external = [f"key-{i}" if i % 3 else None for i in range(len(values))]
    check(values, fallback_ids=fallback, message_ids=external)


def test_an_empty_list_gives_empty_columns():
    out = decoder().columns([])
    assert set(out) == {"_dd_message_id", "_dd_error_type", "_dd_error", "_dd_original", "_dd_first_failure_at",
                        *FIELDS} and all(len(col) == 0 for col in out.values())


def test_preset_rows_keep_their_verdict():
    values = [enc(good(i)) for i in range(20)]
    preset = {3: ("m3", "max_retries", "delivered 5 times", values[3], None), 7: (None, "gap", "deleted", None, None)}
    rows = rows_of(decoder().columns(values, preset=preset))
    assert rows[3][:4] == ("m3", "max_retries", "delivered 5 times", values[3])
    assert rows[7][:3] == (None, "gap", "deleted") and rows[7][5:] == (None,) * len(FIELDS)
    assert rows[4] == expected(values[4])


def test_other_schemas_are_decoded_message_by_message():
    d = BatchDecoder(fields={"event_id": "string", "price": "decimal(18,2)"}, id_field="event_id", required=[],
                     max_bytes=MAX, types={"event_id": pa.string(), "price": pa.decimal128(18, 2)})
    assert not d.fast
    out = d.columns([b'{"event_id": "a", "price": 1.5}', b"{"])
    assert out["price"].to_pylist()[0] == Decimal("1.5")
    assert out["_dd_error_type"].to_pylist() == [None, "invalid_json"]


def test_lone_surrogates_and_deep_nesting_have_one_verdict_on_both_paths():
    # Arrow refuses a lone surrogate escape and follows any nesting; Python's parser takes the escape and
    # stops near 1 000 levels. `decode` refuses both, and the fast path leaves both to it.
    def deep(depth: int, i: int) -> bytes:
        return enc(good(i))[:-1] + b', "deep": ' + b"[" * depth + b"]" * depth + b"}"

    values = [enc(good(i)) for i in range(100)] + [
        enc(good(1, customer="c\ud83d")), enc(good(2, event_id="e\udc00")), enc(good(3, note="\ud83d!")),
        enc(good(4, customer="\ud83d\ude00")), deep(300, 5), deep(1_500, 6), deep(3_000, 7)]
    decoder_ = BatchDecoder(fields=FIELDS, id_field="event_id", required=REQUIRED, max_bytes=10_000, types=TYPES)
    want = dict.fromkeys(values, None) | dict.fromkeys([values[i] for i in (100, 101, 102, 105, 106)], "invalid_json")
    for batch in (values, values[100:], values[::-1]):
        out = rows_of(decoder_.columns(batch))
        assert [row[1] for row in out] == [want[v] for v in batch]
        reasons = {value: row[2] for value, row in zip(batch, out, strict=True)}
        assert "lone UTF-16 surrogate (\\ud83d)" in reasons[values[100]] and "nested deeper" in reasons[values[105]]


def test_decimals_keep_every_digit_and_refuse_what_the_column_cannot_hold():
    d = BatchDecoder(fields={"event_id": "string", "price": "decimal(18,2)", "big": "decimal(38,9)"},
                     id_field="event_id", required=[], max_bytes=MAX,
                     types={"event_id": pa.string(), "price": pa.decimal128(18, 2), "big": pa.decimal128(38, 9)})
    ok = [b'{"event_id": "a", "price": 9999999999999999.99}', b'{"event_id": "b", "price": "1.000", "big": 1e2}',
          b'{"event_id": "c", "big": 12345678901234567890123456789.123456789}']
    bad = [b'{"event_id": "d", "price": 19.999}', b'{"event_id": "e", "price": 1e30}', b'{"event_id": "f", "price": NaN}',
           b'{"event_id": "g", "price": "Infinity"}', b'{"event_id": "h", "big": 1234567890123456789012345678901.5}']
    out = d.columns(ok + bad)
    assert out["price"].to_pylist()[:2] == [Decimal("9999999999999999.99"), Decimal("1.00")]
    assert out["big"].to_pylist()[1:3] == [Decimal("100"), Decimal("12345678901234567890123456789.123456789")]
    assert out["_dd_error_type"].to_pylist() == [None] * 3 + ["schema"] * 5
    assert out["_dd_error"].to_pylist()[3] == "field 'price' should be decimal(18,2), got 19.999"


def test_a_float_field_refuses_what_32_bits_cannot_hold_instead_of_storing_infinity():
    d = BatchDecoder(fields={"event_id": "string", "f": "float"}, id_field="event_id", required=[], max_bytes=MAX,
                     types={"event_id": pa.string(), "f": pa.float32()})
    out = d.columns([b'{"event_id": "a", "f": 3.5}', b'{"event_id": "b", "f": -3.4e38}', b'{"event_id": "c", "f": 1e300}',
                     b'{"event_id": "d", "f": -3.5e38}', b'{"event_id": "e", "f": 1e-50}'])
    assert out["f"].to_pylist()[:2] == [3.5, pa.scalar(-3.4e38, pa.float32()).as_py()]
    assert out["f"].to_pylist()[4] == 0.0  # too small for 32 bits rounds to 0, as any float rounds
    assert out["_dd_error_type"].to_pylist() == [None, None, "schema", "schema", None]
    assert out["_dd_error"].to_pylist()[2] == "field 'f' should be float, got 1E+300"


def test_a_payload_decode_cannot_handle_is_a_dead_letter_not_a_failed_task(monkeypatch):
    d = BatchDecoder(fields={"event_id": "string", "price": "decimal(18,2)"}, id_field="event_id", required=[],
                     max_bytes=MAX, types={"event_id": pa.string(), "price": pa.decimal128(18, 2)})
    real = d.one
    monkeypatch.setattr(d, "one", lambda value, *a: (_ for _ in ()).throw(MemoryError("boom")) if b"x" in value
                        else real(value, *a))
    out = d.columns([b'{"event_id": "a"}', b'{"event_id": "x"}'])
    assert out["_dd_error_type"].to_pylist() == [None, "undecodable"]
    assert out["_dd_error"].to_pylist()[1] == "payload could not be decoded: MemoryError: boom"
    assert out["_dd_original"].to_pylist()[1] == b'{"event_id": "x"}'
