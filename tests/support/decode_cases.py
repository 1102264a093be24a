"""The JSON decoding cases the column-wise decoder and schema evolution are both judged on: the declared
fields, a good message and every payload known to part Arrow's JSON reading from `decode`."""

import json

import pyarrow as pa

FIELDS = {"event_id": "string", "customer": "string", "amount": "double", "quantity": "long", "small": "int",
          "flag": "boolean", "status": "string", "event_time": "timestamp"}
REQUIRED = ["event_id", "customer", "event_time"]
TYPES = {"event_id": pa.string(), "customer": pa.string(), "amount": pa.float64(), "quantity": pa.int64(),
         "small": pa.int32(), "flag": pa.bool_(), "status": pa.string(), "event_time": pa.timestamp("us", tz="UTC")}
MAX = 600


def good(i: int, **change) -> dict:
    body = {"event_id": f"evt-{i:06d}", "customer": f"c{i % 7}", "amount": round(i * 1.37, 2), "quantity": i,
            "small": i % 100, "flag": i % 2 == 0, "status": "paid", "event_time": "2026-01-08T00:00:00.005000Z",
            "note": "x" * (i % 30)}
    body.update(change)
    return {k: v for k, v in body.items() if v is not ...}


def enc(obj) -> bytes:
    return json.dumps(obj).encode()


# Every way we know that Arrow's JSON reading and `decode` could part; each must end as `decode` says.
TRICKY = [
    None, b"", b"{}", b"   ", b"[1]", b"1", b"null", b'"text"', b"{oops", b'{"event_id": "a"} x',
    b'{"event_id": "a"}{"event_id": "b"}', b'\xef\xbb\xbf' + enc(good(1)), enc(good(2)) + b"\n",
    b"{\n" + enc(good(3))[1:], enc(good(4)).replace(b", ", b",\r"), b'{"note": "\xff", "event_id": "x"}',
    enc(good(5)).replace(b'"paid"', b'"\xed\xa0\x80"'), b"x" * (MAX + 1), enc(good(6, note="y" * MAX)),
    enc(good(7, event_id=...)), enc(good(8, event_id=None)), enc(good(9, event_id="")), enc(good(10, event_id="  ")),
    enc(good(11, event_id=" lead")), enc(good(12, event_id="trail\t")), enc(good(13, event_id=12345)),
    enc(good(14, event_id=1.5)), enc(good(15, event_id=True)), enc(good(16, event_id="\x1cid")),
    enc(good(17, event_id="caf\u00e9")), enc(good(18, event_id="a\nb")), enc(good(19, customer=None)),
    enc(good(20, customer=...)), enc(good(21, customer=42)), enc(good(22, amount="1.5")), enc(good(23, amount=True)),
    enc(good(24, amount=7)), b'{"event_id": "n1", "customer": "c", "event_time": "2026-01-01T00:00:00Z", "amount": NaN}',
    b'{"event_id": "n2", "customer": "c", "event_time": "2026-01-01T00:00:00Z", "amount": Infinity}',
    b'{"event_id": "n3", "customer": "c", "event_time": "2026-01-01T00:00:00Z", "amount": 1e400}',
    b'{"event_id": "n4", "customer": "c", "event_time": "2026-01-01T00:00:00Z", "amount": 1e-400}',
    b'{"event_id": "n5", "customer": "c", "event_time": "2026-01-01T00:00:00Z", "amount": 1' + b"0" * 400 + b"}",
    enc(good(25, quantity=1.0)), enc(good(26, quantity="3")), enc(good(27, quantity=2**63)),
    enc(good(28, quantity=-(2**63))), enc(good(29, quantity=True)), enc(good(30, small=2**31)),
    enc(good(31, small=-(2**31))), enc(good(32, flag=1)), enc(good(33, flag="true")), enc(good(34, flag=None)),
    enc(good(35, event_time="2026-02-30T00:00:00Z")), enc(good(36, event_time="2026-01-08")),
    enc(good(37, event_time="2026-01-08 10:00:00")), enc(good(38, event_time="2026-01-08T10:00:00+02:00")),
    enc(good(39, event_time="2026-01-08T10:00:00.1234567Z")), enc(good(40, event_time="2026-01-08T10:00:00.5")),
    enc(good(41, event_time=1767225600000)), enc(good(42, event_time=1.5)), enc(good(43, event_time="yesterday")),
    enc(good(44, event_time="2026-01-08T24:00:00Z")), enc(good(45, event_time="2026-01-08T23:59:60Z")),
    enc(good(46, event_time="0000-01-08T00:00:00Z")), enc(good(47, event_time="2026-13-01T00:00:00Z")),
    enc(good(48, event_time="2026-01-08T10:00:00z")), enc(good(49, event_time="2026-01-08T10:00Z")),
    b'{"event_id": "d1", "event_id": "d2", "customer": "c", "event_time": "2026-01-01T00:00:00Z"}',
    b'{"event_id": "u1", "customer": "a\\u0000b", "event_time": "2026-01-01T00:00:00Z"}',
    b'{"event_id": "u2", "customer": "\\ud83d\\ude00", "event_time": "2026-01-01T00:00:00Z"}',
    b'{"event_id": "u3", "customer": "c", "event_time": "2026-01-01T00:00:00Z", "x": {"event_id": 1}}',
    b'{"event_id": "u4", "customer": "c", "event_time": "2026-01-01T00:00:00Z",}',
    b"{'event_id': 'u5'}", b'{"event_id": "u6", "customer": "c\tb", "event_time": "2026-01-01T00:00:00Z"}',
    b'{"event_id": "u7", "customer": "c", "event_time": "2026-01-01T00:00:00Z", "quantity": 01}',
    b'{"event_id": "u8", "customer": "c", "event_time": "2026-01-01T00:00:00Z", "quantity": -0}',
    b'{"event_id": "u9", "customer": "c", "event_time": "2026-01-01T00:00:00Z", "amount": -0.0}',
]
