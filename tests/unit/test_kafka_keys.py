"""Avro record keys as message ids (`source.key_format: avro`): each key read with its writer's schema
from a local HTTP server that speaks the schema registry's API (tests/support/registry.py), through
the drain's own column-wise Kafka decoding."""

from __future__ import annotations

import io
import json
import re

import fastavro
import pytest

from deltadrain.errors import ConfigError
from deltadrain.formats.confluent import header
from deltadrain.formats.registry import Registry, RegistryUnavailable
from deltadrain.sources.kafka.drain import REPLAY_ID_HEADER
from tests.support.kafka_rows import TS, ctx, kafka_row
from tests.support.registry import ROOT, avro_config

RECORD_KEY = {"type": "record", "name": "K", "fields": [{"name": "id", "type": "string"}]}
KEYS = {31: '"string"', 32: '{"type": "long"}', 33: str(RECORD_KEY).replace("'", '"'), 34: '["null", "string"]'}
BODY = b'{"event_id": "from-body", "amount": 2}'


def avro_key(schema_id: int, value, schema: str | None = None) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(json.loads(schema or KEYS[schema_id])), value)
    return header(schema_id) + buf.getvalue()


@pytest.fixture
def keyed(server):
    server.schemas.update({i: {"schema": text} for i, text in KEYS.items()})
    c = ctx(id_from="key", key_registry=Registry(server.url, backoff_s=0.01, timeout_s=5))
    c.attempts.clear()
    return server, c


def test_avro_keys_are_read_with_their_writers_schema_and_bad_ones_are_dead_letters_with_the_reason(keyed):
    srv, c = keyed
    row = kafka_row(c, 0, 1, TS, avro_key(31, "order-7"), BODY, [])
    assert (row[7], row[8], row[-2]) == ("order-7", None, "order-7")  # the key wins over the body's field
    assert kafka_row(c, 0, 2, TS, avro_key(32, 42), BODY, [])[7] == "42"
    assert kafka_row(c, 0, 3, TS, avro_key(34, None), BODY, [])[7] == "clicks-0-3"  # a null datum: the place
    assert kafka_row(c, 0, 4, TS, None, BODY, [], replay_id=b"order-7")[7] == "order-7"  # a replayed copy

    def dead(key: bytes) -> tuple[str, str]:
        r = kafka_row(c, 0, 9, TS, key, BODY, [])
        assert r[7] == "clicks-0-9" and bytes(r[10]) == BODY  # kept whole, at its place
        return r[8], r[9]

    assert dead(avro_key(33, {"id": "x"})) == (
        "unsupported_schema", "key schema id 33 is record: a key that is a message id is an Avro string, int or long")
    assert dead(b"order-7")[0] == "wrong_magic_byte" and "source.key_format: avro" in dead(b"order-7")[1]
    assert dead(header(99) + b"\x02x")[0] == "unknown_schema_id"
    assert dead(header(31) + b"\x14ab")[0] == "truncated"
    assert dead(avro_key(31, "a") + b"\x00")[0] == "invalid_avro"
    # Each id was asked for once, whatever the number of its keys (31: four, in four batches).
    assert sorted(srv.asked) == [f"/schemas/ids/{i}" for i in (31, 32, 33, 34, 99)]


def test_a_registry_outage_while_reading_keys_fails_the_batch_instead_of_dead_lettering_it(keyed):
    srv, c = keyed
    srv.fail_next = 100
    with pytest.raises(RegistryUnavailable, match="cannot get schema id 32 from the schema registry"):
        kafka_row(c, 0, 1, TS, avro_key(32, 5), BODY, [])


def test_avro_keys_need_id_from_key_and_a_registry_and_their_copies_carry_the_id_in_a_header(tmp_path):
    from deltadrain.config import KafkaSource
    from deltadrain.sources.kafka.replay import kafka_copy_identity

    with pytest.raises(ValueError, match=re.escape("key_format: avro applies to id_from: key")):
        KafkaSource(kind="kafka", topic="t", key_format="avro")
    import yaml

    from deltadrain.config import load_config

    path = avro_config(tmp_path, registry={"url": "http://127.0.0.1:1"})
    data = yaml.safe_load(path.read_text())
    data["pipelines"][0]["source"].update(id_from="key", key_format="avro")
    path.write_text(yaml.safe_dump(data))
    assert load_config(path).pipelines[0].source.key_format == "avro"
    del data["pipelines"][0]["schema"]["registry"]
    data["pipelines"][0]["schema"]["avro"].update(schema_id=1, schema_file=str(ROOT / "config" / "schemas" / "clicks.avsc"))
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=re.escape("source.key_format avro reads each key with its writer's schema "
                                                    "from the schema registry: set schema.registry.url")):
        load_config(path)
    source = KafkaSource(kind="kafka", topic="t", id_from="key", key_format="avro")
    key, headers = kafka_copy_identity(source, {"message_id": "order-7", "partition": "0", "position": "9"})
    assert key is None and (REPLAY_ID_HEADER, b"order-7") in headers
