"""Avro payloads (`schema.format: avro`): one schemaless Avro datum per message, written with the
pipeline's schema file, optionally in the Confluent wire format (magic byte 0, 4-byte big-endian
schema id, then the datum). Decoded into the same typed values as a JSON payload (deltadrain.formats.decode),
so staging, the MERGE, the DLQ, replays and backfills do not know the difference. No Spark; no I/O
beyond reading the schema file and, with a registry, asking it (deltadrain.formats.registry).

Without a schema registry the writer's schema is the configured file, and a Confluent-framed message
whose id is not the configured one is a dead letter ("unknown schema id N"). With one
(`schema.registry`, deltadrain.formats.registry) each message is read with the writer's schema its id names,
and the declared fields are taken from it by name: a field that schema lacks is null (a `schema` dead
letter when required), and one it gives another type a `schema` dead letter when a value does not fit.
"""

from __future__ import annotations

import io
import json
import uuid
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any, cast

from deltadrain.formats.confluent import HEADER, frame_error, header, schema_id_of
from deltadrain.formats.decode import (
    CONVERTERS,
    EXTRA_COLUMNS,
    BatchDecoder,
    Decoded,
    _bad,
    record_values,
    size_error,
)
from deltadrain.formats.registry import Registry, ids_of, registry_of, writer
from deltadrain.schema.evolution import WriterColumns, avro_writer, writer_columns, writer_extras

# What each declared type accepts, by the Avro "kind" of a field (its type, or its logical type):
# checked at config load, so a schema that can never fill a column is a config error, not a DLQ full
# of messages. A long without a logical type fills a timestamp as epoch milliseconds, as in JSON.
NUMBERS = {"int", "long", "float", "double", "decimal"}
ACCEPTS = {
    "string": {"string", "uuid", "enum"}, "long": {"int", "long"}, "int": {"int", "long"},
    "integer": {"int", "long"}, "double": NUMBERS, "float": NUMBERS, "boolean": {"boolean"},
    "timestamp": {"timestamp", "long", "string"}, "date": {"date", "string"}, "binary": {"bytes", "fixed"},
    "decimal(18,2)": {"decimal", "int", "long"}, "decimal(38,9)": {"decimal", "int", "long"},
}
ID_KINDS = {"string", "uuid", "int", "long"}  # ids are merged on their text, as JSON integer ids are
LOGICAL = {"timestamp-millis": "timestamp", "timestamp-micros": "timestamp", "local-timestamp-millis": "timestamp",
           "local-timestamp-micros": "timestamp", "date": "date", "decimal": "decimal", "uuid": "uuid",
           "time-millis": "time", "time-micros": "time"}


@dataclass(frozen=True)
class AvroPayload:
    """What a decoding task needs (pickled with it): the writer's schema as JSON text, parsed once per task."""

    schema_json: str  # "" with a registry and no schema file
    wire: str = "plain"  # or "confluent"
    schema_id: int | None = None
    registry: Registry | None = None
    _parsed: list = field(default_factory=list, compare=False, repr=False)

    def parsed(self):
        if not self._parsed:
            import fastavro

            self._parsed.append(fastavro.parse_schema(json.loads(self.schema_json)))
        return self._parsed[0]

    def decoder(self, **kwargs) -> BatchDecoder:
        return AvroBatchDecoder(self, **kwargs)


def load_schema(path: Path) -> dict:
    """The Avro schema in `path`, parsed and checked by fastavro; ValueError with the reason otherwise."""
    import fastavro
    from fastavro.schema import SchemaParseException, UnknownType

    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"Avro schema file {path} not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read the Avro schema file {path}: {type(exc).__name__}: {exc}") from None
    try:
        schema = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"Avro schema file {path} is not JSON: {exc}") from None
    try:
        fastavro.parse_schema(schema)
    except (SchemaParseException, UnknownType, ValueError, TypeError, AttributeError, KeyError) as exc:
        raise ValueError(f"Avro schema file {path} is not a valid Avro schema: {type(exc).__name__}: {exc}") from None
    if not isinstance(schema, dict) or schema.get("type") != "record":
        raise ValueError(f"Avro schema file {path} must hold a record schema (one column per field)")
    return schema


def named_types(schema: Any, names: dict) -> dict:
    """Every named type (record, enum, fixed) in a parsed schema, by full name."""
    if isinstance(schema, list):
        for branch in schema:
            named_types(branch, names)
    elif isinstance(schema, dict):
        if schema.get("type") in ("record", "error", "enum", "fixed") and "name" in schema:
            names[schema["name"]] = schema
        for f in schema.get("fields", ()):
            named_types(f["type"], names)
        for key in ("items", "values"):
            if key in schema:
                named_types(schema[key], names)
        if isinstance(schema.get("type"), dict | list):
            named_types(schema["type"], names)
    return names


def kinds_of(t: Any, names: dict) -> set[str]:
    """The Avro kinds a field of type `t` can carry ("null" for an optional one)."""
    if isinstance(t, list):
        return set().union(*(kinds_of(b, names) for b in t))
    if isinstance(t, str):
        return kinds_of(names[t], names) if t in names else {t}
    logical = t.get("logicalType")
    if logical in LOGICAL:
        return {LOGICAL[logical]}
    inner = t["type"]
    return kinds_of(inner, names) if isinstance(inner, dict | list) or inner in names else {inner}


def field_problems(schema: dict, fields: dict[str, str], id_field: str) -> list[str]:
    """Why the Avro record schema cannot fill the declared fields (empty: it can)."""
    import fastavro

    parsed = cast(dict, fastavro.parse_schema(schema))  # a record's schema parses to a dict
    names = named_types(parsed, {})
    avro_fields = {f["name"]: f["type"] for f in parsed["fields"]}
    problems = []
    for name, kind in fields.items():
        if name not in avro_fields:
            problems.append(f"field '{name}' is not in the Avro schema (its fields: {', '.join(avro_fields)})")
            continue
        carried = kinds_of(avro_fields[name], names) - {"null"}
        accepts = ID_KINDS if name == id_field else ACCEPTS[kind]
        if not carried or carried - accepts:
            problems.append(f"field '{name}' is {kind} but the Avro schema gives it "
                            f"{' or '.join(sorted(carried or {'null'}))} (a {kind} column takes "
                            f"{', '.join(sorted(accepts))})")
    return problems


def _utc(v: datetime) -> datetime:
    return v.replace(tzinfo=UTC) if v.tzinfo is None else v.astimezone(UTC)  # local-timestamp-*: read as UTC


def convert(kind: str, v: Any) -> Any:
    """A decoded Avro value -> the declared column type; TypeError/ValueError/OverflowError when the
    column cannot hold it (an int beyond 32 bits, NaN, a decimal with too many digits)."""
    if kind == "binary":
        if isinstance(v, bytes):
            return v
        raise TypeError
    if kind == "timestamp" and isinstance(v, datetime):
        return _utc(v)
    if kind == "date" and isinstance(v, date) and not isinstance(v, datetime):
        return v
    if kind == "string" and isinstance(v, uuid.UUID):
        return str(v)
    return CONVERTERS[kind](v)  # the JSON path's checks: ranges, finiteness, exact decimals, ISO text


def read_datum(body: bytes, parsed, what: str = "Avro body") -> tuple[Any, Decoded | None]:
    """One schemaless datum that must fill `body` exactly: (its value, None), or (None, the dead letter:
    `truncated` when the bytes end inside it, `invalid_avro` when they were not written with `parsed`).
    `what` names the bytes in the reason (a payload's body, a record key)."""
    import fastavro

    fo = io.BytesIO(body)
    try:
        value = fastavro.schemaless_reader(fo, parsed, None)
    except EOFError as exc:
        if "Expected -" in str(exc):  # a negative length: not Avro written with this schema, not a short one
            return None, _bad("invalid_avro", f"{what} does not match the schema: a negative length ({exc})")
        return None, _bad("truncated", f"{what} of {len(body)} bytes ends before its datum does ({exc})")
    except IndexError as exc:
        if "string index" in str(exc):  # fastavro's varint reader ran past the end of the body
            return None, _bad("truncated", f"{what} of {len(body)} bytes ends before its datum does (in a number)")
        return None, _bad("invalid_avro", f"{what} does not match the schema: a union or enum index out of range "
                                          f"({exc})")
    except Exception as exc:  # garbage read as bad UTF-8, a huge length, ...
        return None, _bad("invalid_avro", f"{what} does not match the schema: {type(exc).__name__}: {exc}"[:300])
    if fo.tell() != len(body):
        return None, _bad("invalid_avro", f"{what} has {len(body) - fo.tell()} bytes after its datum of {fo.tell()} "
                                          f"bytes: not written with this schema")
    return value, None


def decode_avro(data: bytes | None, payload: AvroPayload, *, fields: dict[str, str], id_field: str,
                required: list[str], max_bytes: int, fallback_id: str | None = None,
                message_id: str | None = None, writer_of=None, columns_of=None) -> Decoded:
    """Bytes -> typed values, or the reason they cannot be; the same contract as decode.decode.
    `writer_of(schema_id)`: with a registry, the parsed writer's schema of an id, or the dead letter of
    its messages (AvroBatchDecoder.writer_of). `columns_of(schema_id)`: collecting new fields (add_columns
    with a registry), what that writer adds (deltadrain.schema.evolution.WriterColumns), whose values end the
    values as decode.decode's new fields do."""

    if (wrong := size_error(data, max_bytes)) is not None:
        return wrong
    assert data is not None  # size_error refused it
    body, schema = data, None
    if payload.wire == "confluent":
        if (wrong := frame_error(data, payload.schema_id)) is not None:
            return wrong
        body = data[HEADER:]
        if payload.registry is not None:
            schema = writer_of(schema_id_of(data))
            if isinstance(schema, Decoded):
                return schema
    record, wrong = read_datum(body, schema or payload.parsed())
    if wrong is not None:
        return wrong
    if isinstance(record.get(id_field), uuid.UUID):
        record[id_field] = str(record[id_field])
    if columns_of is None:
        return record_values(record, fields=fields, id_field=id_field, required=required, fallback_id=fallback_id,
                             message_id=message_id, convert=convert)
    columns = columns_of(schema_id_of(data)) if payload.registry is not None else WriterColumns()
    extra, kinds, problem = writer_extras(record, columns, convert)
    got = record_values(record, fields=fields, id_field=id_field, required=required, fallback_id=fallback_id,
                        message_id=message_id, convert=convert)
    if got.values is None:
        return got
    if problem:
        return _bad("schema", problem, got.message_id)
    return got._replace(values=(*got.values, extra, kinds))


# Column-wise Avro: the datums are read one by one (fastavro has no batch read of schemaless datums),
# but their values go to Arrow a column at a time instead of through `convert`. Rules that keep this
# identical to `decode_avro` (tests/unit/test_avro.py checks them):
# - only fields whose Avro kinds Arrow converts as `convert` does take this path (FAST_AVRO); a schema
#   with any other declared field decodes message by message;
# - a datum fastavro refuses or does not read to its end, a row without a usable id, a required field
#   that is null, or a double that is not finite goes to `decode_avro`;
# - a column Arrow refuses (an int beyond 32 bits) sends the whole chunk to `decode_avro`.
FAST_AVRO = {"string": {"string", "enum"}, "long": {"int", "long"}, "int": {"int", "long"},
             "integer": {"int", "long"}, "double": {"int", "long", "float", "double"}, "boolean": {"boolean"},
             "timestamp": {"timestamp"}, "date": {"date"}, "binary": {"bytes", "fixed"}}


def fast_path_fits(schema: dict, fields: dict[str, str], id_field: str) -> bool:
    """Whether every declared field's Avro kinds are ones Arrow converts exactly as `convert` does."""
    import fastavro

    parsed = cast(dict, fastavro.parse_schema(schema))  # a record's schema parses to a dict
    names = named_types(parsed, {})
    kinds = {f["name"]: kinds_of(f["type"], names) - {"null"} for f in parsed["fields"]}
    return all(name in kinds and kinds[name] <= ({"string"} if name == id_field else FAST_AVRO.get(kind, set()))
               for name, kind in fields.items())


def with_imports(schema: Any, imports: dict[str, Any]) -> Any:
    """A schema that names types other registered schemas define (a registry's references) -> one schema that
    defines each where it is first used, in the order Avro reads a schema (its fields in order, depth first)."""
    seen: set[str] = set()

    def walk(node: Any) -> Any:
        if isinstance(node, str):
            if node in imports and node not in seen:
                seen.add(node)
                return walk(imports[node])
            return node
        if isinstance(node, list):
            return [walk(branch) for branch in node]
        if isinstance(node, dict):
            return {k: walk(v) if k in ("type", "items", "values", "fields") else v for k, v in node.items()}
        return node

    return walk(schema)


def parse_writer(found, schema_id: int):
    """A registry's writer (deltadrain.formats.registry.Writer) -> (its schema as JSON, parsed) or the dead letter
    of the messages of its id."""
    import fastavro

    if found.text is None:
        return _bad(found.error_type, found.error)
    try:
        schema = json.loads(found.text)
        if found.imports:
            schema = with_imports(schema, {name: json.loads(text) for name, text in found.imports})
        parsed = cast(dict, fastavro.parse_schema(schema))  # a record's schema parses to a dict
    except Exception as exc:  # not JSON, not Avro: the registry holds what its producer registered
        return _bad("unsupported_schema", f"schema id {schema_id} is not a valid Avro schema: "
                                          f"{type(exc).__name__}: {exc}"[:300])
    if not isinstance(schema, dict) or schema.get("type") != "record":
        return _bad("unsupported_schema", f"schema id {schema_id} is not an Avro record schema (one column per field)")
    return schema, parsed


def registry_writer(registry: Registry, writers: dict, schema_id: int):
    """`parse_writer` of the registry's writer of `schema_id`, kept in `writers` (a decoder's, per id): asked
    once per decoder; an outage raises the registry's failure (the run fails, nothing is judged)."""
    if schema_id not in writers:
        writers[schema_id] = parse_writer(writer(registry, schema_id, "AVRO"), schema_id)
    return writers[schema_id]


def registry_datum(data: bytes, registry: Registry, writers: dict, what: str) -> tuple[Any, int | None, Decoded | None]:
    """A non-empty Confluent-framed datum read with its writer's schema from the registry: (the value, its
    schema id, None), or (None, None, the dead letter: not framed, an id the registry does not know or that
    is no Avro record schema, bytes not written with it). `what` names the bytes in the reason."""
    if (wrong := frame_error(data, None)) is not None:
        return None, None, _bad(wrong.error_type or "invalid_avro", f"{what}: {wrong.error}")
    schema_id = schema_id_of(data)
    assert schema_id is not None  # frame_error passed: the bytes are framed
    got = registry_writer(registry, writers, schema_id)
    if isinstance(got, Decoded):
        return None, None, got._replace(error=f"{what}: {got.error}")
    value, wrong = read_datum(data[HEADER:], got[1], f"{what} (schema id {schema_id})")
    return (None, None, wrong) if wrong is not None else (value, schema_id, None)


class AvroBatchDecoder(BatchDecoder):
    """BatchDecoder for Avro payloads: `decode_avro` is the definition, the column-wise path its shortcut.
    With a registry, the writers of a batch's ids are found before anything is decoded (`columns`), once
    per id: an outage fails the task there, and no message is judged without its schema."""

    def __init__(self, payload: AvroPayload, **kwargs):
        super().__init__(**kwargs)
        self.payload = payload
        # schema id -> (schema, parsed, fits the fast path, what it adds: WriterColumns) or a dead letter
        self.writers: dict[int, tuple | Decoded] = {}
        # With a registry each id's writer decides (`_candidate`).
        self.fast = payload.registry is not None or fast_path_fits(json.loads(payload.schema_json), self.fields,
                                                                   self.id_field)

    def writer_of(self, schema_id: int):
        """The parsed writer's schema of `schema_id`, or the dead letter of its messages (asked once)."""
        if schema_id not in self.writers:
            assert self.payload.registry is not None  # asked only with a registry
            got = parse_writer(writer(self.payload.registry, schema_id, "AVRO"), schema_id)
            if not isinstance(got, Decoded):
                columns = self._writer_columns(got[1]) if self.collect_new else WriterColumns()
                got = (*got, fast_path_fits(got[0], self.fields, self.id_field) and not columns.adds, columns)
            self.writers[schema_id] = got
        got = self.writers[schema_id]
        return got if isinstance(got, Decoded) else got[1]

    def _writer_columns(self, parsed) -> WriterColumns:
        names = named_types(parsed, {})
        return writer_columns(avro_writer({f["name"]: kinds_of(f["type"], names) for f in parsed["fields"]}),
                              self.fields, self.evolved)

    def columns_of(self, schema_id: int) -> WriterColumns:
        """What the writer of `schema_id` adds (asked for after `writer_of` found it)."""
        got = self.writers.get(schema_id)
        return got[3] if isinstance(got, tuple) else WriterColumns()

    def columns(self, values: list, **kwargs) -> dict:
        if self.payload.registry is not None:
            wanted = self.payload.schema_id
            for schema_id in ids_of(values):
                if wanted is None or schema_id == wanted:
                    self.writer_of(schema_id)
        return super().columns(values, **kwargs)

    def one(self, value, fallback_id=None, message_id=None) -> Decoded:
        return decode_avro(value, self.payload, fields=self.fields, id_field=self.id_field, required=self.required,
                           max_bytes=self.max_bytes, fallback_id=fallback_id, message_id=message_id,
                           writer_of=self.writer_of, columns_of=self.columns_of if self.collect_new else None)

    def _candidate(self, value) -> bool:
        if not value:
            return False
        if self.payload.wire != "confluent":
            return True
        schema_id = schema_id_of(value)
        if self.payload.registry is None:
            return schema_id == self.payload.schema_id
        got = self.writers.get(schema_id) if schema_id is not None else None
        return isinstance(got, tuple) and got[2]

    def _fast(self, values, candidates, fallback_ids, message_ids, slow):
        if self.payload.registry is None:
            return self._fast_with(self.payload.parsed(), values, candidates, fallback_ids, message_ids, slow)
        import pyarrow as pa

        rows, parts = [], []
        for schema_id, group in ids_of([values[i] for i in candidates]).items():
            got_rows, cols = self._fast_with(self.writers[schema_id][1], values, [candidates[j] for j in group],
                                             fallback_ids, message_ids, slow)
            if got_rows:
                rows += got_rows
                parts.append(cols)
        if len(parts) <= 1:
            return rows, parts[0] if parts else {}
        return rows, {name: pa.concat_arrays([p[name] for p in parts]) for name in parts[0]}

    def _fast_with(self, schema, values, candidates, fallback_ids, message_ids, slow):
        import fastavro
        import pyarrow as pa

        skip = HEADER if self.payload.wire == "confluent" else 0
        rows, records = [], []
        for i in candidates:
            body = values[i]
            fo = io.BytesIO(body)
            fo.seek(skip)
            try:
                record = fastavro.schemaless_reader(fo, schema, None)
            except Exception:
                slow.append(i)
                continue
            if fo.tell() != len(body):
                slow.append(i)
                continue
            raw = record.get(self.id_field)
            message_id = ((message_ids[i] if message_ids else None) or (raw if type(raw) is str and raw.strip() else None)
                          or (fallback_ids[i] if fallback_ids and raw is None else None))
            if message_id is None or any(record.get(name) is None for name in self.required if name != self.id_field):
                slow.append(i)
                continue
            record[self.id_field] = message_id
            rows.append(i)
            records.append(record)
        if not rows:
            return [], {}
        try:
            cols = {name: pa.array([r.get(name) for r in records], type=self.types[name]) for name in self.fields}
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            slow.extend(rows)
            return [], {}
        keep = [True] * len(rows)
        for name, kind in self.fields.items():
            if kind == "double":
                import pyarrow.compute as pc

                bad = pc.fill_null(pc.invert(pc.is_finite(cols[name])), False).to_pylist()
                keep = [k and not b for k, b in zip(keep, bad, strict=True)]
        if not all(keep):
            slow.extend(i for i, k in zip(rows, keep, strict=True) if not k)
            mask = pa.array(keep)
            rows = [i for i, k in zip(rows, keep, strict=True) if k]
            cols = {name: col.filter(mask) for name, col in cols.items()}
        m = len(rows)
        out = {"_dd_message_id": cols[self.id_field], "_dd_error_type": pa.nulls(m, pa.string()),
               "_dd_error": pa.nulls(m, pa.string()), "_dd_original": pa.nulls(m, pa.binary()),
               "_dd_first_failure_at": pa.nulls(m, pa.timestamp("us", tz="UTC"))}
        out.update(cols)
        if self.collect_new:  # the fast path takes only writers that add nothing
            out.update({name: pa.nulls(m, pa.string()) for name in EXTRA_COLUMNS})
        return rows, out


def payload_of(schema_config) -> AvroPayload | None:
    """The Avro payload spec of a pipeline's `schema:` block, None for JSON. The file was checked when
    the config was loaded (config.parse_config), which also made its path absolute."""
    if schema_config.format != "avro":
        return None
    avro = schema_config.avro
    text = json.dumps(load_schema(Path(avro.schema_file))) if avro.schema_file else ""
    return AvroPayload(text, avro.wire, avro.schema_id, registry_of(schema_config))


def encode(record: dict, schema: dict, *, wire: str = "plain", schema_id: int | None = None) -> bytes:
    """One record as a schemaless Avro datum, framed for `wire` (producers: deltadrain produce, tests)."""
    import fastavro

    out = io.BytesIO()
    if wire == "confluent":
        out.write(header(schema_id or 0))
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return out.getvalue()
