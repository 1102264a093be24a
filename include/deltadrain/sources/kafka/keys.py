"""Record keys as message ids (`source.id_from: key`): UTF-8 text, or (`source.key_format: avro`) an
Avro datum in the Confluent wire format, as the registry-aware Avro serializers write keys, read with
its writer's schema from the pipeline's schema registry. Only a string, int or long key is an id; a key
of another schema, or bytes that are not such a datum, make the record a dead letter with the reason.
Pure apart from the registry's ask (deltadrain.formats.registry.writer, cached per process)."""

from __future__ import annotations

import functools
import json

from deltadrain.formats.confluent import HEADER, frame_error, schema_id_of

ID_KINDS = {"string", "int", "long", "enum", "uuid"}


def text_key(raw: bytes, what: str = "key") -> tuple[str | None, str | None, str | None]:
    """(id, error type, reason) of a text key (or header: `what`)."""
    try:
        return bytes(raw).decode("utf-8"), None, None
    except UnicodeDecodeError:
        return None, "invalid_utf8", f"message id {what} is not valid UTF-8"


@functools.lru_cache(maxsize=256)
def key_schema(text: str, schema_id: int):
    """A key writer's schema text -> its parsed schema, or (error type, reason) when it is no id's."""
    import fastavro

    from deltadrain.formats.avro import kinds_of, named_types

    try:
        parsed = fastavro.parse_schema(json.loads(text))
    except Exception as exc:  # not JSON, not Avro: what the producer registered
        return "unsupported_schema", f"key schema id {schema_id} is not a valid Avro schema: {type(exc).__name__}: {exc}"[:300]
    kinds = kinds_of(parsed, named_types(parsed, {})) - {"null"}
    if not kinds or not kinds <= ID_KINDS:
        return "unsupported_schema", (f"key schema id {schema_id} is {'/'.join(sorted(kinds)) or 'null'}: a key that "
                                      "is a message id is an Avro string, int or long")
    return parsed


def avro_key(raw: bytes, registry) -> tuple[str | None, str | None, str | None]:
    """(id, error type, reason) of a Confluent-framed Avro key; (None, None, None) for a null datum,
    which falls back to the record's place like a null key. A registry outage raises (the run fails)."""
    from deltadrain.formats.avro import read_datum
    from deltadrain.formats.registry import writer

    raw = bytes(raw)
    if (wrong := frame_error(raw, None)) is not None:
        return None, wrong.error_type, f"key: {wrong.error} (source.key_format: avro)"
    schema_id = schema_id_of(raw)
    assert schema_id is not None  # frame_error passed: the key is framed
    found = writer(registry, schema_id, "AVRO")
    if found.text is None:
        return None, found.error_type, f"key: {found.error}"
    parsed = key_schema(found.text, schema_id)
    if isinstance(parsed, tuple):
        return None, *parsed
    value, wrong = read_datum(raw[HEADER:], parsed, "key")
    if wrong is not None:
        return None, wrong.error_type, f"{wrong.error} (key schema id {schema_id})"
    return (None if value is None else str(value)), None, None
