"""The flat `schema:` keys of older configs, moved to the blocks that now hold them (pure).

`avro_wire` and `avro_schema_id` governed Protobuf bodies as well as Avro ones: they move to the block of
the schema's format. The loader logs one deprecation line per key it moved (deltadrain.config.loader).
"""

from __future__ import annotations

from typing import NamedTuple

# The format's own block (`avro:` or `protobuf:`, by `format`).
FORMAT_BLOCK = ""

# An old flat key -> (its block, its key there).
MOVED = {
    "avro_schema_file": ("avro", "schema_file"),
    "avro_wire": (FORMAT_BLOCK, "wire"),
    "avro_schema_id": (FORMAT_BLOCK, "schema_id"),
    "protobuf_descriptor_file": ("protobuf", "descriptor_file"),
    "protobuf_message": ("protobuf", "message"),
    "registry_url": ("registry", "url"),
    "registry_connection_id": ("registry", "connection_id"),
    "registry_username_env": ("registry", "username_env"),
    "registry_password_env": ("registry", "password_env"),
    "registry_ca_file": ("registry", "ca_file"),
}


class Nested(NamedTuple):
    block: dict  # the `schema:` mapping with its flat keys moved
    moved: list[tuple[str, str]]  # (old key, new dotted key) of each key moved
    clashes: list[tuple[str, str]]  # (old key, new dotted key) given both ways: left where they were


def nest_schema(block: dict) -> Nested:
    """A `schema:` mapping as written -> the same with every old flat key moved into its block. A key
    whose new place is given as well is left alone, and named in `clashes`; so is one whose block is not
    a mapping (the model's validation then names that block)."""
    out = dict(block)
    moved, clashes = [], []
    for old, (name, key) in MOVED.items():
        if old not in out:
            continue
        name = name or ("protobuf" if out.get("format") == "protobuf" else "avro")
        target = out.get(name)
        if target is None:
            target = {}
        if not isinstance(target, dict):
            continue
        if key in target:
            clashes.append((old, f"{name}.{key}"))
            continue
        out[name] = {**target, key: out.pop(old)}
        moved.append((old, f"{name}.{key}"))
    return Nested(out, moved, clashes)
