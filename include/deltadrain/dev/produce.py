"""`deltadrain produce`: deterministic sample events for a pipeline's source, good and bad.

The same seed gives the same message ids, payloads, bad messages and partitions, so tests and
benchmarks can say exactly what must end up in the target and what in the DLQ.
"""

from __future__ import annotations

import json
import random
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import cast

from deltadrain.config import DeltadrainConfig, KafkaSource, PipelineConfig, ValkeySource
from deltadrain.config.payload import AvroSettings, ProtobufSettings
from deltadrain.errors import ConfigError
from deltadrain.sources.valkey.client import VALKEY_FIELD
from deltadrain.transforms import POISON_MARKER

# What a malformed message can be; each one is a DLQ reason the decoder must name.
MALFORMED_KINDS = ("invalid_json", "empty", "missing_id", "null_id", "wrong_type", "invalid_utf8",
                   "oversized", "not_an_object", "lone_surrogate", "too_deep")
STATUSES = ("new", "paid", "shipped", "cancelled")
# An Avro pipeline's bad messages (produce writes Avro for `schema.format: avro`), each with the DLQ
# error type the decoder gives it; the last two only in the Confluent wire format.
AVRO_MALFORMED = {"empty": "empty", "truncated": "truncated", "not_avro": "invalid_avro",
                  "trailing_bytes": "invalid_avro", "not_finite": "schema", "wrong_magic_byte": "wrong_magic_byte",
                  "unknown_schema_id": "unknown_schema_id"}


@dataclass(frozen=True)
class Message:
    index: int
    key: str  # the intended message id (also the partitioning key)
    value: bytes
    kind: str  # "valid", "poison" or one of MALFORMED_KINDS

    @property
    def partition_key(self) -> bytes:
        return self.key.encode()


@dataclass
class ProduceResult:
    pipeline: str
    count: int
    kinds: Counter = field(default_factory=Counter)
    valid_ids: list[str] = field(default_factory=list)
    poison_ids: list[str] = field(default_factory=list)
    per_partition: Counter = field(default_factory=Counter)
    # Where each message that is not valid landed, (partition, position) -> kind: the DLQ rows a
    # drain must end with, place for place (Valkey: stream and entry id; Kafka: partition and offset).
    places: dict[tuple[str, str], str] = field(default_factory=dict)

    def bad_places(self, kinds) -> set[tuple[str, str]]:
        return {place for place, kind in self.places.items() if kind in kinds}

    def summary(self) -> dict:
        return {"pipeline": self.pipeline, "produced": self.count, "valid": len(self.valid_ids),
                "poison": len(self.poison_ids),
                "malformed": self.count - len(self.valid_ids) - len(self.poison_ids),
                "kinds": dict(sorted(self.kinds.items())), "partitions": dict(sorted(self.per_partition.items()))}


def event_id(seed: int, index: int) -> str:
    return f"evt-{seed}-{index:09d}"


def _valid_payload(rng: random.Random, eid: str, when: datetime, customer: str | None = None) -> dict:
    return {
        "event_id": eid,
        "customer": customer or f"cust-{rng.randrange(10_000):05d}",
        "amount": round(rng.uniform(1, 500), 2),
        "quantity": rng.randrange(1, 10),
        "status": rng.choice(STATUSES).upper() if rng.random() < 0.1 else rng.choice(STATUSES),
        "event_time": when.isoformat().replace("+00:00", "Z"),
        # Pads events to ~200 bytes, the size the benchmarks are specified at.
        "note": "x" * rng.randrange(20, 40),
    }


def _malformed(kind: str, rng: random.Random, eid: str, when: datetime, max_bytes: int) -> bytes:
    good = _valid_payload(rng, eid, when)
    if kind == "invalid_json":
        return json.dumps(good).encode()[:-7] + b"{oops"
    if kind == "empty":
        return b""
    if kind == "missing_id":
        good.pop("event_id")
    elif kind == "null_id":
        good["event_id"] = None
    elif kind == "wrong_type":
        good["amount"] = "twelve euros"
    elif kind == "invalid_utf8":
        return json.dumps(good).encode().replace(b'"cust-', b'"\xff\xfe-', 1)
    elif kind == "oversized":
        good["note"] = "y" * (max_bytes + 1)
    elif kind == "not_an_object":
        return json.dumps([good]).encode()
    elif kind == "lone_surrogate":  # valid UTF-8 bytes, but the escape is half of an emoji's UTF-16 pair
        good["customer"] = "cust-\ud83d"
    elif kind == "too_deep":  # nested past what a JSON parser follows (json.dumps could not write it)
        return json.dumps(good).encode()[:-1] + b', "deep": ' + b"[" * 3_000 + b"]" * 3_000 + b"}"
    return json.dumps(good).encode()


def _avro(pipeline: PipelineConfig) -> AvroSettings:
    """The pipeline's `avro:` block, which produce writes Avro by."""
    if (avro := pipeline.payload_schema.avro) is None:
        raise ConfigError(f"pipeline '{pipeline.name}': `produce` writes Avro by schema.avro (its schema_file)")
    return avro


def _protobuf(pipeline: PipelineConfig) -> ProtobufSettings:
    """The pipeline's `protobuf:` block, which produce writes Protobuf by."""
    if (protobuf := pipeline.payload_schema.protobuf) is None:
        raise ConfigError(f"pipeline '{pipeline.name}': `produce` writes Protobuf by schema.protobuf "
                          "(its descriptor_file and message)")
    return protobuf


def avro_error_type(pipeline: PipelineConfig, kind: str) -> str:
    """The DLQ error type of a bad kind in this Avro pipeline: JSON text fails the Confluent frame first."""
    if kind == "not_avro" and _avro(pipeline).wire == "confluent":
        return "wrong_magic_byte"
    return AVRO_MALFORMED[kind]


def avro_bad_kinds(pipeline: PipelineConfig) -> tuple[str, ...]:
    """The bad kinds produce writes into this Avro pipeline."""
    confluent = _avro(pipeline).wire == "confluent"
    return tuple(k for k in AVRO_MALFORMED if confluent or k not in ("wrong_magic_byte", "unknown_schema_id"))


class _AvroWriter:
    """The sample events as Avro datums of the pipeline's schema file: each Avro field takes the
    event's value of that name (ISO text parsed for a timestamp or date field), null when it has none."""

    def __init__(self, pipeline: PipelineConfig):
        import fastavro

        from deltadrain.formats.avro import kinds_of, load_schema, named_types

        avro = _avro(pipeline)
        assert avro.schema_file is not None  # `generate` checked it
        self.schema = cast(dict, fastavro.parse_schema(load_schema(Path(avro.schema_file))))  # a record's
        names = named_types(self.schema, {})
        self.kinds = {f["name"]: kinds_of(f["type"], names) for f in self.schema["fields"]}
        self.wire, self.schema_id = avro.wire, avro.schema_id
        self.registry = pipeline.payload_schema.registry is not None

    def record(self, payload: dict) -> dict:
        out = {}
        for name, kinds in self.kinds.items():
            value = payload.get(name)
            if isinstance(value, str) and "timestamp" in kinds:
                value = datetime.fromisoformat(value)
            elif isinstance(value, str) and "date" in kinds:
                value = datetime.fromisoformat(value).date()
            out[name] = value
        return out

    def encode(self, payload: dict, schema_id: int | None = None) -> bytes:
        from deltadrain.formats.avro import encode

        return encode(self.record(payload), self.schema, wire=self.wire,
                      schema_id=self.schema_id if schema_id is None else schema_id)

    def malformed(self, kind: str, good: dict) -> bytes:
        if kind == "empty":
            return b""
        if kind == "truncated":
            return self.encode(good)[:-3]
        if kind == "not_avro":  # a JSON producer writing to an Avro topic
            return json.dumps(good).encode()
        if kind == "trailing_bytes":
            return self.encode(good) + b"\x02\x04"
        if kind == "not_finite":  # valid Avro, but no double column takes NaN (as in JSON)
            return self.encode({**good, "amount": float("nan")})
        if kind == "wrong_magic_byte":
            return b"\x01" + self.encode(good)[1:]
        if kind == "unknown_schema_id":  # with a registry, far past the ids it gave
            return self.encode(good, schema_id=(self.schema_id or 0) + (1_000_000 if self.registry else 1))
        raise ValueError(kind)


# A Protobuf pipeline's bad messages, with their DLQ error types (the last two only in the Confluent wire
# format). Bytes after a message are not a mistake in Protobuf (more fields), so there is no trailing kind.
PROTOBUF_MALFORMED = {"empty": "empty", "truncated": "truncated", "not_protobuf": "invalid_protobuf",
                      "not_finite": "schema", "wrong_magic_byte": "wrong_magic_byte",
                      "unknown_schema_id": "unknown_schema_id"}


def protobuf_error_type(pipeline: PipelineConfig, kind: str) -> str:
    """The DLQ error type of a bad kind in this Protobuf pipeline: JSON text fails the Confluent frame first."""
    if kind == "not_protobuf" and _protobuf(pipeline).wire == "confluent":
        return "wrong_magic_byte"
    return PROTOBUF_MALFORMED[kind]


class _ProtobufWriter:
    """The sample events as messages of the pipeline's Protobuf type: each field takes the event's value
    of that name (ISO text parsed for a Timestamp, upper-cased for an enum), unset when it has none."""

    def __init__(self, pipeline: PipelineConfig):
        from deltadrain.formats.protobuf import kind_of, payload_of

        payload = payload_of(pipeline.payload_schema)
        assert payload is not None  # a Protobuf schema's
        self.payload = payload
        self.kinds = {f.name: kind_of(f) for f in self.payload.descriptor().fields}
        self.wire = _protobuf(pipeline).wire

    def record(self, payload: dict) -> dict:
        out = {}
        for name, kind in self.kinds.items():
            value = payload.get(name)
            if isinstance(value, str) and kind == "timestamp":
                value = datetime.fromisoformat(value)
            elif isinstance(value, str) and kind == "enum":
                value = value.upper()
            out[name] = value
        return out

    def encode(self, payload: dict, schema_id: int | None = None) -> bytes:
        from deltadrain.formats.protobuf import encode

        return encode(self.record(payload), self.payload, schema_id=schema_id)

    def malformed(self, kind: str, good: dict) -> bytes:
        if kind == "empty":
            return b""
        if kind == "truncated":  # the last field (the example's event_time) cut inside
            return self.encode(good)[:-1]
        if kind == "not_protobuf":  # a JSON producer writing to a Protobuf topic
            return json.dumps(good).encode()
        if kind == "not_finite":  # valid Protobuf, but no double column takes NaN (as in JSON)
            return self.encode({**good, "amount": float("nan")})
        if kind == "wrong_magic_byte":
            return b"\x01" + self.encode(good)[1:]
        if kind == "unknown_schema_id":
            return self.encode(good, schema_id=(self.payload.schema_id or 0) + 1)
        raise ValueError(kind)


def generate(pipeline: PipelineConfig, count: int, seed: int = 0, malformed_ratio: float = 0.0,
             poison_ratio: float = 0.0, start: int = 0) -> Iterator[Message]:
    """Messages `start .. start+count-1` of the deterministic sequence for `seed`: JSON, or Avro datums
    of the pipeline's schema file, or Protobuf messages of its type, as its `schema.format` says."""
    if not 0 <= malformed_ratio <= 1 or not 0 <= poison_ratio <= 1 or malformed_ratio + poison_ratio > 1:
        raise ValueError("ratios must be within 0..1 and add up to at most 1")
    if pipeline.payload_schema.format in ("avro", "protobuf"):
        yield from _generate_encoded(pipeline, count, seed, malformed_ratio, poison_ratio, start)
        return
    base = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(days=seed % 365)
    for i in range(start, start + count):
        rng = random.Random(f"{seed}:{i}")  # per-message stream: any slice is reproducible alone
        eid = event_id(seed, i)
        when = base + timedelta(milliseconds=i)
        roll = rng.random()
        if roll < malformed_ratio:
            kind = MALFORMED_KINDS[rng.randrange(len(MALFORMED_KINDS))]
            yield Message(i, eid, _malformed(kind, rng, eid, when, pipeline.max_message_bytes), kind)
        elif roll < malformed_ratio + poison_ratio:
            yield Message(i, eid, json.dumps(_valid_payload(rng, eid, when, POISON_MARKER)).encode(), "poison")
        else:
            yield Message(i, eid, json.dumps(_valid_payload(rng, eid, when)).encode(), "valid")


def _generate_encoded(pipeline, count, seed, malformed_ratio, poison_ratio, start) -> Iterator[Message]:
    spec = pipeline.payload_schema
    field = "avro.schema_file" if spec.format == "avro" else "protobuf.descriptor_file"
    if (spec.avro.schema_file if spec.format == "avro" else spec.protobuf.descriptor_file) is None:
        # With a registry alone there is no schema here to write with; the producers own it.
        raise ConfigError(f"pipeline '{pipeline.name}' reads its writers' schemas from the registry at "
                          f"{spec.registry.url}: `produce` needs schema.{field} to write with")
    if spec.format == "protobuf":
        writer: _ProtobufWriter | _AvroWriter = _ProtobufWriter(pipeline)
        kinds = tuple(k for k in PROTOBUF_MALFORMED if writer.wire == "confluent"
                      or k not in ("wrong_magic_byte", "unknown_schema_id"))
    else:
        writer, kinds = _AvroWriter(pipeline), avro_bad_kinds(pipeline)
    base = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(days=seed % 365)
    for i in range(start, start + count):
        rng = random.Random(f"{seed}:{i}")
        eid = event_id(seed, i)
        when = base + timedelta(milliseconds=i)
        roll = rng.random()
        if roll < malformed_ratio:
            kind = kinds[rng.randrange(len(kinds))]
            yield Message(i, eid, writer.malformed(kind, _valid_payload(rng, eid, when)), kind)
        elif roll < malformed_ratio + poison_ratio:
            yield Message(i, eid, writer.encode(_valid_payload(rng, eid, when, POISON_MARKER)), "poison")
        else:
            yield Message(i, eid, writer.encode(_valid_payload(rng, eid, when)), "valid")


def partition_for(key: bytes, partitions: int) -> int:
    """Stable key -> partition so that one key's events keep their order in one partition."""
    return zlib.crc32(key) % partitions


def produce(cfg: DeltadrainConfig, pipeline: PipelineConfig, count: int, *, seed: int = 0,
            malformed_ratio: float = 0.0, poison_ratio: float = 0.0, start: int = 0,
            progress: bool | None = None) -> ProduceResult:
    from tqdm import tqdm

    result = ProduceResult(pipeline.name, count)
    pipeline = with_registered_schema(pipeline)
    messages = generate(pipeline, count, seed, malformed_ratio, poison_ratio, start)
    bar = tqdm(total=count, unit="msg", desc=f"produce {pipeline.name}", disable=not (
        progress if progress is not None else count >= 20_000))
    writer = _valkey_writer if isinstance(pipeline.source, ValkeySource) else _kafka_writer
    with bar:
        for msg, partition, position in writer(cfg, pipeline, messages, bar):
            result.kinds[msg.kind] += 1
            result.per_partition[partition] += 1
            if msg.kind != "valid":
                result.places[(str(partition), position)] = msg.kind
            if msg.kind == "valid":
                result.valid_ids.append(msg.key)
            elif msg.kind == "poison":
                result.poison_ids.append(msg.key)
    return result


def subject_of(pipeline: PipelineConfig) -> str:
    """The registry subject a producer's serializer registers the payload schema under: the topic's value
    subject (TopicNameStrategy); a stream has no topic, so the pipeline's name stands in."""
    return f"{getattr(pipeline.source, 'topic', pipeline.name)}-value"


def with_registered_schema(pipeline: PipelineConfig) -> PipelineConfig:
    """An Avro pipeline that reads a registry and has a schema file but no fixed id: the file registered
    under its subject, and the pipeline as `produce` writes with that id, as a producer's serializer does."""
    spec = pipeline.payload_schema
    if spec.registry is None or spec.format != "avro" or spec.avro is None or spec.avro.schema_file is None \
            or spec.avro.schema_id is not None:
        return pipeline
    from deltadrain.formats.registry import register, registry_of

    registry = registry_of(spec)
    assert registry is not None  # spec.registry is set
    schema_id = register(registry, subject_of(pipeline), Path(spec.avro.schema_file).read_text())
    avro = spec.avro.model_copy(update={"schema_id": schema_id})
    return pipeline.model_copy(update={"payload_schema": spec.model_copy(update={"avro": avro})})


def _chunks(it: Iterator[Message], size: int) -> Iterator[list[Message]]:
    chunk: list[Message] = []
    for m in it:
        chunk.append(m)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _valkey_writer(cfg: DeltadrainConfig, pipeline: PipelineConfig, messages: Iterator[Message], bar):
    from deltadrain.sources.valkey.client import as_text, valkey_client

    source = pipeline.source
    assert isinstance(source, ValkeySource)
    client = valkey_client(cfg, pipeline)
    for chunk in _chunks(messages, 2000):
        pipe = client.pipeline(transaction=False)
        placed = []
        for msg in chunk:
            stream = source.streams[partition_for(msg.partition_key, len(source.streams))]
            kwargs = {"maxlen": source.maxlen, "approximate": True} if source.maxlen else {}
            pipe.xadd(stream, {VALKEY_FIELD: msg.value}, **kwargs)
            placed.append((msg, stream))
        ids = pipe.execute()
        bar.update(len(chunk))
        for (msg, stream), entry_id in zip(placed, ids, strict=True):
            yield msg, stream, None if msg.kind == "valid" else as_text(entry_id)


def ensure_topic(conf: dict, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(conf)
    if topic in admin.list_topics(timeout=10).topics:
        return
    futures = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    for fut in futures.values():
        try:
            fut.result(30)
        except Exception as exc:  # raced with another creator: fine if it exists now
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise


def embedded_admin_conf(cfg: DeltadrainConfig) -> dict:
    """The embedded broker's admin: its PLAINTEXT listener on 127.0.0.1, whose principal is its super user."""
    from deltadrain.config.embedded import ports

    return {"bootstrap.servers": f"127.0.0.1:{ports(cfg).kafka}"}


def _kafka_writer(cfg: DeltadrainConfig, pipeline: PipelineConfig, messages: Iterator[Message], bar):
    from confluent_kafka import Producer

    from deltadrain.sources.kafka.client import kafka_client_conf

    source = pipeline.source
    assert isinstance(source, KafkaSource)
    conf = kafka_client_conf(cfg, pipeline)
    # On the embedded broker the topic is made by its admin (the PLAINTEXT listener): its SASL user's
    # ACLs grant what a drain needs, and creating topics is not among that.
    ensure_topic(conf if source.bootstrap_servers else embedded_admin_conf(cfg), source.topic, source.partitions)
    producer = Producer({**conf, "enable.idempotence": True, "acks": "all", "linger.ms": 20,
                         "compression.type": "lz4", "partitioner": "murmur2_random",
                         "message.max.bytes": 8_388_608})
    errors: list[str] = []
    offsets: dict[int, int] = {}  # chunk index -> offset of a message that is not valid (its place)

    def on_delivery(err, _msg):
        if err is not None:
            errors.append(str(err))

    def placed_at(index: int):
        def report(err, delivered):
            on_delivery(err, delivered)
            if err is None:
                offsets[index] = delivered.offset()
        return report

    nparts = len(producer.list_topics(source.topic, timeout=10).topics[source.topic].partitions)
    for chunk in _chunks(messages, 5000):
        placed = []
        offsets.clear()
        for index, msg in enumerate(chunk):
            part = partition_for(msg.partition_key, nparts)
            headers: list[tuple[str, str | bytes | None]] | None = \
                [(source.id_header, msg.key.encode())] if source.id_header else None
            while True:
                try:
                    producer.produce(source.topic, value=msg.value, key=msg.partition_key, partition=part,
                                     headers=headers,
                                     on_delivery=on_delivery if msg.kind == "valid" else placed_at(index))
                    break
                except BufferError:
                    producer.poll(0.1)
            placed.append((msg, part))
        undelivered = producer.flush(60)
        if errors or undelivered:
            raise RuntimeError(f"Kafka produce failed: {errors[0] if errors else f'{undelivered} undelivered'}")
        bar.update(len(chunk))
        for index, (msg, part) in enumerate(placed):
            yield msg, part, None if msg.kind == "valid" else str(offsets[index])
