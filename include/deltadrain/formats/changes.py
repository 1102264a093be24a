"""Upsert mode's decoding (`target.mode: upsert`, docs/cdc.md): a record's value and key -> a row of typed
columns with its key, what it does (an upsert, a delete, a truncate) and its order value; or the reason it
is a dead letter. Pure: no Spark, no I/O.

Two kinds of payload:
- the row itself (`schema.envelope: none`): an entity's new state. The key is the `target.key` columns of the
  row; a Kafka tombstone (a key and no value) deletes, its key the record key (a JSON object of the key
  columns, or, with one key column, the column's value as text);
- a Debezium change event (`schema.envelope: debezium`, deltadrain.formats.debezium): `after` for an upsert,
  `before` (with the key's columns) for a delete. With Kafka Connect's schema wrapper, a field's logical type
  (a timestamp in micro- or nanoseconds, a day number, a decimal's bytes) turns it into its plain value.
  In Avro through the schema registry (`schema.format: avro`, Debezium with an Avro converter), key and value
  are each read with the writer's schema their id names (deltadrain.formats.avro.registry_datum); Avro's own
  logical types are read by the Avro reader, Kafka Connect's (the schema's `connect.name`) as above.
With `schema.evolution: add_columns` a field that is no column yet is typed from its values in JSON, and in Avro by
its writer's `after` record (`image_kinds`), as an insert pipeline's fields with a registry are.
`target.delete_when` makes an upsert whose row has the field equal to the value a delete. Keys are compared
and stored as one text (`debezium.key_text`) of their *typed* values, so a tombstone's key and a row's key are
the same text whatever the record key's form.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

from deltadrain.formats import debezium
from deltadrain.formats.avro import convert as avro_convert
from deltadrain.formats.avro import kinds_of, named_types, registry_datum, registry_writer
from deltadrain.formats.debezium import Kind, key_text
from deltadrain.formats.decode import (
    EXTRA_COLUMNS,
    FAST_KINDS,
    OUT_COLUMNS,
    BatchDecoder,
    Decoded,
    _bad,
    _convert,
    merged,
    record_values,
    size_error,
)
from deltadrain.formats.registry import Registry, RegistryFailure, ids_of
from deltadrain.schema.evolution import WriterColumns, avro_writer, new_fields, writer_columns, writer_extras

# The columns upsert mode adds to a claimed row: the key's text, what the event does (CHANGES), and the
# value it is ordered by (null under order_by: position).
KEY, CHANGE, ORDER = "_dd_key", "_dd_change", "_dd_order"
UPSERT_COLUMNS = (KEY, CHANGE, ORDER)
UPSERT, DELETE, TRUNCATE = "upsert", "delete", "truncate"
KEY_KINDS = ("long", "string")  # the key columns' kinds that plain JSON states are decoded column-wise with
ESCAPED = r'[\x00-\x1f"\\]'  # a text json.dumps escapes: such a key's text is made by key_text, row by row
SOURCE_LSN = "source.lsn"  # as deltadrain.config.changes names it


@dataclass(frozen=True)
class UpsertSpec:
    """What a decoding task needs of an upsert pipeline's config (pickled with the task)."""

    envelope: str  # "none" or "debezium"
    key: tuple[str, ...]  # target.key; empty: a Debezium record key's columns
    order_by: str  # "position", SOURCE_LSN or a field
    delete_field: str | None = None  # target.delete_when
    delete_equals: Any = None
    # Debezium in Avro (schema.format avro): the registry that names each key's and value's writer schema.
    registry: Registry | None = None


def order_type(fields: dict[str, str], order_by: str) -> str:
    """The `_dd_order` column's type: the order_by field's, else long (an lsn; null under position)."""
    return fields.get(order_by, "long")


def spec_of(pipeline, payload=None) -> UpsertSpec | None:
    """The pipeline's UpsertSpec, None in insert mode. `payload`: its Avro payload (deltadrain.formats.payloads),
    whose registry a Debezium pipeline reads its records with."""
    target = pipeline.target
    if target.mode != "upsert":
        return None
    when = target.delete_when
    envelope = pipeline.payload_schema.envelope
    registry = getattr(payload, "registry", None) if envelope == "debezium" else None
    return UpsertSpec(envelope, tuple(target.key), target.order_by,
                      when.field if when else None, when.equals if when else None, registry)


# Kafka Connect's and Debezium's logical types (the wrapper's field `name`) -> the plain value.
def _from_micros(v: int) -> str:
    # As ISO 8601 text, which a timestamp column reads exactly (an integer it reads as epoch milliseconds).
    return (datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=v)).isoformat()


LOGICAL = {
    "io.debezium.time.MicroTimestamp": lambda v, _: _from_micros(v) if isinstance(v, int) else v,
    "io.debezium.time.NanoTimestamp": lambda v, _: _from_micros(v // 1000) if isinstance(v, int) else v,
    "io.debezium.time.Timestamp": lambda v, _: _from_micros(v * 1000) if isinstance(v, int) else v,
    "org.apache.kafka.connect.data.Timestamp": lambda v, _: _from_micros(v * 1000) if isinstance(v, int) else v,
    "io.debezium.time.Date": lambda v, _: (date(1970, 1, 1) + timedelta(days=v)).isoformat() if isinstance(v, int) else v,
    "org.apache.kafka.connect.data.Date": lambda v, _: (date(1970, 1, 1) + timedelta(days=v)).isoformat()
    if isinstance(v, int) else v,
    "org.apache.kafka.connect.data.Decimal": lambda v, params: _decimal_bytes(v, params),
}


def _decimal_bytes(v: Any, params: dict) -> Any:
    """decimal.handling.mode precise: the unscaled value's big-endian two's complement bytes, base64 in JSON."""
    if not isinstance(v, str):
        return v
    try:
        unscaled = int.from_bytes(base64.b64decode(v, validate=True), "big", signed=True)
        return Decimal(unscaled).scaleb(-int(params.get("scale", 0)))
    except ValueError:
        return v  # not bytes: the column's type refuses it with the value shown


def logical_types(schema: Any) -> dict[str, dict[str, tuple[str, dict]]]:
    """A wrapped change event's schema -> {"before"/"after": {field: (logical name, parameters)}} for the
    fields with a logical type deltadrain turns into a plain value."""
    out: dict[str, dict[str, tuple[str, dict]]] = {}
    if not isinstance(schema, dict):
        return out
    for part in schema.get("fields") or []:
        if not isinstance(part, dict) or part.get("field") not in ("before", "after"):
            continue
        named = {}
        for f in part.get("fields") or []:
            if isinstance(f, dict) and f.get("name") in LOGICAL and isinstance(f.get("field"), str):
                named[f["field"]] = (f["name"], f.get("parameters") or {})
        out[part["field"]] = named
    return out


# The Kafka Connect time types `LOGICAL` turns into a timestamp or a date: the kind of column their values fill.
CONNECT_KINDS = {"io.debezium.time.MicroTimestamp": "timestamp", "io.debezium.time.NanoTimestamp": "timestamp",
                 "io.debezium.time.Timestamp": "timestamp", "org.apache.kafka.connect.data.Timestamp": "timestamp",
                 "io.debezium.time.Date": "date", "org.apache.kafka.connect.data.Date": "date"}


def _branches(t: Any) -> list:
    return t if isinstance(t, list) else [t]


def _images(parsed: Any) -> tuple[dict, dict[str, list[dict]]]:
    """An Avro change event's writer schema (parsed by fastavro) -> (its named types, {"before"/"after": the
    fields of that record})."""
    names = named_types(parsed, {})
    out: dict[str, list[dict]] = {}
    for part in parsed.get("fields", ()) if isinstance(parsed, dict) else ():
        if part.get("name") not in ("before", "after"):
            continue
        fields: list[dict] = []
        for branch in _branches(part["type"]):
            record = names.get(branch, branch) if isinstance(branch, str) else branch
            if isinstance(record, dict) and record.get("type") == "record":
                fields += record.get("fields", ())
        out[part["name"]] = fields
    return names, out


def avro_logical_types(parsed: Any) -> dict[str, dict[str, tuple[str, dict]]]:
    """An Avro change event's writer schema (parsed by fastavro) -> as `logical_types`: the fields of `before`
    and `after` whose Kafka Connect type (`connect.name`) is one deltadrain turns into a plain value. A field
    with an Avro logical type (a decimal's bytes) is left to the Avro reader, which gives its value already."""
    _, images = _images(parsed)
    out: dict[str, dict[str, tuple[str, dict]]] = {}
    for part, fields in images.items():
        named = {}
        for f in fields:
            for t in _branches(f["type"]):
                if isinstance(t, dict) and t.get("connect.name") in LOGICAL and "logicalType" not in t:
                    named[f["name"]] = (t["connect.name"], t.get("connect.parameters") or {})
        out[part] = named
    return out


def image_kinds(parsed: Any) -> dict[str, set[str]]:
    """An Avro change event's writer schema (parsed by fastavro) -> the fields of its `after` record with the
    kinds of the values deltadrain reads from them (for deltadrain.schema.evolution.avro_writer: the column a
    new one gets): Avro's (deltadrain.formats.avro.kinds_of), except that a Kafka Connect time type (`connect.name`)
    is the timestamp or date `LOGICAL` makes of it, and Avro's decimal gives its digits, `decimal(p,s)`."""
    names, images = _images(parsed)
    out: dict[str, set[str]] = {}
    for f in images.get("after", ()):
        kinds: set[str] = set()
        for t in _branches(f["type"]):
            if isinstance(t, dict) and t.get("logicalType") == "decimal" and isinstance(t.get("precision"), int):
                kinds.add(f"decimal({t['precision']},{t.get('scale', 0)})")
            elif isinstance(t, dict) and "logicalType" not in t and t.get("connect.name") in CONNECT_KINDS:
                kinds.add(CONNECT_KINDS[t["connect.name"]])
            else:
                kinds |= kinds_of(t, names)
        out[f["name"]] = kinds
    return out


def plain(image: dict | None, named: dict[str, tuple[str, dict]]) -> dict | None:
    if image is None or not named:
        return image
    out = dict(image)
    for field, (name, params) in named.items():
        if out.get(field) is not None:
            out[field] = LOGICAL[name](out[field], params)
    return out


@dataclass(frozen=True)
class Event:
    """One decoded record: the typed values (Decoded), its key's text, what it does and its order value."""

    decoded: Decoded
    key: str | None = None
    change: str | None = None
    order: Any = None


def _record_key(key: bytes | None, columns: tuple[str, ...]) -> tuple[dict | None, str | None]:
    """A plain pipeline's record key -> (the key's columns, None) or (None, why not): a JSON object (Kafka
    Connect's wrapper taken off) holding the key columns, or, with one key column, its value (JSON or text)."""
    if key is None or len(key) == 0:
        return None, "a tombstone (a record without a value) has no record key: nothing says which row it deletes"
    try:
        text = bytes(key).decode("utf-8")
    except UnicodeDecodeError:
        return None, "the record key is not valid UTF-8"
    try:
        value = debezium.unwrap(json.loads(text, parse_float=Decimal))
    except ValueError:
        value = text
    if isinstance(value, dict):
        if all(c in value for c in columns):
            return {c: value[c] for c in columns}, None
        return None, f"the record key holds not all key columns ({', '.join(columns)})"
    if len(columns) == 1:
        return {columns[0]: value}, None
    return None, f"the record key is no JSON object of the key columns ({', '.join(columns)})"


class UpsertDecoder(BatchDecoder):
    """A BatchDecoder for upsert pipelines: message by message, with the record keys (`keys`), adding
    UPSERT_COLUMNS to the columns. `one` is the definition."""

    def __init__(self, spec: UpsertSpec, *, fields: dict[str, str], id_field: str, required: list[str],
                 max_bytes: int, types: dict, evolved: frozenset = frozenset(), collect_new: bool = False):
        super().__init__(fields=fields, id_field=id_field, required=required, max_bytes=max_bytes, types=types,
                         evolved=evolved, collect_new=collect_new)
        self.spec = spec
        self.fast = False
        # Plain JSON states keyed by long or text columns are decoded column by column (`_columnwise`), as an
        # insert pipeline's JSON is; the rows that path cannot settle go message by message (`event`).
        self.columnwise = (spec.envelope == "none" and spec.registry is None and not collect_new and not evolved
                           and all(kind in FAST_KINDS for kind in self.fields.values())
                           and all(self.fields.get(c) in KEY_KINDS for c in spec.key) and spec.order_by != SOURCE_LSN)
        self.typed_fields = {KEY: "string", **self.fields}
        # Avro through the registry: each schema id's writer (avro.registry_writer), and of a value's writer its
        # logical types and, collecting new fields, what its `after` record adds (WriterColumns).
        self.writers: dict[int, Any] = {}
        self.images: dict[int, tuple[dict, WriterColumns | None]] = {}
        self.convert = avro_convert if spec.registry is not None else _convert

    def event(self, value: bytes | None, key: bytes | None = None) -> Event:
        spec = self.spec
        if spec.envelope == "debezium":
            return self._debezium(value, key)
        if value is None:  # a Kafka tombstone
            raw, why = _record_key(key, spec.key)
            if raw is None:
                return Event(_bad("missing_key", why or "no key"))
            return self._typed(raw, raw, DELETE, None)
        if (wrong := size_error(value, self.max_bytes)) is not None:
            return Event(wrong)
        obj, bad = debezium._json_object(value, "payload")
        if bad is not None:
            return Event(_bad(bad.error_type or "invalid_json", bad.error or ""))
        if not isinstance(obj, dict):
            return Event(_bad("not_an_object", f"payload is a JSON {type(obj).__name__}, expected an object"))
        missing = [c for c in spec.key if obj.get(c) is None]
        if missing:
            what = "missing" if any(c not in obj for c in missing) else "null"
            return Event(_bad("missing_key", f"key column{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
                                             f"{what} in the payload"))
        return self._typed(obj, {c: obj[c] for c in spec.key}, UPSERT, None)

    def _change_key(self, key: bytes | None) -> tuple[Any, Decoded | None]:
        """A change event's record key -> (its columns, None) or (None, its dead letter); (None, None) without
        one. Through the registry a framed key is read with its writer's schema; any other key is JSON (Kafka
        Connect's, or a DLQ replay's copy, which carries the key's text)."""
        if key is None or len(key) == 0:
            return None, None
        key = bytes(key)
        if self.spec.registry is not None and key[0] == 0:
            record_key, _, bad = registry_datum(key, self.spec.registry, self.writers, "record key")
            return record_key, bad
        record_key, parsed_bad = debezium._json_object(key, "record key")
        if parsed_bad is not None:
            return None, _bad(parsed_bad.error_type or "invalid_json", parsed_bad.error or "")
        return record_key, None

    def _json_value(self, value: bytes, key_id: str | None) -> tuple | Event:
        """A JSON change event's (envelope, logical types, None: new fields are typed from their values), or its
        dead letter."""
        wrapped, bad = debezium.json_value(value)
        if bad is not None:
            return Event(_bad(bad.error_type or "invalid_json", bad.error or "", key_id))
        named = logical_types(wrapped.get("schema")) \
            if isinstance(wrapped, dict) and debezium.unwrap(wrapped) is not wrapped else {}
        return debezium.unwrap(wrapped), named, None

    def _avro_value(self, value: bytes, key_id: str | None) -> tuple | Event:
        """An Avro change event's (envelope, logical types, what its writer's `after` adds: WriterColumns when
        collecting new fields) read with its writer's schema, or its dead letter."""
        assert self.spec.registry is not None  # only Avro pipelines read through here
        envelope, schema_id, bad = registry_datum(bytes(value), self.spec.registry, self.writers, "payload")
        if bad is not None:
            return Event(bad._replace(message_id=key_id))
        assert schema_id is not None  # read with a writer's schema
        if schema_id not in self.images:
            parsed = self.writers[schema_id][1]
            adds = writer_columns(avro_writer(image_kinds(parsed)), self.fields, self.evolved) \
                if self.collect_new else None
            self.images[schema_id] = (avro_logical_types(parsed), adds)
        return (envelope, *self.images[schema_id])

    def _debezium(self, value: bytes | None, key: bytes | None) -> Event:
        record_key, key_bad = self._change_key(key)
        key_id = key_text(record_key) if isinstance(record_key, dict) else None
        envelope, named, adds = None, {}, None
        if value is not None:
            if (wrong := size_error(value, self.max_bytes)) is not None:
                return Event(wrong._replace(message_id=key_id))
            got = (self._avro_value if self.spec.registry is not None else self._json_value)(value, key_id)
            if isinstance(got, Event):
                return got
            envelope, named, adds = got
        if key_bad is not None:
            return Event(key_bad)
        parsed = debezium.parse_record(envelope, record_key, key_columns=self.spec.key)
        change = parsed.change
        if change is None:
            return Event(_bad(parsed.error_type or "invalid_envelope", parsed.error or "", key_id))
        if change.kind == Kind.TRUNCATE:
            return Event(Decoded((None,) * len(self.fields), None, None, None), debezium.truncated_where(change),
                         TRUNCATE, None)
        assert change.key is not None  # parse_record gives every row change its key
        if change.kind == Kind.UPSERT:
            image = plain(change.after, named.get("after", {}))
            return self._typed(image or {}, change.key, UPSERT, change, adds)
        image = {**(plain(change.before, named.get("before", {})) or {}), **change.key}
        return self._typed(image, change.key, DELETE, change)

    def _typed(self, image: dict, raw_key: dict, what: str, change, adds: WriterColumns | None = None) -> Event:
        """`adds`: what the writer of an upsert's Avro change event adds (its new fields are typed by its
        schema, as an insert pipeline's with a registry); None: new fields are typed from their values."""
        spec = self.spec
        deleting = what == DELETE
        if unknown := [c for c in raw_key if c not in self.fields]:
            return Event(_bad("missing_key", f"key column{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} "
                                             "not in schema.fields: declare them to keep the key in the table"))
        record = {**image, **{c: v for c, v in raw_key.items()}}
        extra: str | None = None
        kinds: str | None = None
        problem: str | None = None
        if self.collect_new and what == UPSERT and adds is not None:
            # Taken out of the record: a widened evolved field is not also typed by its narrower column.
            extra, kinds, problem = writer_extras(record, adds, self.convert)
        got = record_values(record, fields=self.typed_fields, id_field=KEY, required=[] if deleting else self.required,
                            message_id="-", evolved=self.evolved, convert=self.convert)
        if got.values is None:
            return Event(got._replace(message_id=None))
        typed = dict(zip(self.typed_fields, got.values, strict=True))
        typed_key = {c: typed[c] for c in raw_key}
        if unset := sorted(c for c, v in typed_key.items() if v is None):
            return Event(_bad("missing_key", f"key column{'s' if len(unset) > 1 else ''} {', '.join(unset)} null"))
        text = key_text(typed_key)
        if not deleting and spec.delete_field is not None and typed.get(spec.delete_field) == spec.delete_equals \
                and typed.get(spec.delete_field) is not None:
            what = DELETE
        order = None
        if spec.order_by == SOURCE_LSN:
            lsn = change.source.lsn if change is not None and change.source is not None else None
            order = lsn if isinstance(lsn, int) else None
        elif spec.order_by != "position":
            order = typed.get(spec.order_by)
        values = (text, *got.values[1:])
        if self.collect_new and what == UPSERT:
            if adds is None:
                extra, kinds, problem = new_fields(image, set(self.fields), {n.lower() for n in self.fields})
            if problem:
                return Event(_bad("schema", problem, text))
            values = (*values, extra, kinds)
        elif self.collect_new:
            values = (*values, None, None)
        return Event(Decoded(values, text, None, None), text, what, order)

    def one(self, value, fallback_id=None, message_id=None) -> Decoded:
        return self.event(value).decoded

    def columns(self, values: list, *, fallback_ids: list | None = None, message_ids: list | None = None,
                preset: dict | None = None, keys: list | None = None) -> dict:
        """As BatchDecoder.columns, plus UPSERT_COLUMNS; `keys`: the records' keys (Kafka), or None."""
        preset = preset or {}
        if not self.columnwise:
            return self._one_by_one(values, preset, keys)
        candidates = [i for i, value in enumerate(values) if i not in preset and value is not None
                      and len(value) <= self.max_bytes and self._candidate(value)]
        slow = sorted(set(range(len(values))) - set(candidates))
        fast_rows, fast_cols = self._columnwise(values, candidates, slow)
        slow.sort()
        at = {i: n for n, i in enumerate(slow)}
        slow_cols = self._one_by_one([values[i] for i in slow], {at[i]: preset[i] for i in preset},
                                     [keys[i] for i in slow] if keys else None)
        if not fast_rows:
            return slow_cols
        return merged(len(values), fast_rows, fast_cols, slow, slow_cols)

    def _columnwise(self, values: list, candidates: list[int], slow: list[int]) -> tuple[list[int], dict]:
        """`event` of plain JSON states, column by column: the rows it settles and their columns (the same as
        `event` gives: tests/unit/test_changes_columnwise.py). A row with a null key column or required field,
        a key text that needs escaping, or anything `BatchDecoder._fast` leaves to `decode` goes to `slow`."""
        import pyarrow as pa
        import pyarrow.compute as pc

        if (got := self._parsed(values, candidates, slow)) is None:
            return [], {}
        rows, table = got
        refer = table.column("__unusual").combine_chunks()
        cols = {name: table.column(name).combine_chunks() for name in self.fields}
        for name in {*self.required, *self.spec.key}:
            refer = pc.or_(refer, cols[name].is_null())
        for name, kind in self.fields.items():
            if kind == "double":
                refer = pc.or_(refer, pc.fill_null(pc.invert(pc.is_finite(cols[name])), False))
        pieces = []
        for name in sorted(self.spec.key):  # key_text's canonical JSON: sorted names, no spaces
            col = cols[name]
            if self.fields[name] == "string":
                refer = pc.or_(refer, pc.fill_null(pc.match_substring_regex(col, ESCAPED), True))
                text = pc.binary_join_element_wise('"', col, '"', "")
            else:
                text = pc.cast(col, pa.string())
            pieces.append(pc.binary_join_element_wise(json.dumps(name, ensure_ascii=False) + ":", text, ""))
        key = pc.binary_join_element_wise("{", pc.binary_join_element_wise(*pieces, ","), "}", "")
        keep = pc.invert(refer)
        referred = refer.to_pylist()
        slow.extend(i for i, r in zip(rows, referred, strict=True) if r)
        fast_rows = [i for i, r in zip(rows, referred, strict=True) if not r]
        m = len(fast_rows)
        key = key.filter(keep)
        change = pa.array([UPSERT] * m, pa.string())
        if (gone := self.spec.delete_field) is not None:
            deleted = [v is not None and v == self.spec.delete_equals for v in cols[gone].filter(keep).to_pylist()]
            change = pa.array([DELETE if d else UPSERT for d in deleted], pa.string())
        order = cols[self.spec.order_by].filter(keep) if self.spec.order_by != "position" else pa.nulls(m)
        out = {"_dd_message_id": key, "_dd_error_type": pa.nulls(m, pa.string()), "_dd_error": pa.nulls(m, pa.string()),
               "_dd_original": pa.nulls(m, pa.binary()), "_dd_first_failure_at": pa.nulls(m, pa.timestamp("us", tz="UTC"))}
        out.update({name: cols[name].filter(keep).cast(self.types[name]) for name in self.fields})
        out.update({KEY: key, CHANGE: change, ORDER: order.cast(self.types[ORDER])})
        return fast_rows, out

    def _one_by_one(self, values: list, preset: dict, keys: list | None) -> dict:
        """`columns` message by message (`event`)."""
        import pyarrow as pa

        if self.spec.registry is not None:  # every writer found before a message is judged: an outage fails here
            for schema_id in {*ids_of(values), *ids_of(keys or [])}:
                registry_writer(self.spec.registry, self.writers, schema_id)
        extra = self.collect_new
        width = len(self.fields) + 2 * extra
        records = []
        for i, value in enumerate(values):
            if i in preset:
                records.append((*preset[i], *(None,) * width, None, None, None))
                continue
            try:
                ev = self.event(value, keys[i] if keys else None)
            except RegistryFailure:  # an outage is the run's failure, not the message's
                raise
            except Exception as exc:  # a way to be bad not known yet: still data (invariant 7)
                ev = Event(_bad("undecodable", f"payload could not be decoded: {type(exc).__name__}: {exc}"[:500]))
            got = ev.decoded
            if got.values is None:
                records.append((got.message_id, got.error_type, got.error, value, None, *(None,) * width,
                                None, None, None))
                continue
            row = got.values[1:] if ev.change != TRUNCATE else got.values
            if ev.change == TRUNCATE and extra:
                row = (*row, None, None)
            keep = value if extra and ev.change == UPSERT and row[-2] else None
            records.append((got.message_id, None, None, keep, None, *row, ev.key, ev.change, ev.order))
        names = [*OUT_COLUMNS, *self.fields, *(EXTRA_COLUMNS if extra else ()), *UPSERT_COLUMNS]
        types = [pa.string(), pa.string(), pa.string(), pa.binary(), pa.timestamp("us", tz="UTC"),
                 *(self.types[name] for name in self.fields), *((pa.string(), pa.string()) if extra else ()),
                 pa.string(), pa.string(), self.types[ORDER]]
        columns = list(zip(*records, strict=True)) if records else [()] * len(names)
        return {name: pa.array(list(col), type=kind) for name, kind, col in zip(names, types, columns, strict=True)}
