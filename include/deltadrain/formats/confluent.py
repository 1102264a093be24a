"""The Confluent wire format of Avro and Protobuf payloads: a magic byte 0 and the schema id (4 bytes,
big-endian) before the body; Protobuf adds its message indexes (deltadrain.formats.protobuf). Pure."""

from __future__ import annotations

from deltadrain.formats.decode import Decoded, _bad

MAGIC = 0
HEADER = 5  # magic byte + 4-byte schema id


def header(schema_id: int) -> bytes:
    return bytes([MAGIC]) + int(schema_id).to_bytes(4, "big")


def schema_id_of(data: bytes) -> int | None:
    """The schema id a framed payload names, None when it is not framed (too short, another first byte)."""
    return int.from_bytes(data[1:HEADER], "big") if len(data) >= HEADER and data[0] == MAGIC else None


def frame_error(data: bytes, schema_id: int | None, *, least: int = HEADER, what: str = "header") -> Decoded | None:
    """Why non-empty `data` is not a payload framed for `schema_id` (a dead letter's type and reason), or
    None. `schema_id` None takes any id (a registry names each one's schema). `least`: the shortest frame
    (`what` names what it holds)."""
    if data[0] != MAGIC:
        return _bad("wrong_magic_byte", f"payload starts with byte 0x{data[0]:02x}, not the Confluent wire "
                                        f"format's magic byte 0x00")
    if len(data) < least:
        return _bad("truncated", f"payload of {len(data)} bytes is shorter than the Confluent wire format's "
                                 f"{HEADER}-byte {what}")
    found = int.from_bytes(data[1:HEADER], "big")
    if schema_id is not None and found != schema_id:
        return _bad("unknown_schema_id", f"unknown schema id {found} (this pipeline reads schema id {schema_id})")
    return None
