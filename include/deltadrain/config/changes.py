"""The checks of a pipeline's `target.mode` (insert or upsert) against the rest of its config: which keys,
order and deletes an upsert pipeline may name (docs/cdc.md, "Config"). Raised as ValueError, so that the
loader names the file and the pipeline; each message starts with the field it is about."""

from __future__ import annotations

from typing import Any

# The order_by of a Debezium pipeline that is no payload column: the change's place in the database's log.
SOURCE_LSN = "source.lsn"
# Column types an order_by column may have: values that compare as what they mean.
IDENTITY = "deltadrain.transforms.identity"
ORDERABLE = ("long", "int", "timestamp", "date", "string", "double", "float")


def check_mode(p: Any) -> None:
    """`p` is a PipelineConfig (typed as Any: this module sits beside the models it checks)."""
    target, schema = p.target, p.payload_schema
    if target.mode == "insert":
        _insert(target, schema)
    else:
        _upsert(p, target, schema)


def _insert(target, schema) -> None:
    if not schema.id_field:
        raise ValueError("schema.id_field: required (the message id the target keeps each message once by); "
                         "only target.mode upsert goes without one")
    given = [name for name, unset in (("key", []), ("order_by", "position"), ("delete_when", None),
                                      ("on_truncate", "fail")) if getattr(target, name) != unset]
    if given:
        raise ValueError(f"target.{given[0]}: applies to target.mode upsert only (this target is mode insert)")
    if schema.envelope != "none":
        raise ValueError(f"schema.envelope: {schema.envelope} change events are applied in target.mode upsert: "
                         "set it")


def _upsert(p, target, schema) -> None:
    fields = schema.fields
    debezium = schema.envelope == "debezium"
    if schema.id_field:
        raise ValueError("schema.id_field: an upsert target keeps one row per target.key, not per message id: "
                         "leave id_field out")
    if not debezium and schema.format != "json":
        raise ValueError(f"schema.format: {schema.format}: an upsert target reads entity states as JSON, and Debezium "
                         "change events (schema.envelope: debezium) as JSON or as Avro through the registry; set "
                         "format: json")
    if not target.key and not debezium:
        raise ValueError("target.key: upsert mode needs the payload columns that identify a row")
    if len(set(target.key)) != len(target.key):
        raise ValueError(f"target.key: names a column twice ({target.key})")
    if unknown := [c for c in target.key if c not in fields]:
        raise ValueError(f"target.key: {unknown} are not fields of schema.fields")
    order = target.order_by
    if order == SOURCE_LSN:
        if not debezium:
            raise ValueError(f"target.order_by: {SOURCE_LSN} is the Debezium change's place in the database's log; "
                             "it needs schema.envelope: debezium")
    elif order != "position":
        if order not in fields:
            raise ValueError(f"target.order_by: '{order}' is neither position nor a field of schema.fields"
                             + (f" (nor {SOURCE_LSN})" if debezium else ""))
        if fields[order] not in ORDERABLE and not fields[order].startswith("decimal"):
            raise ValueError(f"target.order_by: '{order}' is a {fields[order]} column; order by a "
                             f"{', '.join(ORDERABLE)} or decimal one")
    if target.delete_when is not None and target.delete_when.field not in fields:
        raise ValueError(f"target.delete_when.field: '{target.delete_when.field}' is not a field of schema.fields")
    if target.on_truncate != "fail" and not debezium:
        raise ValueError("target.on_truncate: only Debezium change events truncate (schema.envelope: debezium)")
    if p.transform not in (None, IDENTITY):
        raise ValueError("transform: an upsert target takes its rows as the events give them (a transform could "
                         "change their keys or order); leave it out")
    if debezium and not getattr(p.source, "keyed_records", False):
        raise ValueError("schema.envelope: debezium reads Kafka records (a change's key is the record's key): "
                         "use a Kafka source")
    streams = getattr(p.source, "streams", None) or []  # a Valkey source's partitions, named in the config
    if order == "position" and len(streams) > 1:
        raise ValueError(f"target.order_by: position orders a key's events within one stream only, and this "
                         f"pipeline reads {len(streams)}: read one stream, or order by a payload column (a version "
                         "or a timestamp the producer sets)")
