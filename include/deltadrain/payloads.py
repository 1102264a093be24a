"""A pipeline's payload format, for the decoding tasks: None for JSON (deltadrain.decode), else the
Avro (deltadrain.avro) or Protobuf (deltadrain.protobuf) spec, which builds its own BatchDecoder."""

from __future__ import annotations

from deltadrain import avro, protobuf

Payload = avro.AvroPayload | protobuf.ProtobufPayload


def payload_of(schema_config) -> Payload | None:
    """The payload spec of a pipeline's `schema:` block, None for JSON."""
    return avro.payload_of(schema_config) or protobuf.payload_of(schema_config)
