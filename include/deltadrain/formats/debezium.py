"""Debezium change events (`schema.envelope: debezium`): a record's key and value -> one `Change`, or the
reason it is a dead letter. Pure: no Spark, no I/O.

Debezium writes each row change as an envelope `{before, after, source, op, ts_ms, transaction}`:
- as JSON, with Kafka Connect's `{"schema": ..., "payload": ...}` wrapper (JsonConverter with
  `schemas.enable=true`, its default) or without it (`schemas.enable=false`): `parse_json` takes both;
- as Avro in the schema registry's wire format (AvroConverter): the drain reads the datum with the
  writer's schema (deltadrain.formats.avro), and `parse_record` takes the decoded dicts.
The record's key is the row's primary key, a struct of its columns, in the same converter's form.

What each event means:
- `op` r (a snapshot read), c (create) and u (update) upsert the row `after`;
- `op` d deletes; so does a Kafka tombstone (a key and no value, which Debezium sends after each
  delete so that log compaction can drop the key);
- `op` t (truncate) is a `TRUNCATE` change: the drain fails the run with `truncate_error` unless
  `target.on_truncate: truncate`.
Bad input is data (invariant 7): a missing key, an unknown `op`, an envelope that does not parse, an
upsert without `after`, non-UTF-8 bytes or JSON that is not an object give an error type and a
readable reason (`Parsed.error_type`, `Parsed.error`), with decode.py's types where they mean the same,
never an exception. The row images keep their values as the converter wrote them (JSON fractions as
Decimal, as decode.py reads them); typing them into columns is the schema's job, as for any payload.
"""

from __future__ import annotations

import json
from base64 import b64encode
from dataclasses import dataclass
from datetime import date, datetime, time
from decimal import Decimal
from enum import StrEnum
from typing import Any, NamedTuple

from deltadrain.formats.decode import _lone_surrogate, size_error


class Kind(StrEnum):
    UPSERT = "upsert"
    DELETE = "delete"
    TRUNCATE = "truncate"


# Debezium's op codes for row changes; "m" (a Postgres logical decoding message) is no row change.
OPS = {"r": Kind.UPSERT, "c": Kind.UPSERT, "u": Kind.UPSERT, "d": Kind.DELETE, "t": Kind.TRUNCATE}


@dataclass(frozen=True)
class SourceInfo:
    """Where a change happened, from the envelope's `source` block. Each connector names its fields its
    own way (Postgres `lsn` and `txId`, SQL Server `change_lsn`, Oracle `scn`, MySQL `file`/`pos`):
    `lsn` and `tx_id` are the ones that order and group changes when present; `fields` holds the block."""

    connector: str | None = None
    db: str | None = None
    schema: str | None = None
    table: str | None = None
    lsn: int | str | None = None
    tx_id: int | str | None = None
    snapshot: str | None = None  # "true", "first", "last", "incremental", "false": a snapshot read or not
    ts_ms: int | None = None  # when the source database made the change
    fields: tuple[tuple[str, Any], ...] = ()

    @property
    def where(self) -> str:
        """The changed table as `db.schema.table`, as far as the connector names it."""
        return ".".join(str(p) for p in (self.db, self.schema, self.table) if p) or "the source table"


@dataclass(frozen=True)
class Change:
    """One change event: `key` holds the primary key's columns (None only for a truncate), `after` the
    row an upsert writes, `before` the row as it was (a delete's, when the source database sends it)."""

    kind: Kind
    op: str | None  # Debezium's op; None for a tombstone
    key: dict | None
    before: dict | None = None
    after: dict | None = None
    ts_ms: int | None = None  # when Debezium processed the change
    source: SourceInfo | None = None
    tx: str | None = None  # the `transaction` block's id (provide.transaction.metadata), when present

    @property
    def image(self) -> dict | None:
        """The row the change is about: `after` for an upsert, `before` for a delete (where an order_by
        column is read; None for a tombstone or a delete without `before`)."""
        return self.after if self.kind == Kind.UPSERT else self.before

    @property
    def key_text(self) -> str | None:
        return key_text(self.key) if self.key is not None else None


class Parsed(NamedTuple):
    # The change, or None when the event is a dead letter with the error type and reason.
    change: Change | None
    error_type: str | None = None
    error: str | None = None


def _bad(kind: str, reason: str) -> Parsed:
    return Parsed(None, kind, reason)


def _plain(value: Any) -> Any:
    """JSON for what the converters give that json cannot write; the same value gives the same text."""
    if isinstance(value, bytes):
        return b64encode(value).decode("ascii")
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    return str(value)  # Decimal, UUID: their text is their value


def key_text(key: dict) -> str:
    """The key as one canonical text: the same columns and values always give the same text, whatever
    order the converter wrote them in. Keys are grouped, compared and stored by it."""
    return json.dumps(key, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_plain)


def _shown(value: Any) -> str:
    return json.dumps(value, default=str)[:60]


def _json_object(data: bytes, what: str, *, wrapped: bool = False) -> tuple[Any, Parsed | None]:
    """Bytes -> (the JSON value with Kafka Connect's wrapper taken off, None) or (None, the dead letter).
    The reasons are decode.py's, naming `what` (the payload, the record key). `wrapped`: the value as
    written, the wrapper left on (its schema says which logical type each field has)."""
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, _bad("invalid_utf8", f"{what} is not valid UTF-8 (byte {exc.start}: {data[exc.start:exc.start + 1]!r})")
    try:
        obj = json.loads(text, parse_float=Decimal)
    except ValueError as exc:
        return None, _bad("invalid_json", f"{what} is not valid JSON: {exc}")
    except RecursionError:
        return None, _bad("invalid_json", f"{what} is JSON nested deeper than the parser follows (~1 000 levels)")
    if "\\u" in text and (lone := _lone_surrogate(obj)) is not None:
        return None, _bad("invalid_json", f"{what} is JSON no column can hold: a string escapes a lone UTF-16 "
                                          f"surrogate (\\u{ord(lone):04x}), half of a character")
    return (obj if wrapped else unwrap(obj)), None


def json_value(data: bytes, what: str = "payload") -> tuple[Any, Parsed | None]:
    """Bytes -> (the JSON value as written, wrapper and all, None) or (None, the dead letter)."""
    return _json_object(data, what, wrapped=True)


def unwrap(obj: Any) -> Any:
    """Kafka Connect's JsonConverter with schemas enabled writes `{"schema": <schema>, "payload": <value>}`;
    its schema is an object with a `type` (or null). Anything else is the value itself, so a table whose
    key columns are named `schema` and `payload` keeps them."""
    if (isinstance(obj, dict) and obj.keys() == {"schema", "payload"}
            and (obj["schema"] is None or (isinstance(obj["schema"], dict) and "type" in obj["schema"]))):
        return obj["payload"]
    return obj


def parse_json(value: bytes | None, key: bytes | None, *, key_columns: tuple[str, ...] = (),
               max_bytes: int | None = None) -> Parsed:
    """A record's JSON value and key (each with or without Kafka Connect's wrapper) -> its change, or the
    dead letter. `value` None is a tombstone. `key_columns` (target.key): see `parse_record`."""
    record_key = None
    if key is not None and len(key) > 0:
        record_key, wrong = _json_object(key, "record key")
        if wrong is not None:
            return wrong
    if value is None:
        return parse_record(None, record_key, key_columns=key_columns)
    if (refused := size_error(value, max_bytes if max_bytes is not None else len(value))) is not None:
        return Parsed(None, refused.error_type, refused.error)
    envelope, wrong = _json_object(value, "payload")
    if wrong is not None:
        return wrong
    return parse_record(envelope, record_key, key_columns=key_columns)


def parse_record(envelope: Any, key: Any, *, key_columns: tuple[str, ...] = ()) -> Parsed:
    """A decoded envelope (a dict, as the Avro reader or `parse_json` gives it; None for a tombstone)
    and record key (a dict of the primary key's columns, or None) -> its change, or the dead letter.

    The key is the record key. With `key_columns` (target.key) it is those columns: from the record key
    when it holds them all, else from the row image (`after` for an upsert, `before` for a delete), so a
    delete of a table whose records carry no key takes its key from `before`."""
    if key is not None and not isinstance(key, dict):
        return _bad("not_an_object", f"record key is a {_kind_of(key)}, expected an object of key columns")
    if envelope is None:
        return _keyed(Change(Kind.DELETE, None, None), key, key_columns, "a tombstone (a record without a value)")
    if not isinstance(envelope, dict):
        return _bad("not_an_object", f"payload is a {_kind_of(envelope)}, expected a change event object")
    if "op" not in envelope:
        return _bad("invalid_envelope", f"payload is no Debezium change event: it has no 'op' "
                                        f"(its fields: {', '.join(sorted(map(str, envelope)))[:200]})")
    op = envelope["op"]
    if not isinstance(op, str) or op not in OPS:
        if op == "m":
            return _bad("unknown_op", "op 'm' is a logical decoding message, not a row change: route the "
                                      "connector's message topic elsewhere")
        return _bad("unknown_op", f"op {_shown(op)} is none of Debezium's row changes (r, c, u, d, t)")
    parts = {}
    for name in ("before", "after", "source", "transaction"):
        part = envelope.get(name)
        if part is not None and not isinstance(part, dict):
            return _bad("invalid_envelope", f"'{name}' is a {_kind_of(part)}, expected an object or null")
        parts[name] = part
    ts_ms = envelope.get("ts_ms")
    if ts_ms is not None and (not isinstance(ts_ms, int) or isinstance(ts_ms, bool)):
        return _bad("invalid_envelope", f"'ts_ms' is {_shown(ts_ms)}, expected epoch milliseconds")
    kind = OPS[op]
    if kind == Kind.UPSERT and parts["after"] is None:
        return _bad("missing_after", f"op '{op}' upserts but 'after' is "
                                     f"{'null' if 'after' in envelope else 'missing'}: no row to write")
    tx = parts["transaction"]
    change = Change(kind, op, None, before=parts["before"], after=parts["after"], ts_ms=ts_ms,
                    source=source_info(parts["source"]) if parts["source"] is not None else None,
                    tx=str(tx["id"]) if tx and tx.get("id") is not None else None)
    if kind == Kind.TRUNCATE:
        return Parsed(change)  # a whole table's change: no key
    return _keyed(change, key, key_columns, f"op '{op}'")


def _keyed(change: Change, key: dict | None, key_columns: tuple[str, ...], what: str) -> Parsed:
    """`change` with its key, or the `missing_key` dead letter that says what was looked at."""
    if not key_columns:
        if not key:
            hint = ("nothing says which row it deletes" if change.op is None
                    else "set target.key to the columns that identify a row to take them from the row")
            return _bad("missing_key", f"{what} has no record key{'' if key is None else ' columns'}: {hint}")
        chosen, where = key, "record key"
    else:
        image = change.image
        if key and all(c in key for c in key_columns):
            chosen, where = key, "record key"
        elif image is not None and all(c in image for c in key_columns):
            chosen, where = image, "'after'" if change.kind == Kind.UPSERT else "'before'"
        else:
            looked = " or ".join(w for w, part in (("the record key", key), ("'after'", change.after),
                                                   ("'before'", change.before)) if part is not None)
            return _bad("missing_key", f"{what}: key columns {', '.join(key_columns)} are not all in "
                                       f"{looked or 'the record (it has no key and no row)'}")
        chosen = {c: chosen[c] for c in key_columns}
    unset = sorted(str(c) for c, v in chosen.items() if v is None)
    if unset:
        return _bad("missing_key", f"{what}: key column{'s' if len(unset) > 1 else ''} {', '.join(unset)} "
                                   f"null in the {where}")
    return Parsed(Change(change.kind, change.op, dict(chosen), change.before, change.after, change.ts_ms,
                         change.source, change.tx))


def _kind_of(value: Any) -> str:
    return "JSON " + type(value).__name__ if not isinstance(value, bytes) else "byte string"


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _number_or_text(value: Any) -> int | str | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return value if isinstance(value, str) else None


def source_info(source: dict) -> SourceInfo:
    """The envelope's `source` block. Lenient: a field of an unexpected type is left out (None), because
    each connector and version writes its own; the block as written stays in `fields`."""
    ts = source.get("ts_ms")
    snapshot = source.get("snapshot")
    return SourceInfo(
        connector=_text(source.get("connector")), db=_text(source.get("db")), schema=_text(source.get("schema")),
        table=_text(source.get("table")),
        lsn=_number_or_text(next((source[f] for f in ("lsn", "commit_lsn", "change_lsn", "scn")
                                  if source.get(f) is not None), None)),
        tx_id=_number_or_text(source.get("txId")),
        snapshot=str(snapshot).lower() if isinstance(snapshot, str | bool) else None,
        ts_ms=ts if isinstance(ts, int) and not isinstance(ts, bool) else None,
        fields=tuple(sorted((str(k), v) for k, v in source.items())))


def truncate_error(change: Change, pipeline: str) -> str:
    """The one line a run fails with when the source truncated a table and the target may not follow."""
    return truncate_line(truncated_where(change), pipeline)


def truncated_where(change: Change) -> str:
    """What a truncate names: the table and, when the connector says, the lsn (`truncate_line` puts it in its line)."""
    at = f" at lsn {change.source.lsn}" if change.source is not None and change.source.lsn is not None else ""
    return f"{change.source.where if change.source is not None else 'the source table'}{at}"


def truncate_line(where: str, pipeline: str) -> str:
    table, _, lsn = where.partition(" at lsn ")
    at = f" at lsn {lsn}" if lsn else ""
    return (f"pipeline {pipeline}: {table} was truncated (Debezium op 't'{at}); to empty the target too set "
            f"target.on_truncate: truncate, or have the connector skip truncates (skipped.operations=t)")
