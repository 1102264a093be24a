"""A pipeline's payload format, for the decoding tasks: None for JSON (deltadrain.formats.decode), else the
Avro (deltadrain.formats.avro) or Protobuf (deltadrain.formats.protobuf) spec, which builds its own BatchDecoder."""

from __future__ import annotations

from deltadrain.formats import avro, protobuf

Payload = avro.AvroPayload | protobuf.ProtobufPayload


def payload_of(schema_config) -> Payload | None:
    """The payload spec of a pipeline's `schema:` block, None for JSON."""
    return avro.payload_of(schema_config) or protobuf.payload_of(schema_config)
