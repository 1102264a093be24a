"""Decode and validate one message against the pipeline schema. Pure: no Spark, no I/O.

Bad input is data (invariant 7): every way a message can be unusable gives an error type and a
readable reason instead of an exception, and the message goes to the DLQ with them.
"""

from __future__ import annotations

import base64
import json
import math
import struct
from datetime import UTC, date, datetime
from decimal import Context, Decimal, Inexact, InvalidOperation
from typing import Any, NamedTuple

from deltadrain.schema.evolution import fit, new_fields, refusal
from deltadrain.schema.types import COLUMN_TYPES, column_type, decimal_of


class Decoded(NamedTuple):
    # Typed values in schema field order, None when the message is bad. Collecting new fields
    # (schema.evolution add_columns), two more: the fields no column holds yet as a JSON object's text,
    # and their kinds (deltadrain.schema.evolution.json_kind) as one; None and None when there are none.
    values: tuple | None
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
    if isinstance(v, int | float | Decimal) and not isinstance(v, bool) and math.isfinite(f := float(v)):
        return f
    raise TypeError


def _float(v: Any) -> float:
    f = _double(v)
    try:
        struct.pack("<f", f)  # a float column holds 32 bits: beyond its range Arrow would store inf
    except OverflowError:
        raise TypeError from None
    return f


def _string(v: Any) -> str:
    if isinstance(v, str):
        return v
    raise TypeError


def _boolean(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    raise TypeError


def _decimal(precision: int, scale: int):
    """A converter to decimal(precision, scale) that refuses what the column cannot hold exactly:
    NaN and infinities, more than `scale` decimals (never rounded away), more than `precision` digits."""
    exact = Context(prec=precision, traps=[InvalidOperation, Inexact])
    step = Decimal(1).scaleb(-scale)

    def convert(v: Any) -> Decimal:
        if isinstance(v, bool):
            raise TypeError
        try:
            d = Decimal(str(v))
            if not d.is_finite():
                raise TypeError
            return exact.quantize(d, step)  # Inexact: digits past the scale; InvalidOperation: too many
        except (InvalidOperation, Inexact):
            raise TypeError from None

    return convert


def _binary(v: Any) -> bytes:
    if isinstance(v, str):
        return base64.b64decode(v, validate=True)
    raise TypeError


# The converter of each type that is not a decimal, by its column's name (deltadrain.schema.types).
SCALARS = {"string": _string, "long": _long, "int": _int, "double": _double, "float": _float, "boolean": _boolean,
           "timestamp": _timestamp, "date": _date, "binary": _binary}


def _converter(name: str):
    digits = decimal_of(name)
    return _decimal(*digits) if digits else SCALARS[column_type(name)]


# A declared type -> the function that types a value for its column or raises TypeError.
CONVERTERS = {name: _converter(name) for name in COLUMN_TYPES}


def _lone_surrogate(obj: Any) -> str | None:
    """The first lone surrogate in a parsed payload's strings (keys included), or None."""
    try:
        json.dumps(obj, ensure_ascii=False, default=str).encode("utf-8")
        return None
    except UnicodeEncodeError as exc:
        return exc.object[exc.start]


def _shown(value: Any) -> str:
    """A payload value as the message wrote it, for a reason (numbers are read as Decimal)."""
    return str(value) if isinstance(value, Decimal) else json.dumps(value, default=str)


def message_id_of(value: Any) -> str | None:
    """Ids may be strings or integers in the payload; the MERGE key is always their string form."""
    if isinstance(value, str) and value.strip():
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return None


def decode(data: bytes | None, *, fields: dict[str, str], id_field: str, required: list[str],
           max_bytes: int, fallback_id: str | None = None, message_id: str | None = None,
           evolved: frozenset = frozenset(), collect_new: bool = False) -> Decoded:
    """Bytes -> typed values, or the reason they cannot be. `fallback_id` is used when the id is absent
    (Kafka's topic-partition-offset); without one a missing id is an error. `message_id` comes from
    outside the payload (a Kafka key or header) and wins over the payload's id field. `evolved`: the
    fields typed by an evolved column of the table; `collect_new`: fields in no column are kept at the end
    of the values (schema.evolution add_columns) instead of ignored."""
    if (wrong := size_error(data, max_bytes)) is not None:
        return wrong
    assert data is not None  # size_error refused it
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return _bad("invalid_utf8", f"payload is not valid UTF-8 (byte {exc.start}: {data[exc.start:exc.start + 1]!r})")
    try:
        # Fractions are read as Decimal, exactly as written: a decimal column gets every digit, and a
        # double the same correctly rounded value float parsing gives.
        obj = json.loads(text, parse_float=Decimal)
    except ValueError as exc:
        return _bad("invalid_json", f"payload is not valid JSON: {exc}")
    except RecursionError:
        return _bad("invalid_json", "payload is JSON nested deeper than the parser follows (~1 000 levels)")
    if "\\u" in text:  # an escape may stand for half a UTF-16 pair, which no UTF-8 column can hold
        lone = _lone_surrogate(obj)
        if lone is not None:
            return _bad("invalid_json", f"payload is JSON no column can hold: a string escapes a lone UTF-16 "
                                        f"surrogate (\\u{ord(lone):04x}), half of a character")
    if not isinstance(obj, dict):
        return _bad("not_an_object", f"payload is a JSON {type(obj).__name__}, expected an object")
    got = record_values(obj, fields=fields, id_field=id_field, required=required, fallback_id=fallback_id,
                        message_id=message_id, evolved=evolved)
    if not collect_new or got.values is None:
        return got
    extra, kinds, problem = new_fields(obj, set(fields), {n.lower() for n in fields})
    if problem:
        return _bad("schema", problem, got.message_id)
    return got._replace(values=(*got.values, extra, kinds))


def size_error(data: bytes | None, max_bytes: int) -> Decoded | None:
    """An empty or oversized payload's dead letter, whatever its format; None when its size is fine."""
    if data is None or len(data) == 0:
        return _bad("empty", "empty payload")
    if len(data) > max_bytes:
        return _bad("oversized", f"payload of {len(data)} bytes exceeds max_message_bytes={max_bytes}")
    return None


def _convert(kind: str, value: Any) -> Any:
    return CONVERTERS[kind](value)


def record_values(record: dict, *, fields: dict[str, str], id_field: str, required: list[str],
                  fallback_id: str | None = None, message_id: str | None = None, convert=_convert,
                  unset: str = "null", unset_id: str = "null", no_id: tuple = (None,),
                  evolved: frozenset = frozenset()) -> Decoded:
    """A parsed payload (field -> value, whatever its format) -> the typed values in `fields` order, or the
    reason they cannot be. A field absent from `record` is "missing", one whose value is None `unset`;
    an id in `no_id` is `unset_id` (Protobuf: an unset string is ""). `convert(kind, value)` types a value
    (the JSON path's CONVERTERS, which Avro and Protobuf extend with their own Python types). A field in
    `evolved` is typed by the table's column (deltadrain.schema.evolution.fit), and a refusal names both types."""
    raw_id = record.get(id_field)
    message_id = message_id or message_id_of(raw_id) or (fallback_id if raw_id in no_id else None)
    if message_id is None:
        what = ("missing" if id_field not in record
                else unset_id if raw_id in no_id else f"invalid ({_shown(raw_id)[:60]})")
        return _bad("missing_id", f"message id field '{id_field}' is {what}")
    values: list[Any] = []
    for name, kind in fields.items():
        value = record.get(name)
        if name == id_field:
            values.append(message_id)
            continue
        if value is None:
            if name in required:
                return _bad("schema", f"required field '{name}' is {unset if name in record else 'missing'}",
                            message_id)
            values.append(None)
            continue
        try:
            values.append(convert(kind, value) if name not in evolved else fit(kind, value, convert))
        except (TypeError, ValueError, OverflowError, OSError):  # OverflowError: a huge int for a double
            if name in evolved:
                return _bad("schema", refusal(name, kind, value), message_id)
            return _bad("schema", f"field '{name}' should be {kind}, got {_shown(value)[:60]}", message_id)
    return Decoded(tuple(values), message_id, None, None)


# -- many messages at once ----------------------------------------------------------------------
#
# The per-message decoder above is the definition of what a message means. Decoding a batch one
# message at a time in Python costs ~10 us a message, so batches are parsed column-wise by Arrow's
# JSON reader, and every message that Arrow's reading could possibly disagree with `decode` about
# is handed to `decode` itself. Rules that keep the two identical (tests/unit/test_decode_many.py
# checks them message by message):
# - only schemas of string/long/int/double/boolean/timestamp fields with a string id take this path;
# - Arrow sees only payloads that are one JSON object on one line ('{' first, '}' last, no CR/LF),
#   so the n lines it reads are the n payloads, or it fails;
# - a chunk Arrow refuses (invalid JSON or UTF-8, a wrong type, a duplicate key, a number out of
#   range, an impossible date) is split in halves until the refused messages are alone; those go
#   to `decode`;
# - accepted rows still go to `decode` when their id is not plainly printable, a required field is
#   null, a double is not finite, a timestamp is not plain ISO 8601 with an optional 'Z', or the
#   payload has more than BRACKETS brackets (it may nest deeper than Python's parser follows).

FAST_KINDS = {"string": "string", "long": "int64", "int": "int32", "integer": "int32", "double": "float64",
              "boolean": "bool", "timestamp": "string"}  # timestamps are read as text, converted below
PLAIN_TIMESTAMP = r"^[1-9][0-9]{3}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?Z?$"
PLAIN_ID = r"^[\x21-\x7e](.*[\x21-\x7e])?$"
LEAF = 8  # a refused chunk this small is decoded message by message
BRACKETS = 256  # a payload with more '[' and '{' than this is decoded message by message
OUT_COLUMNS = ("_dd_message_id", "_dd_error_type", "_dd_error", "_dd_original", "_dd_first_failure_at")
# With schema.evolution add_columns: a good row's fields that no column holds yet (Decoded.extra and
# extra_kinds); such a row keeps its original bytes too, in case the batch's new columns refuse it.
EXTRA_COLUMNS = ("_dd_extra", "_dd_extra_kinds")


def _many_brackets(raw):
    """Per payload: more than BRACKETS '[' and '{'. Arrow follows any nesting, and `decode` refuses what
    Python's parser cannot (~1 000 levels), so such payloads are left to `decode`. Only payloads long
    enough to hold that many (the rare ones) are searched: searching all costs 20% of a decode."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    flags = np.zeros(len(raw), dtype=bool)
    long = pc.indices_nonzero(pc.greater(pc.binary_length(raw), 2 * BRACKETS))
    if len(long):
        some = raw.take(long)
        many = pc.greater(pc.add(pc.count_substring(some, "["), pc.count_substring(some, "{")), BRACKETS)
        flags[long.filter(many).to_numpy()] = True
    return pa.array(flags)


def _one_object_per_line(value) -> bool:
    return (value is not None and len(value) > 1 and value[0] == 0x7B and value[-1] == 0x7D
            and b"\n" not in value and b"\r" not in value)


def merged(n: int, fast_rows: list[int], fast_cols: dict, slow: list[int], slow_cols: dict) -> dict:
    """The columns of `n` rows, in row order, from those of the rows decoded column-wise (`fast_rows`) and those
    decoded message by message (`slow`, sorted)."""
    import numpy as np
    import pyarrow as pa

    if not slow:
        return fast_cols
    order = np.empty(n, dtype=np.int64)
    order[np.concatenate([np.asarray(fast_rows, dtype=np.int64), np.asarray(slow, dtype=np.int64)])] = np.arange(n)
    take = pa.array(order)
    return {name: pa.concat_arrays([fast_cols[name], slow_cols[name]]).take(take) for name in fast_cols}


class BatchDecoder:
    """Decodes lists of payloads into Arrow columns: `OUT_COLUMNS` plus the payload fields, typed as
    `types` (name -> Arrow type) says. Built in each Spark task (claim.decoder_for)."""

    def __init__(self, *, fields: dict[str, str], id_field: str, required: list[str], max_bytes: int, types: dict,
                 evolved: frozenset = frozenset(), collect_new: bool = False):
        self.fields, self.id_field, self.required, self.max_bytes = dict(fields), id_field, list(required), max_bytes
        self.types = dict(types)
        self.evolved, self.collect_new = frozenset(evolved), collect_new
        self.fast = fields.get(id_field) == "string" and all(kind in FAST_KINDS for kind in fields.values())

    def one(self, value, fallback_id=None, message_id=None) -> Decoded:
        return decode(value, fields=self.fields, id_field=self.id_field, required=self.required,
                      max_bytes=self.max_bytes, fallback_id=fallback_id, message_id=message_id,
                      evolved=self.evolved, collect_new=self.collect_new)

    def columns(self, values: list, *, fallback_ids: list | None = None, message_ids: list | None = None,
                preset: dict | None = None) -> dict:
        """Column name -> Arrow array, one row per value, in order. `preset` maps a row index to its
        (message_id, error_type, error, original, first_failure_at): rows decided before decoding."""

        preset = preset or {}
        n = len(values)
        candidates, slow = [], []
        for i, value in enumerate(values):
            if self.fast and i not in preset and len(value or b"") <= self.max_bytes and self._candidate(value):
                candidates.append(i)
            else:
                slow.append(i)
        fast_rows, fast_cols = self._fast(values, candidates, fallback_ids, message_ids, slow)
        slow.sort()
        slow_cols = self._slow(values, slow, fallback_ids, message_ids, preset)
        if not fast_rows:
            return slow_cols
        return merged(n, fast_rows, fast_cols, slow, slow_cols)

    def _candidate(self, value) -> bool:
        """Whether `value` may take the column-wise path (`_fast`); the others go to `one`."""
        return _one_object_per_line(value)

    # -- the Arrow path ---------------------------------------------------------------------------

    def _parse(self, chunk: list):
        import io

        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.json as pj

        raw = pa.array(chunk, pa.binary())
        raw.cast(pa.string())  # raises on invalid UTF-8 anywhere in a payload
        data = b"\n".join(chunk)
        schema = pa.schema([(name, FAST_KINDS[kind]) for name, kind in self.fields.items()])
        # Collecting new fields, Arrow reads the others too: a row with one that is not null goes to `decode`.
        unexpected = "infer" if self.collect_new else "ignore"
        table = pj.read_json(io.BytesIO(data),
                             read_options=pj.ReadOptions(use_threads=False, block_size=max(len(data) + 16, 1 << 20)),
                             parse_options=pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior=unexpected))
        if table.num_rows != len(chunk):
            raise ValueError("one line did not give one row")
        # Timestamps: plain ISO 8601 text is converted here (an impossible date refuses the chunk);
        # anything else is left null and marked for `decode`.
        unusual = _many_brackets(raw)
        for name in [n for n in table.column_names if n not in self.fields]:
            unusual = pc.or_(unusual, table.column(name).combine_chunks().is_valid())
        table = table.select(list(self.fields))
        for i, (name, kind) in enumerate(self.fields.items()):
            if kind != "timestamp":
                continue
            text = table.column(name).combine_chunks()
            ok = pc.fill_null(pc.match_substring_regex(text, PLAIN_TIMESTAMP), False)
            unusual = pc.or_(unusual, pc.and_(text.is_valid(), pc.invert(ok)))
            plain = pc.if_else(ok, pc.replace_substring_regex(text, "Z$", ""), pa.nulls(len(text), pa.string()))
            table = table.set_column(i, name, pc.cast(pc.cast(plain, pa.timestamp("us")), pa.timestamp("us", tz="UTC")))
        return table.append_column("__unusual", unusual)

    def _accepted(self, values: list, rows: list, slow: list, out: list) -> None:
        """Parse `rows` with Arrow; refused chunks are halved until the refused rows are alone."""
        if not rows:
            return
        try:
            out.append((rows, self._parse([values[i] for i in rows])))
        except Exception:
            if len(rows) <= LEAF:
                slow.extend(rows)
            else:
                mid = len(rows) // 2
                self._accepted(values, rows[:mid], slow, out)
                self._accepted(values, rows[mid:], slow, out)

    def _parsed(self, values, candidates: list[int], slow: list[int]):
        """(the rows Arrow's JSON reader took, in order, and their table) of the `candidates`; the rows it refused
        go to `slow`. None when it took none."""
        import pyarrow as pa

        parsed: list = []
        self._accepted(values, candidates, slow, parsed)
        if not parsed:
            return None
        return [i for part, _ in parsed for i in part], pa.concat_tables([t for _, t in parsed])

    def _fast(self, values, candidates, fallback_ids, message_ids, slow):
        import pyarrow as pa
        import pyarrow.compute as pc

        if (got := self._parsed(values, candidates, slow)) is None:
            return [], {}
        rows, table = got
        none = pa.nulls(len(rows), pa.string())
        ext = pa.array([message_ids[i] or None for i in rows], pa.string()) if message_ids else none
        fallback = pa.array([fallback_ids[i] for i in rows], pa.string()) if fallback_ids else none
        raw_id = table.column(self.id_field).combine_chunks()
        plain = pc.fill_null(pc.match_substring_regex(raw_id, PLAIN_ID), False)
        # Rows whose meaning `decode` must settle: an unusual id, or none to fall back on.
        refer = pc.and_(ext.is_null(), pc.or_(pc.and_(raw_id.is_valid(), pc.invert(plain)),
                                              pc.and_(raw_id.is_null(), fallback.is_null())))
        refer = pc.or_(refer, table.column("__unusual").combine_chunks())
        cols = {}
        for name, kind in self.fields.items():
            col = table.column(name).combine_chunks()
            if name == self.id_field:
                continue
            if name in self.required:
                refer = pc.or_(refer, col.is_null())
            if kind == "double":
                refer = pc.or_(refer, pc.fill_null(pc.invert(pc.is_finite(col)), False))
            cols[name] = col
        message_id = pc.coalesce(ext, raw_id, fallback)
        cols[self.id_field] = message_id
        keep = pc.invert(refer)
        referred = refer.to_pylist()
        slow.extend(i for i, r in zip(rows, referred, strict=True) if r)
        fast_rows = [i for i, r in zip(rows, referred, strict=True) if not r]
        m = len(fast_rows)
        out = {"_dd_message_id": message_id.filter(keep), "_dd_error_type": pa.nulls(m, pa.string()),
               "_dd_error": pa.nulls(m, pa.string()), "_dd_original": pa.nulls(m, pa.binary()),
               "_dd_first_failure_at": pa.nulls(m, pa.timestamp("us", tz="UTC"))}
        for name in self.fields:
            out[name] = cols[name].filter(keep).cast(self.types[name])
        if self.collect_new:
            out.update({name: pa.nulls(m, pa.string()) for name in EXTRA_COLUMNS})
        return fast_rows, out

    # -- message by message -----------------------------------------------------------------------

    def _slow(self, values, rows, fallback_ids, message_ids, preset) -> dict:
        import pyarrow as pa

        records = []
        extra = self.collect_new
        nothing = (None,) * (len(self.fields) + 2 * extra)
        for i in rows:
            if i in preset:
                records.append((*preset[i], *nothing))
                continue
            try:
                got = self.one(values[i], fallback_ids[i] if fallback_ids else None,
                               message_ids[i] if message_ids else None)
            except Exception as exc:  # a way to be bad that `decode` does not know yet: still data (inv. 7)
                got = _bad("undecodable", f"payload could not be decoded: {type(exc).__name__}: {exc}"[:500])
            if got.values is None:
                records.append((got.message_id or (message_ids[i] if message_ids else None), got.error_type,
                                got.error, values[i], None, *nothing))
            else:
                # A row with new fields keeps its bytes: the batch's new columns may refuse it (deltadrain.run.layout).
                records.append((got.message_id, None, None, values[i] if extra and got.values[-1] else None, None,
                                *got.values))
        names = [*OUT_COLUMNS, *self.fields, *(EXTRA_COLUMNS if extra else ())]
        types = [pa.string(), pa.string(), pa.string(), pa.binary(), pa.timestamp("us", tz="UTC"),
                 *(self.types[name] for name in self.fields), *((pa.string(), pa.string()) if extra else ())]
        columns = list(zip(*records, strict=True)) if records else [()] * len(names)
        return {name: pa.array(list(col), type=kind) for name, kind, col in zip(names, types, columns, strict=True)}
