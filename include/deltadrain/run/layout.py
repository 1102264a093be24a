"""Schema evolution in a run (`schema.evolution: add_columns`): the layout the run reads with, from the
target table's schema in its Delta log, and a staged JSON batch's new columns. The decisions are
deltadrain.schema.evolution's; this module reads the table and the staged rows for them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import cast
from urllib.parse import unquote

from deltadrain.config import PipelineConfig
from deltadrain.formats.decode import EXTRA_COLUMNS
from deltadrain.lake.delta import _log, retry_conflicts, sql_name, table_ref
from deltadrain.schema.evolution import (
    LEFT_OUT,
    Layout,
    Seen,
    choose_types,
    choose_writer_types,
    misfits,
    plan_layout,
    table_type,
    writer_misfits,
)
from deltadrain.schema.types import SPARK_CLASSES, decimal_of

TYPE_WIDENING = "delta.enableTypeWidening"


def table_columns(log) -> dict[str, str] | None:
    """The table's payload columns (name -> type, deltadrain's own _dd_ columns left out) from a snapshot
    of its Delta log (`lake._log`), None when there is no table yet. A nested column's type is its Delta
    JSON (no field takes it)."""
    if log is None:
        return None
    out = {}
    for f in log.schema().fields:
        if f.name.startswith("_dd_"):
            continue
        out[f.name] = table_type(f.type.type) if hasattr(f.type, "type") and isinstance(f.type.type, str) \
            else str(f.type)
    return out


def writer_fields(pipeline: PipelineConfig) -> dict[str, tuple[str | None, str]] | None:
    """The fields of the schema file an Avro or Protobuf pipeline's messages are written with -> (the
    column a new one gets, or None; what it is), read from the file now (a changed file is the next
    run's); None for JSON, and with a registry, whose writers' schemas come with the batch's messages."""
    schema = pipeline.payload_schema
    if schema.format == "json" or schema.registry is not None:
        return None
    from pathlib import Path

    from deltadrain.schema.evolution import avro_writer, protobuf_writer

    if schema.format == "protobuf":
        from deltadrain.formats.protobuf import kind_of, load_descriptor

        given = schema.protobuf
        # The config requires both without a registry.
        assert given is not None and given.descriptor_file is not None and given.message is not None
        _, desc = load_descriptor(Path(given.descriptor_file), given.message)
        return protobuf_writer({fd.name: kind_of(fd) for fd in desc.fields})
    import fastavro

    from deltadrain.formats.avro import kinds_of, load_schema, named_types

    assert schema.avro is not None and schema.avro.schema_file is not None  # the config requires it without a registry
    parsed = cast(dict, fastavro.parse_schema(load_schema(Path(schema.avro.schema_file))))  # a record's schema
    names = named_types(parsed, {})
    return avro_writer({f["name"]: kinds_of(f["type"], names) for f in parsed["fields"]})


def run_layout(pipeline: PipelineConfig, target: str, adding: bool = True) -> tuple[PipelineConfig, Layout]:
    """(the pipeline as this run decodes it, the layout): its fields are the declared ones, the table's
    evolved columns and (`adding`: a drain) the fields of the schema file this batch adds (with a
    registry, the batch's writers add theirs: `new_columns`). EvolutionError when a
    declared type does not fit the table's column. A pipeline without add_columns is returned as it is.
    Backfills and reprocessing (not `adding`) fill the columns the table has and add none: their MERGE
    carries no checkpoint, and a drain's commit is where the history says the schema changed."""
    schema = pipeline.payload_schema
    if schema.evolution != "add_columns":
        return pipeline, Layout()
    log = _log(target)  # one snapshot for the columns and the widening feature a dead run left
    layout = plan_layout(schema.fields, table_columns(log), writer_fields(pipeline) if adding else None)
    layout = replace(layout, widening_left=carries_widening(log))
    fields = {**schema.fields, **{n: t for n, (_, t) in layout.widened.items() if n in schema.fields},
              **layout.columns}
    effective = schema.model_copy(update={"fields": fields})
    effective._evolved = frozenset(layout.evolved)
    # A JSON backfill still collects: a message whose new field cannot be a column stays the dead letter
    # its drain made it. A registry's writers' fields are left out or typed by the table's columns.
    effective._adding = adding
    return pipeline.model_copy(update={"payload_schema": effective}), layout


def allow_widening(spark, path: str) -> None:
    """Turn on Delta's type widening for the table (a metadata commit of its own), so that the next MERGE
    with schema evolution widens a column instead of failing on a value the old type cannot hold."""
    log = _log(path)
    if log is not None and log.metadata().configuration.get(TYPE_WIDENING) == "true":
        return
    retry_conflicts(lambda: spark.sql(f"ALTER TABLE {table_ref(path)} SET TBLPROPERTIES ('{TYPE_WIDENING}' = 'true')"))


def carries_widening(log) -> bool:
    """Whether a snapshot of the table's log (`lake._log`; None: no table) still carries Delta's type
    widening feature."""
    return log is not None and any(f.startswith("typeWidening") for f in log.protocol().reader_features or [])


def end_widening(spark, path: str) -> None:
    """Drop the type widening feature once the widening commit is in: a table that carries it is one the
    delta-rs reader of deltadrain's view and status refuses ("Unsupported table features required:
    [TypeWidening]"). Delta rewrites the files written with the narrower type, then drops it (commits of
    its own, after the batch's). A run that dies before this leaves it to the next run (`Layout.widening_left`)."""
    if carries_widening(_log(path)):
        retry_conflicts(lambda: spark.sql(f"ALTER TABLE {table_ref(path)} DROP FEATURE typeWidening"))


def may_carry_new_fields(claimed) -> bool:
    """Whether a staged batch may hold a row with fields no column holds: false only when every staged
    file's statistics say its `_dd_extra_kinds` is all null (no Spark job: the Parquet footers)."""
    from deltadrain.run.stage import open_staged

    try:
        files = claimed.inputFiles()
    except Exception:
        return True
    for name in files:
        local = name.startswith("file:")
        meta = open_staged(unquote(name.removeprefix("file://").removeprefix("file:")) if local else name).metadata
        index = meta.schema.to_arrow_schema().get_field_index(EXTRA_COLUMNS[1])
        for g in range(meta.num_row_groups):
            stats = meta.row_group(g).column(index).statistics
            if stats is None or not stats.has_null_count or stats.null_count != meta.row_group(g).num_rows:
                return True
    return False


@dataclass(frozen=True)
class NewColumns:
    """What a staged batch's new fields make of it (`new_columns`): its rows with a column per new field,
    the new columns' types, the evolved columns its writers widen (name -> (table type, new type)), the
    writers' fields left out (name -> why), and how many messages became `schema` dead letters."""

    rows: object
    added: dict = field(default_factory=dict)
    widened: dict = field(default_factory=dict)
    skipped: dict = field(default_factory=dict)
    moved: int = 0


# Writer-typed values travel as JSON (deltadrain.schema.evolution.carried): the type they are parsed as, and back
# (a decimal's exact text is cast to its column).
CARRIER = {"timestamp": "long", "date": "string", "binary": "string",
           **{t: "string" for t in SPARK_CLASSES if decimal_of(t)}}


def _typed(value, column: str):
    from pyspark.sql import functions as F

    if column == "timestamp":
        return F.timestamp_micros(value)
    if column == "date":
        return F.to_date(value)
    if column == "binary":
        return F.unbase64(value)
    return value


def new_columns(claimed, evolved: dict[str, str] | None = None, by_writer: bool = False) -> NewColumns:
    """A staged batch that collected new fields (add_columns) -> its rows with a column per new field and
    what the batch changes. One small aggregate over the rows that carry new fields, by the set of kinds
    they have: a JSON batch's values' kinds (deltadrain.schema.evolution.choose_types), or with a registry
    (`by_writer`) the types their writers' schemas give (choose_writer_types), where a field that is one
    of the table's `evolved` columns (name -> type) is one a writer widens."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructField, StructType, _parse_datatype_string

    if not may_carry_new_fields(claimed):
        return NewColumns(claimed)
    kinds_col, extra_col = F.col(EXTRA_COLUMNS[1]), F.col(EXTRA_COLUMNS[0])
    good = F.col("_dd_error_type").isNull()
    groups = (claimed.where(good & kinds_col.isNotNull()).groupBy(kinds_col.alias("kinds"))
              .agg(F.count("*").alias("n"), F.min(F.struct("_dd_partition", "_dd_pos_hi", "_dd_pos_lo")).alias("first"))
              .collect())
    if not groups:
        return NewColumns(claimed)
    seen: dict[str, dict[str, Seen]] = {}
    signatures, skipped = {}, {}
    for g in groups:
        kinds = json.loads(g.kinds)
        signatures[g.kinds] = (kinds, g.n)
        first = tuple(g.first)
        for name, kind in kinds.items():
            if by_writer and kind.startswith(LEFT_OUT):
                skipped[name] = kind[len(LEFT_OUT):]
                continue
            old = seen.setdefault(name, {}).get(kind)
            seen[name][kind] = Seen(g.n + (old.count if old else 0), min(first, old.first) if old else first)
    chosen, refused = (choose_writer_types if by_writer else choose_types)(seen)
    judge = writer_misfits if by_writer else misfits
    rejected = {sig: reason for sig, (kinds, _) in signatures.items()
                if (reason := judge(kinds, chosen, refused)) is not None}
    moved = sum(signatures[sig][1] for sig in rejected)
    carrier = {n: CARRIER.get(t, t) if by_writer else t for n, t in chosen.items()}
    parsed = F.from_json(extra_col, StructType([StructField(n, _parse_datatype_string(t)) for n, t in carrier.items()]))
    out = claimed
    if rejected:
        why = F.element_at(F.create_map(*[F.lit(x) for kv in sorted(rejected.items()) for x in kv]), kinds_col)
        refuse = good & kinds_col.isNotNull() & why.isNotNull()
        out = (out.withColumn("_dd_error", F.when(refuse, why).otherwise(F.col("_dd_error")))
               .withColumn("_dd_error_type", F.when(refuse, F.lit("schema")).otherwise(F.col("_dd_error_type"))))
    out = out.withColumn("_dd_new", F.when(F.col("_dd_error_type").isNull(), parsed))
    evolved = evolved or {}
    widened = {n: (evolved[n], t) for n, t in chosen.items() if n in evolved}
    added = {n: t for n, t in chosen.items() if n not in evolved}

    def column(name: str):
        value = _typed(F.col("_dd_new").getField(name), chosen[name]) if by_writer else F.col("_dd_new").getField(name)
        if name in widened:  # the rows of writers with the table's type keep theirs, widened
            return F.coalesce(F.col(sql_name(name)).cast(chosen[name]), value).alias(name)
        return value.cast(chosen[name]).alias(name)

    keep = [column(c) if c in widened else F.col(sql_name(c)) for c in claimed.columns]
    out = out.select(*keep, *[column(n) for n in added])
    return NewColumns(out, added, widened, skipped, moved)
