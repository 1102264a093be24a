"""Schema evolution (`schema.evolution: add_columns`): the pure decisions. No Spark, no I/O.

The target table's own schema (read from its Delta log) is the state: a column the table has and the
config does not declare is an evolved column, and it types the later values of its field. A field
that is in neither becomes a new nullable column in the commit of the first batch that carries it
(`MERGE WITH SCHEMA EVOLUTION`). Declared types the config widened (int -> long, float -> double)
widen the table's column in the next batch's commit (Delta's type widening).
"""

from __future__ import annotations

import base64
import json
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from deltadrain.schema.types import ALIASES, SPARK_CLASSES, decimal_of

# An integer in a JSON payload makes a long column within this range (a double beyond it).
LONG_RANGE = (-(2**63), 2**63)
# Delta (without column mapping) refuses these in a column name.
BAD_NAME_CHARS = set(" ,;{}()\n\t=")
# Declared type changes Delta widens a column for (its type widening table feature): the table's
# type -> the types it may become.
WIDENS = {"int": {"long"}, "float": {"double"}}
# The config's name for a type Delta's log (and the config itself) also calls otherwise.
DELTA_NAMES = ALIASES
# The column types a run decodes values into (deltadrain.formats.decode.CONVERTERS): every supported
# type under its column's own name.
FILLABLE = frozenset(SPARK_CLASSES)
# Which values fit an evolved column: a JSON value's kind -> the column types that take it.
FITS = {"boolean": {"boolean"}, "long": {"long", "double"}, "double": {"double"}, "string": {"string"},
        "object": {"string"}}
# Avro kinds (deltadrain.formats.avro.kinds_of) -> the column a new field gets; a union of kinds takes the
# widest of a numeric pair, any other mix adds no column.
AVRO_COLUMNS = {"boolean": "boolean", "int": "int", "long": "long", "float": "float", "double": "double",
                "string": "string", "enum": "string", "uuid": "string", "bytes": "binary", "fixed": "binary",
                "timestamp": "timestamp", "date": "date"}
AVRO_PAIRS = {frozenset({"int", "long"}): "long", frozenset({"float", "double"}): "double"}
# The decimal column types, narrowest first (`decimal_column`).
DECIMALS = sorted((d for d in map(decimal_of, SPARK_CLASSES) if d is not None), key=lambda d: d[0])
# Protobuf kinds (deltadrain.formats.protobuf.kind_of) -> the column a new field gets: int32 and its sint/sfixed
# forms hold 32 bits, as an int column does; uint32 needs a long. Repeated, map and other message
# fields add no column.
PROTOBUF_COLUMNS = {"int32": "int", "uint32": "long", "int64": "long", "uint64": "long", "float": "float",
                    "double": "double", "bool": "boolean", "string": "string", "enum": "string", "bytes": "binary",
                    "timestamp": "timestamp"}
# Writer-typed new fields (a registry's writer schemas): the types one column takes, the widest winning.
FAMILY = {"int": "long", "long": "long", "float": "double", "double": "double"}
WIDTH = {"int": 0, "long": 1, "float": 0, "double": 1}
# A left-out field in a writer's kinds (`WriterColumns.signature`): this prefix, then the reason.
LEFT_OUT = "-"


class EvolutionError(ValueError):
    """A change of the table's schema deltadrain cannot make: the run stops with this line."""


def table_type(delta_type: str) -> str:
    """A Delta log's primitive type name -> the config's name for it ("integer" -> "int")."""
    return DELTA_NAMES.get(delta_type, delta_type)


def json_kind(value: Any) -> str | None:
    """The kind of a parsed JSON value (numbers as Decimal or int): boolean, long, double, string or
    object (an object or array); None for null. ValueError for a number no column holds (NaN, inf)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "long" if LONG_RANGE[0] <= value < LONG_RANGE[1] else _finite_double(value)
    if isinstance(value, float | Decimal):
        return _finite_double(value)
    if isinstance(value, str):
        return "string"
    return "object"


def _finite_double(value) -> str:
    try:
        if math.isfinite(float(value)):
            return "double"
    except OverflowError:
        pass
    raise ValueError(f"{value} is not a finite number")


def json_text(value: Any) -> str:
    """A parsed JSON value as compact JSON text, numbers exactly as written (they are read as Decimal)."""
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(k, ensure_ascii=False)}:{json_text(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(json_text(v) for v in value) + "]"
    if isinstance(value, Decimal):
        return str(value)
    return json.dumps(value, ensure_ascii=False)


def name_problem(name: str, taken: set[str]) -> str | None:
    """Why a payload field cannot become a column, or None. `taken`: the lower-cased names of the
    columns the table has or the config declares (Spark resolves names case-insensitively)."""
    if not name.strip() or "`" in name or BAD_NAME_CHARS & set(name):
        return f"field '{name[:60]}' cannot be a column: a column name must not be blank or hold a backtick, " \
               "space or any of ,;{}()=, tab or newline"
    if name.lower().startswith("_dd_"):
        return f"field '{name[:60]}' cannot be a column: names starting with _dd_ are deltadrain's own columns"
    if name.lower() in taken:
        return f"field '{name[:60]}' collides with a column of another case (column names are case-insensitive)"
    return None


def fit(column: str, value: Any, convert) -> Any:
    """`value` typed for an evolved column of type `column`; TypeError when it does not fit. An integer
    fits a double column (widened), an object or array a string column (as its JSON text)."""
    if column == "string" and isinstance(value, dict | list):
        return json_text(value)
    return convert(column, value)


def refusal(name: str, column: str, value: Any) -> str:
    """The dead letter reason of a value that does not fit its evolved column."""
    try:
        kind = json_kind(value) if not isinstance(value, bytes) else "bytes"
    except ValueError:
        kind = "non-finite number"
    kind = {"object": "an object or array"}.get(kind, f"a {kind}") if kind else type(value).__name__
    shown = json_text(value) if not isinstance(value, bytes) else repr(value)
    return f"field '{name}' is a {column} column of the table, got {kind} ({shown[:60]})"


@dataclass(frozen=True)
class Seen:
    """How often a new field showed one kind in a batch, and the first place it did."""

    count: int
    first: tuple


def one_per_case(seen: dict[str, dict[str, Seen]]) -> tuple[list[str], dict[str, str]]:
    """The new fields of a batch that may be columns, and those refused (with why) because another with
    more messages (then the first seen) differs from them only in case: they would be one column."""
    def rank(kinds: dict[str, Seen]) -> tuple:
        return -sum(v.count for v in kinds.values()), min(v.first for v in kinds.values())

    names: list[str] = []
    refused: dict[str, str] = {}
    by_lower: dict[str, str] = {}
    for name in sorted(seen, key=lambda n: rank(seen[n])):
        if (other := by_lower.setdefault(name.lower(), name)) != name:
            refused[name] = f"new field '{name[:60]}' and new field '{other[:60]}' differ only in case, and column " \
                            "names are case-insensitive"
        else:
            names.append(name)
    return names, refused


def choose_types(seen: dict[str, dict[str, Seen]]) -> tuple[dict[str, str], dict[str, str]]:
    """(new field -> the column type it gets, new field -> why it gets none), from the kinds its values
    showed in the batch. Longs with doubles make a double (an integer fits one); otherwise the kind most
    values have wins, a tie going to the one seen first (lowest partition, then position). An object or
    array kind makes a string column. Two new names that differ only in case would be one column: the
    one with more values (then the first seen) gets it."""
    names, refused = one_per_case(seen)
    chosen = {}
    for name in names:
        kinds = seen[name]
        if set(kinds) == {"long", "double"}:
            chosen[name] = "double"
            continue
        best = min(kinds, key=lambda k: (-kinds[k].count, kinds[k].first))
        chosen[name] = "string" if best == "object" else best
    return chosen, refused


def misfits(kinds: dict[str, str], chosen: dict[str, str], refused: dict[str, str] | None = None) -> str | None:
    """A message's new fields (name -> kind) against the types chosen for them: the reason it cannot be
    written, or None when every value fits."""
    refused = refused or {}
    reasons = [refused[n] for n in sorted(kinds) if n in refused]
    reasons += [f"new field '{n[:60]}' is {chosen[n]} in this batch (most of its values are), this message has "
                f"{'an object or array' if k == 'object' else 'a ' + k}"
                for n, k in sorted(kinds.items()) if n in chosen and chosen[n] not in FITS[k]]
    return "; ".join(reasons) or None


@dataclass(frozen=True)
class Layout:
    """What a run writes besides the declared fields: the table's evolved columns (name -> type, in its
    order), the columns this batch adds (Avro: from the writer's schema), the declared columns its
    commit widens (name -> (table type, declared type)), the Avro fields left out, with why, and
    whether a widening run died before ending the feature."""

    evolved: dict[str, str] = field(default_factory=dict)
    added: dict[str, str] = field(default_factory=dict)
    widened: dict[str, tuple[str, str]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    widening_left: bool = False  # the table still carries Delta's type widening feature (a run died before dropping it)

    @property
    def columns(self) -> dict[str, str]:
        """The payload columns beyond the declared ones, with their decode types."""
        return {**self.evolved, **self.added}


def decimal_column(kind: str) -> str | None:
    """An Avro decimal's kind with its digits, `decimal(precision,scale)` -> the narrowest decimal column type
    that holds each of its values exactly (as many decimals or more, as many integer digits or more); None
    for another kind, or when none does."""
    digits = decimal_of(kind)
    if digits is None:
        return None
    precision, scale = digits
    for p, s in DECIMALS:
        if scale <= s and precision - scale <= p - s:
            return f"decimal({p},{s})"
    return None


def avro_writer(avro_fields: dict[str, set]) -> dict[str, tuple[str | None, str]]:
    """An Avro writer schema's fields (name -> its Avro kinds, deltadrain.formats.avro.kinds_of) -> name -> (the
    column a new field of it gets, None for none; what the schema says it is). A union with null is
    optional; one of int and long makes long, of float and double double; any other mix, none. A kind
    that gives a decimal's digits, `decimal(p,s)` (deltadrain.formats.changes.image_kinds), makes the
    decimal column that holds it (`decimal_column`)."""
    out = {}
    for name, kinds in avro_fields.items():
        kinds = set(kinds) - {"null"}
        one = next(iter(kinds)) if len(kinds) == 1 else None
        column = AVRO_PAIRS.get(frozenset(kinds)) or (AVRO_COLUMNS.get(one) or decimal_column(one) if one else None)
        out[name] = (column, f"Avro field '{name}' is {' or '.join(sorted(kinds)) or 'null'}")
    return out


def protobuf_writer(kinds: dict[str, str]) -> dict[str, tuple[str | None, str]]:
    """A Protobuf message's fields (name -> deltadrain.formats.protobuf.kind_of) -> name -> (column or None, what)."""
    return {name: (PROTOBUF_COLUMNS.get(kind), f"Protobuf field '{name}' is {kind}") for name, kind in kinds.items()}


def plan_layout(declared: dict[str, str], table: dict[str, str] | None,
                writer: dict[str, tuple[str | None, str]] | None = None, evolving: bool = True) -> Layout:
    """The layout of the next batch: `declared` (the config's fields), `table` (the table's payload columns,
    name -> type, None when there is no table yet), `writer` (the fields of the schema file or descriptor
    the messages are written with: `avro_writer`, `protobuf_writer`). EvolutionError when a declared type
    does not match the table's and Delta cannot widen it."""
    table = dict(table or {})
    lower = {k.lower(): k for k in table}
    widened, problems = {}, []
    for name, kind in declared.items():
        kind = DELTA_NAMES.get(kind, kind)
        have = table.get(name) or table.get(lower.get(name.lower(), ""))
        if have is None or have == kind:
            continue
        if kind in WIDENS.get(have, ()):
            widened[name] = (have, kind)
        else:
            problems.append(f"field '{name}' is declared {kind} but the table's column is {have}")
    if problems:
        raise EvolutionError("; ".join(problems) + ": Delta widens only int -> long and float -> double; "
                             "declare the table's type again, or write to a new table")
    if not evolving:
        return Layout(widened=widened)
    taken = {n.lower() for n in declared}
    evolved = {n: t for n, t in table.items() if n.lower() not in taken}
    if unfilled := [f"'{n}' ({t})" for n, t in evolved.items() if t not in FILLABLE]:
        raise EvolutionError(f"the table has columns deltadrain cannot fill: {', '.join(unfilled)}; declare them "
                             f"with a type of {', '.join(sorted(FILLABLE))}, or drop them from the table")
    added: dict[str, str] = {}
    skipped: dict[str, str] = {}
    for name, (column, what) in (writer or {}).items():
        if name in evolved:
            if column is not None and column in WIDENS.get(evolved[name], ()):  # the writer widened a field the table has
                widened[name] = (evolved[name], column)
                evolved[name] = column
            continue
        if name.lower() in taken:
            continue
        problem = name_problem(name, taken | {n.lower() for n in evolved} | {n.lower() for n in added})
        if problem or column is None:
            skipped[name] = problem or f"{what}, which no column type deltadrain writes holds"
            continue
        added[name] = column
    return Layout(evolved, added, widened, skipped)


def new_fields(record: dict, known: set[str], taken: set[str]) -> tuple[str | None, str | None, str | None]:
    """A JSON payload's fields that are no column yet (not in `known`, the declared and evolved names):
    (their values as a JSON object's text, their kinds as one, None), (None, None, None) when there are
    none, or (None, None, reason) when one cannot be a column. A null value adds nothing: its type is unknown."""
    values, kinds = {}, {}
    for name, value in record.items():
        if name in known or value is None:
            continue
        problem = name_problem(name, taken)
        if problem is None:
            try:
                kinds[name] = json_kind(value)
            except ValueError as exc:
                problem = f"new field '{name[:60]}' holds {exc}, which no column holds"
        if problem:
            return None, None, problem
        values[name] = value
    if not values:
        return None, None, None
    return json_text(values), json.dumps(kinds, sort_keys=True, ensure_ascii=False), None


# -- new fields typed by their writers' schemas (a schema registry: each message names its writer) ------


@dataclass(frozen=True)
class WriterColumns:
    """What one writer's schema (a registry's, by its id) brings a batch that collects new fields: its
    fields that are no column yet and those that widen an evolved column (name -> column type), and its
    fields left out (name -> why)."""

    adds: dict[str, str] = field(default_factory=dict)
    left_out: dict[str, str] = field(default_factory=dict)

    @property
    def signature(self) -> str | None:
        """The kinds each message of this writer carries (JSON text, deltadrain.run.layout groups by it):
        the added fields' types and the left-out fields' reasons after LEFT_OUT; None when it adds none."""
        if not self.adds:
            return None
        kinds = {**{n: LEFT_OUT + r for n, r in self.left_out.items()}, **self.adds}
        return json.dumps(kinds, sort_keys=True, ensure_ascii=False)


def writer_columns(writer: dict[str, tuple[str | None, str]], fields: dict[str, str],
                   evolved: frozenset) -> WriterColumns:
    """One writer schema's fields (`avro_writer`, `protobuf_writer`) against the run's `fields` (the declared
    ones and the table's `evolved` columns, with their types): a field in neither becomes a column typed
    as the writer's schema says; an evolved column the writer gives an int -> long or float -> double
    wider type is widened; a field no column type holds, or whose name cannot be a column, is left out."""
    declared = {n.lower() for n in fields if n not in evolved}
    taken = {n.lower() for n in fields}
    adds: dict[str, str] = {}
    left_out: dict[str, str] = {}
    for name, (column, what) in writer.items():
        if name in fields:
            if name in evolved and column is not None and column in WIDENS.get(table_type(fields[name]), ()):
                adds[name] = column
            continue
        if name.lower() in declared:  # a declared field in another case: not new (as plan_layout)
            continue
        problem = name_problem(name, taken | {n.lower() for n in adds})
        if problem or column is None:
            left_out[name] = problem or f"{what}, which no column type deltadrain writes holds"
            continue
        adds[name] = column
    return WriterColumns(adds, left_out)


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def carried(column: str, value: Any) -> Any:
    """A typed value of a writer-typed new column as JSON carries it to the batch's columns
    (deltadrain.run.layout parses it back): a timestamp as epoch microseconds, a date as ISO text, binary
    as base64 text, a decimal as its exact text; the others as they are."""
    if decimal_of(column):
        return format(value, "f")
    if column == "timestamp":
        return (value - EPOCH) // timedelta(microseconds=1)
    if column == "date":
        return value.isoformat()
    if column == "binary":
        return base64.b64encode(value).decode()
    return value


def writer_extras(record: dict, columns: WriterColumns, convert) -> tuple[str | None, str | None, str | None]:
    """A message's values of the fields its writer adds, taken out of `record` (a widened evolved field is
    then not also typed by its narrower column): (their values as a JSON object's text, the writer's
    signature, None); (None, None, None) when the writer adds none; (None, None, reason) when a value does
    not fit the column its writer's type makes (`convert(column, value)`: a NaN, a uint64 beyond a long)."""
    if not columns.adds:
        return None, None, None
    values = {}
    for name, column in columns.adds.items():
        value = record.pop(name, None)
        if value is None:
            continue
        try:
            values[name] = carried(column, convert(column, value))
        except (TypeError, ValueError, OverflowError):
            return None, None, f"new field '{name[:60]}' is {column} in its writer's schema, and {str(value)[:60]} " \
                               f"is no {column} value a column holds"
    return json.dumps(values, sort_keys=True, ensure_ascii=False), columns.signature, None


def fits_writer(kind: str, column: str) -> bool:
    """Whether a writer's type `kind` fits the column type chosen for its field (int in long, float in double)."""
    return kind == column or (kind in FAMILY and FAMILY[kind] == FAMILY.get(column) and WIDTH[kind] <= WIDTH[column])


def choose_writer_types(seen: dict[str, dict[str, Seen]]) -> tuple[dict[str, str], dict[str, str]]:
    """(new field -> the column type it gets, new field -> why it gets none), from the types the batch's
    writer schemas give it (`seen`: field -> type -> how many messages, first place). int and long count
    as one type and make long when any writer says long, float and double likewise; otherwise the type
    most messages' writers give wins, a tie going to the one seen first (lowest partition, then
    position). Two new names that differ only in case would be one column: the one with more messages
    (then the first seen) gets it."""
    names, refused = one_per_case(seen)
    chosen = {}
    for name in names:
        families: dict[str, tuple[int, tuple]] = {}
        for kind, s in seen[name].items():
            count, first = families.get(FAMILY.get(kind, kind), (0, s.first))
            families[FAMILY.get(kind, kind)] = (count + s.count, min(first, s.first))
        best = min(families, key=lambda f: (-families[f][0], families[f][1]))
        chosen[name] = max((k for k in seen[name] if FAMILY.get(k, k) == best), key=lambda k: WIDTH.get(k, 0))
    return chosen, refused


def writer_misfits(kinds: dict[str, str], chosen: dict[str, str], refused: dict[str, str] | None = None) -> str | None:
    """A message's writer signature (field -> type, or LEFT_OUT and a reason) against the types chosen for
    the batch: the reason it cannot be written, or None when each of its writer's types fits."""
    refused = refused or {}
    added = {n: k for n, k in kinds.items() if not k.startswith(LEFT_OUT)}
    reasons = [refused[n] for n in sorted(added) if n in refused]
    reasons += [f"new field '{n[:60]}' is {chosen[n]} in this batch (the writer schemas of most of its messages "
                f"say so), this message's writer schema gives it {k}"
                for n, k in sorted(added.items()) if n in chosen and not fits_writer(k, chosen[n])]
    return "; ".join(reasons) or None
