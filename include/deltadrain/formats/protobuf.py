"""Protobuf payloads (`schema.format: protobuf`): one serialized message per body, of the type
`schema.protobuf.message` in the descriptor set file `schema.protobuf.descriptor_file` (a `FileDescriptorSet`, as
`protoc --include_imports --descriptor_set_out` writes it), optionally in the Confluent wire format
(magic byte 0, 4-byte big-endian schema id, the message indexes as zigzag varints, then the body).
Decoded into the same typed values as a JSON payload (deltadrain.formats.decode), so staging, the MERGE, the
DLQ, replays and backfills do not know the difference. No Spark; no I/O beyond reading the file and,
with a registry, asking it (deltadrain.formats.registry).

Without a schema registry a Confluent-framed message must carry the configured schema id and the
indexes of the configured message; anything else is a dead letter. With one (`schema.registry`,
deltadrain.formats.registry) each message is parsed as the message its indexes name in the file its schema id
names, and the declared fields are taken from it by name (one it lacks is null, or a `schema` dead
letter when required).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

from deltadrain.formats.confluent import HEADER, frame_error, header, schema_id_of
from deltadrain.formats.decode import CONVERTERS, BatchDecoder, Decoded, _bad, record_values, size_error
from deltadrain.formats.registry import Registry, ids_of, registry_of, writer
from deltadrain.schema.evolution import protobuf_writer, writer_columns, writer_extras

TIMESTAMP = "google.protobuf.Timestamp"
INTS = {"int32", "int64", "uint32", "uint64"}
# What each declared type accepts, by the kind of a Protobuf field (checked at config load). An
# int64 fills a timestamp as epoch milliseconds, as in JSON; a 64-bit value is range-checked per
# message against an int column, as in the Avro path.
ACCEPTS = {
    "string": {"string", "enum"}, "long": INTS, "int": INTS, "integer": INTS,
    "double": INTS | {"float", "double"}, "float": INTS | {"float", "double"}, "boolean": {"bool"},
    "timestamp": {"timestamp", "int64", "string"}, "date": {"string"}, "binary": {"bytes"},
    "decimal(18,2)": INTS | {"string"}, "decimal(38,9)": INTS | {"string"},
}
ID_KINDS = {"string"} | INTS  # ids are merged on their text, as JSON integer ids are


@cache
def _kind_names() -> dict[int, str]:
    from google.protobuf.descriptor import FieldDescriptor as F

    return {F.TYPE_INT32: "int32", F.TYPE_SINT32: "int32", F.TYPE_SFIXED32: "int32",
            F.TYPE_INT64: "int64", F.TYPE_SINT64: "int64", F.TYPE_SFIXED64: "int64",
            F.TYPE_UINT32: "uint32", F.TYPE_FIXED32: "uint32", F.TYPE_UINT64: "uint64", F.TYPE_FIXED64: "uint64",
            F.TYPE_DOUBLE: "double", F.TYPE_FLOAT: "float", F.TYPE_BOOL: "bool", F.TYPE_STRING: "string",
            F.TYPE_BYTES: "bytes", F.TYPE_ENUM: "enum"}


def kind_of(fd) -> str:
    """The kind of a field: a scalar's, `enum`, `timestamp`, `repeated` or `message <name>`."""
    if fd.is_repeated if hasattr(fd, "is_repeated") else fd.label == fd.LABEL_REPEATED:
        return "repeated"
    if fd.message_type is not None:
        return "timestamp" if fd.message_type.full_name == TIMESTAMP else f"message {fd.message_type.full_name}"
    return _kind_names()[fd.type]


@dataclass(frozen=True)
class ProtobufPayload:
    """What a decoding task needs (pickled with it): the descriptor set's bytes and the message name;
    the message class is built once per task."""

    descriptor_set: bytes  # b"" with a registry and no descriptor file
    message: str  # "" with a registry: the indexes in each frame name it
    wire: str = "plain"  # or "confluent"
    schema_id: int | None = None
    registry: Registry | None = None
    _built: list = field(default_factory=list, compare=False, repr=False)

    def descriptor(self):
        if not self._built:
            from google.protobuf import message_factory

            desc = build_pool(self.descriptor_set).FindMessageTypeByName(self.message)
            kinds = {fd.name: (fd, kind_of(fd)) for fd in desc.fields}
            self._built.extend([desc, message_factory.GetMessageClass(desc), message_indexes(desc), kinds])
        return self._built[0]

    def fields(self) -> dict:
        """Field name -> (its descriptor, its kind), worked out once per task."""
        self.descriptor()
        return self._built[3]

    def message_class(self):
        self.descriptor()
        return self._built[1]

    def indexes(self) -> list[int]:
        """The Confluent message indexes that name this message in its file."""
        self.descriptor()
        return self._built[2]

    def decoder(self, **kwargs) -> BatchDecoder:
        return ProtobufBatchDecoder(self, **kwargs)


def build_pool(data: bytes):
    """A descriptor pool of the files in a serialized FileDescriptorSet; a well-known type the set
    does not include (protoc without --include_imports) is taken from the protobuf package."""
    from google.protobuf import descriptor_pb2, descriptor_pool

    fds = descriptor_pb2.FileDescriptorSet.FromString(data)
    pool = descriptor_pool.DescriptorPool()
    given = {f.name for f in fds.file}
    for name in {d for f in fds.file for d in f.dependency} - given:
        if name.startswith("google/protobuf/"):
            proto = descriptor_pb2.FileDescriptorProto()
            try:
                # The default pool holds a well-known file once its module is imported.
                importlib.import_module(name.removesuffix(".proto").replace("/", ".") + "_pb2")
                descriptor_pool.Default().FindFileByName(name).CopyToProto(proto)
            except (KeyError, ImportError):
                continue
            pool.Add(proto)
    for f in fds.file:
        pool.Add(f)
    return pool


def message_indexes(desc) -> list[int]:
    """Where `desc` is in its file: the index among the top-level messages, then in each nesting."""
    path = []
    while desc is not None:
        siblings = desc.containing_type.nested_types if desc.containing_type else list(
            desc.file.message_types_by_name.values())
        path.append([s.full_name for s in siblings].index(desc.full_name))
        desc = desc.containing_type
    return path[::-1]


def load_descriptor(path: Path, message: str) -> tuple[bytes, Any]:
    """The descriptor set's bytes and the message's descriptor; ValueError with the reason otherwise."""
    from google.protobuf.message import DecodeError

    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ValueError(f"Protobuf descriptor set file {path} not found") from None
    except OSError as exc:
        raise ValueError(f"cannot read the Protobuf descriptor set file {path}: {type(exc).__name__}: {exc}") from None
    try:
        pool = build_pool(data)
    except DecodeError as exc:
        raise ValueError(f"{path} is not a serialized FileDescriptorSet ({exc}); write it with "
                         f"protoc --include_imports --descriptor_set_out") from None
    except (TypeError, ValueError) as exc:  # a missing import, a duplicate or unresolvable type
        raise ValueError(f"{path} is not a usable descriptor set (protoc --include_imports?): {exc}") from None
    try:
        return data, pool.FindMessageTypeByName(message)
    except KeyError:
        names = [m.full_name for f in _files(pool, data) for m in f.message_types_by_name.values()]
        raise ValueError(f"message '{message}' is not in {path} (its messages: {', '.join(names) or 'none'}; "
                         f"give the full name, with the package)") from None


def _files(pool, data: bytes):
    from google.protobuf import descriptor_pb2

    return [pool.FindFileByName(f.name) for f in descriptor_pb2.FileDescriptorSet.FromString(data).file]


def field_problems(desc, fields: dict[str, str], id_field: str) -> list[str]:
    """Why the message type cannot fill the declared fields (empty: it can)."""
    problems = []
    for name, kind in fields.items():
        fd = desc.fields_by_name.get(name)
        if fd is None:
            problems.append(f"field '{name}' is not in message {desc.full_name} "
                            f"(its fields: {', '.join(desc.fields_by_name)})")
            continue
        carried = kind_of(fd)
        accepts = ID_KINDS if name == id_field else ACCEPTS[kind]
        if carried not in accepts:
            problems.append(f"field '{name}' is {kind} but message {desc.full_name} gives it {carried} "
                            f"(a {kind} column takes {', '.join(sorted(accepts))})")
    return problems


def payload_of(schema_config) -> ProtobufPayload | None:
    """The Protobuf payload spec of a pipeline's `schema:` block, None for another format. The file was
    checked when the config was loaded (config.parse_config), which also made its path absolute."""
    if schema_config.format != "protobuf":
        return None
    registry = registry_of(schema_config)
    proto = schema_config.protobuf
    if proto.descriptor_file is None:
        return ProtobufPayload(b"", "", proto.wire, proto.schema_id, registry)
    data, _ = load_descriptor(Path(proto.descriptor_file), proto.message)
    return ProtobufPayload(data, proto.message, proto.wire, proto.schema_id, registry)


def writer_file(found, schema_id: int):
    """A registry's writer (a serialized FileDescriptorProto) -> its file descriptor, or the dead letter of
    the messages of its id. Imports of Google's well-known types come from the protobuf package."""
    from google.protobuf import descriptor_pb2

    if found.text is None:
        return _bad(found.error_type, found.error)
    try:
        proto = descriptor_pb2.FileDescriptorProto.FromString(found.text)
        pool = build_pool(descriptor_pb2.FileDescriptorSet(file=[proto]).SerializeToString())
        return pool.FindFileByName(proto.name)
    except Exception as exc:  # not a descriptor, an import the registry did not say
        return _bad("unsupported_schema", f"schema id {schema_id} is not a usable Protobuf file: "
                                          f"{type(exc).__name__}: {exc}"[:300])


def message_at(file, indexes: list[int]):
    """The message that Confluent message indexes name in `file`, or None."""
    found, siblings = None, list(file.message_types_by_name.values())
    for i in indexes:
        if not 0 <= i < len(siblings):
            return None
        found = siblings[i]
        siblings = list(found.nested_types)
    return found


# -- the wire ---------------------------------------------------------------------------------------

def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """An unsigned varint at `pos`: (value, next position); IndexError when the data ends inside it."""
    value = shift = 0
    while True:
        b = data[pos]
        value |= (b & 0x7F) << shift
        pos += 1
        if not b & 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


def _zigzag(data: bytes, pos: int) -> tuple[int, int]:
    v, pos = _varint(data, pos)
    return (v >> 1) ^ -(v & 1), pos


def read_indexes(data: bytes, pos: int) -> tuple[list[int], int]:
    """The Confluent message-index list at `pos` (a count, then the indexes; a lone 0 means [0])."""
    count, pos = _zigzag(data, pos)
    if count == 0:
        return [0], pos
    if not 0 < count <= 32:
        raise ValueError(f"message index count {count}")
    out = []
    for _ in range(count):
        i, pos = _zigzag(data, pos)
        out.append(i)
    return out, pos


def write_indexes(indexes: list[int]) -> bytes:
    def zz(v: int) -> bytes:
        v, out = (v << 1) ^ (v >> 63), bytearray()
        while v > 0x7F:
            out.append((v & 0x7F) | 0x80)
            v >>= 7
        return bytes(out + bytes([v]))

    return b"\x00" if indexes == [0] else zz(len(indexes)) + b"".join(zz(i) for i in indexes)


def ends_early(body: bytes) -> bool:
    """Whether the body's fields, read by their wire types alone, run past its end (a cut message)."""
    pos, n = 0, len(body)
    try:
        while pos < n:
            tag, pos = _varint(body, pos)
            wire = tag & 7
            if wire == 0:
                _, pos = _varint(body, pos)
            elif wire == 1:
                pos += 8
            elif wire == 5:
                pos += 4
            elif wire == 2:
                length, pos = _varint(body, pos)
                if pos + length > n:
                    return True
                pos += length
            else:
                return False  # groups or no wire type: not a cut, a bad body
        return pos > n
    except IndexError:
        return True
    except ValueError:
        return False


def _value(msg, fd, kind: str):
    """A field's Python value, None when a field with presence is unset."""
    if fd.has_presence and not msg.HasField(fd.name):
        return None
    v = getattr(msg, fd.name)
    if kind == "enum":
        named = fd.enum_type.values_by_number.get(v)
        if named is None:
            raise LookupError(f"enum value {v} has no name in {fd.enum_type.full_name}")
        return named.name
    if kind == "timestamp":
        return v.ToDatetime(tzinfo=UTC)
    return v


def convert(kind: str, v: Any) -> Any:
    """A decoded Protobuf value -> the declared column type; TypeError/ValueError/OverflowError when the
    column cannot hold it (an int beyond 32 bits, NaN, a decimal with too many digits)."""
    if kind == "binary":
        if isinstance(v, bytes):
            return v
        raise TypeError
    if kind == "timestamp" and isinstance(v, datetime):
        return v
    return CONVERTERS[kind](v)  # the JSON path's checks: ranges, finiteness, exact decimals, ISO text


def decode_protobuf(data: bytes | None, payload: ProtobufPayload, *, fields: dict[str, str], id_field: str,
                    required: list[str], max_bytes: int, fallback_id: str | None = None,
                    message_id: str | None = None, writer_of=None) -> Decoded:
    """Bytes -> typed values, or the reason they cannot be; the same contract as decode.decode.
    `writer_of(schema_id, indexes)`: with a registry, (message name, class, field name -> (descriptor,
    kind), what it adds: deltadrain.schema.evolution.WriterColumns or None) of the writer's message, or the dead
    letter of the message (ProtobufBatchDecoder.writer_of). Collecting new fields (add_columns with a
    registry), the values of the fields the writer adds end the values, as decode.decode's new fields do."""
    from google.protobuf.message import DecodeError

    if (wrong := size_error(data, max_bytes)) is not None:
        return wrong
    assert data is not None  # size_error refused it
    body = data
    if payload.wire == "confluent":
        if (wrong := frame_error(data, payload.schema_id, least=HEADER + 1,
                                 what="header and message indexes")) is not None:
            return wrong
        try:
            indexes, start = read_indexes(data, HEADER)
        except IndexError:
            return _bad("truncated", f"payload of {len(data)} bytes ends inside the Confluent message indexes")
        except ValueError as exc:
            return _bad("invalid_protobuf", f"Confluent message indexes are not valid: {exc}")
        if payload.registry is not None:
            found = writer_of(schema_id_of(data), indexes)
            if isinstance(found, Decoded):
                return found
            what, cls, described, columns = found
        elif indexes != payload.indexes():
            return _bad("unknown_message_index", f"message indexes {indexes} name another message than "
                                                 f"{payload.message} (indexes {payload.indexes()})")
        body = data[start:]
    if payload.registry is None:
        what, cls, described, columns = payload.message, payload.message_class(), payload.fields(), None
    msg = cls()
    try:
        msg.ParseFromString(body)
    except DecodeError as exc:
        if ends_early(body):
            return _bad("truncated", f"Protobuf body of {len(body)} bytes ends inside a field of {what}")
        return _bad("invalid_protobuf", f"Protobuf body is not a {what}: {exc}"[:300])
    except Exception as exc:  # a recursion limit or another refusal of the parser
        return _bad("invalid_protobuf", f"Protobuf body is not a {what}: {type(exc).__name__}: {exc}"[:300])
    record = {}
    for name in [*fields, *(columns.adds if columns else ())]:
        if name not in described or name in record:  # a writer without the field: missing, as an absent JSON key
            continue
        fd, kind = described[name]
        try:
            record[name] = _value(msg, fd, kind)
        except (LookupError, ValueError, OverflowError, OSError) as exc:  # an unnamed enum, a timestamp out of range
            return _bad("schema", f"field '{name}': {exc}"[:200], message_id)
    extra = writer_extras(record, columns, convert) if columns is not None else None
    got = record_values(record, fields=fields, id_field=id_field, required=required, fallback_id=fallback_id,
                        message_id=message_id, convert=convert, unset="not set", unset_id="empty", no_id=(None, ""))
    if extra is None or got.values is None:
        return got
    if extra[2]:
        return _bad("schema", extra[2], got.message_id)
    return got._replace(values=(*got.values, extra[0], extra[1]))


class ProtobufBatchDecoder(BatchDecoder):
    """BatchDecoder for Protobuf payloads: message by message, through `decode_protobuf`."""

    def __init__(self, payload: ProtobufPayload, **kwargs):
        super().__init__(**kwargs)
        self.payload = payload
        self.fast = False
        self.files: dict[int, Any] = {}  # schema id -> the writer's file descriptor, or a dead letter
        self.messages: dict[tuple[int, tuple], Any] = {}

    def columns(self, values: list, **kwargs) -> dict:
        """With a registry, the writers of the batch's ids are found first, once per id (as for Avro)."""
        if self.payload.registry is not None:
            for schema_id in ids_of(values):
                if self.payload.schema_id is None or schema_id == self.payload.schema_id:
                    self._file(schema_id)
        return super().columns(values, **kwargs)

    def _file(self, schema_id: int):
        if schema_id not in self.files:
            assert self.payload.registry is not None  # asked only with a registry
            self.files[schema_id] = writer_file(writer(self.payload.registry, schema_id, "PROTOBUF"), schema_id)
        return self.files[schema_id]

    def writer_of(self, schema_id: int, indexes: list[int]):
        key = (schema_id, tuple(indexes))
        if key not in self.messages:
            from google.protobuf import message_factory

            file = self._file(schema_id)
            if isinstance(file, Decoded):
                self.messages[key] = file
            elif (desc := message_at(file, indexes)) is None:
                self.messages[key] = _bad("unknown_message_index", f"message indexes {indexes} name no message "
                                                                   f"of schema id {schema_id} ({file.name})")
            else:
                kinds = {fd.name: kind_of(fd) for fd in desc.fields}
                columns = writer_columns(protobuf_writer(kinds), self.fields, self.evolved) if self.collect_new else None
                wanted = {*self.fields, *(columns.adds if columns else ())}
                self.messages[key] = (desc.full_name, message_factory.GetMessageClass(desc),
                                      {fd.name: (fd, kinds[fd.name]) for fd in desc.fields if fd.name in wanted},
                                      columns)
        return self.messages[key]

    def one(self, value, fallback_id=None, message_id=None) -> Decoded:
        return decode_protobuf(value, self.payload, fields=self.fields, id_field=self.id_field,
                               required=self.required, max_bytes=self.max_bytes, fallback_id=fallback_id,
                               message_id=message_id, writer_of=self.writer_of)


def encode(record: dict, payload: ProtobufPayload, *, schema_id: int | None = None) -> bytes:
    """A record (field name -> Python value; a datetime for a Timestamp, an enum's name) as the
    payload's message, framed for its wire (producers: deltadrain produce, tests)."""
    desc = payload.descriptor()
    msg = payload.message_class()()
    for name, value in record.items():
        fd = desc.fields_by_name.get(name)
        if fd is None or value is None:
            continue
        kind = kind_of(fd)
        if kind == "timestamp":
            getattr(msg, name).FromDatetime(value)
        elif kind == "enum":
            setattr(msg, name, fd.enum_type.values_by_name[value].number)
        elif kind == "repeated":
            getattr(msg, name).extend(value)
        else:
            setattr(msg, name, value)
    body = msg.SerializeToString()
    if payload.wire != "confluent":
        return body
    sid = payload.schema_id if schema_id is None else schema_id
    return header(sid or 0) + write_indexes(payload.indexes()) + body
