"""Decode and validate one message against the pipeline schema. Pure: no Spark, no I/O.

Bad input is data (invariant 7): every way a message can be unusable gives an error type and a
readable reason instead of an exception, and the message goes to the DLQ with them.
"""

from __future__ import annotations

import base64
import json
import math
from datetime import UTC, date, datetime
from decimal import Decimal, InvalidOperation
from typing import Any, NamedTuple


class Decoded(NamedTuple):
    values: tuple | None  # typed values in schema field order, None when the message is bad
    message_id: str | None
    error_type: str | None
    error: str | None


def _bad(kind: str, reason: str, message_id: str | None = None) -> Decoded:
    return Decoded(None, message_id, kind, reason)


def _timestamp(v: Any) -> datetime:
    if isinstance(v, str):
        ts = datetime.fromisoformat(v)
        return ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts.astimezone(UTC)
    if isinstance(v, int) and not isinstance(v, bool):  # epoch milliseconds
        return datetime.fromtimestamp(v / 1000, tz=UTC)
    raise TypeError


def _date(v: Any) -> date:
    if isinstance(v, str):
        return date.fromisoformat(v)
    raise TypeError


def _long(v: Any) -> int:
    if isinstance(v, int) and not isinstance(v, bool) and -(2**63) <= v < 2**63:
        return v
    raise TypeError


def _int(v: Any) -> int:
    if isinstance(v, int) and not isinstance(v, bool) and -(2**31) <= v < 2**31:
        return v
    raise TypeError


def _double(v: Any) -> float:
    if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
        return float(v)
    raise TypeError


def _string(v: Any) -> str:
    if isinstance(v, str):
        return v
    raise TypeError


def _boolean(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    raise TypeError


def _decimal(v: Any) -> Decimal:
    if isinstance(v, bool):
        raise TypeError
    try:
        return Decimal(str(v))
    except InvalidOperation:
        raise TypeError from None


def _binary(v: Any) -> bytes:
    if isinstance(v, str):
        return base64.b64decode(v, validate=True)
    raise TypeError


CONVERTERS = {"string": _string, "long": _long, "int": _int, "integer": _int, "double": _double,
              "float": _double, "boolean": _boolean, "timestamp": _timestamp, "date": _date,
              "binary": _binary, "decimal(18,2)": _decimal, "decimal(38,9)": _decimal}


def message_id_of(value: Any) -> str | None:
    """Ids may be strings or integers in the payload; the MERGE key is always their string form."""
    if isinstance(value, str) and value.strip():
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return None


def decode(data: bytes | None, *, fields: dict[str, str], id_field: str, required: list[str],
           max_bytes: int, fallback_id: str | None = None, message_id: str | None = None) -> Decoded:
    """Bytes -> typed values, or the reason they cannot be. `fallback_id` is used when the id is absent
    (Kafka's topic-partition-offset); without one a missing id is an error. `message_id` comes from
    outside the payload (a Kafka key or header) and wins over the payload's id field."""
    if data is None or len(data) == 0:
        return _bad("empty", "empty payload")
    if len(data) > max_bytes:
        return _bad("oversized", f"payload of {len(data)} bytes exceeds max_message_bytes={max_bytes}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return _bad("invalid_utf8", f"payload is not valid UTF-8 (byte {exc.start}: {data[exc.start:exc.start + 1]!r})")
    try:
        obj = json.loads(text)
    except ValueError as exc:
        return _bad("invalid_json", f"payload is not valid JSON: {exc}")
    if not isinstance(obj, dict):
        return _bad("not_an_object", f"payload is a JSON {type(obj).__name__}, expected an object")
    raw_id = obj.get(id_field)
    message_id = message_id or message_id_of(raw_id) or (fallback_id if raw_id is None else None)
    if message_id is None:
        what = "missing" if id_field not in obj else ("null" if raw_id is None else f"invalid ({raw_id!r})")
        return _bad("missing_id", f"message id field '{id_field}' is {what}")
    values = []
    for name, kind in fields.items():
        value = obj.get(name)
        if name == id_field:
            values.append(message_id)
            continue
        if value is None:
            if name in required:
                return _bad("schema", f"required field '{name}' is {'null' if name in obj else 'missing'}",
                            message_id)
            values.append(None)
            continue
        try:
            values.append(CONVERTERS[kind](value))
        except (TypeError, ValueError):
            shown = json.dumps(value)[:60]
            return _bad("schema", f"field '{name}' should be {kind}, got {shown}", message_id)
    return Decoded(tuple(values), message_id, None, None)
