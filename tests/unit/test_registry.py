"""The schema registry client (deltadrain.formats.registry): frame -> id grouping, answer parsing, error mapping,
and the client against a local HTTP server that speaks the Confluent-compatible API's `GET
/schemas/ids/{id}` (tests/support/registry.py, the `server` fixture), to reach answers a real registry will not
give on demand. The drains through the
real one (the embedded Apicurio Registry) are tests/integration/test_schema_registry.py."""

from __future__ import annotations

import base64
import io
import json
import re
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path

import pyarrow as pa
import pytest

from deltadrain.config import load_config
from deltadrain.errors import ConfigError
from deltadrain.formats import registry as reg
from deltadrain.formats.avro import AvroBatchDecoder, encode
from deltadrain.formats.confluent import header
from deltadrain.formats.payloads import payload_of
from deltadrain.formats.registry import (
    Registry,
    RegistryLoginRefused,
    RegistryUnavailable,
    RegistryUntrusted,
    Writer,
    answer,
    failure_line,
    fetch,
    ids_of,
    registry_of,
)
from tests.support.registry import ROOT, V1, V2, V3, FakeRegistryHandler, avro_config

FIELDS = {"event_id": "string", "customer": "string", "amount": "double", "quantity": "long"}
TYPES = {"event_id": pa.string(), "customer": pa.string(), "amount": pa.float64(), "quantity": pa.int64()}


def framed(schema_id: int, rec: dict, schema: dict) -> bytes:
    return header(schema_id) + encode(rec, schema)


def decoder(url: str, *, schema_id=None, required=("event_id",), **login) -> AvroBatchDecoder:
    from deltadrain.formats.avro import AvroPayload

    p = AvroPayload("", "confluent", schema_id, Registry(url, backoff_s=0.01, timeout_s=5, **login))
    return AvroBatchDecoder(p, fields=FIELDS, id_field="event_id", required=list(required), max_bytes=4096,
                            types=TYPES)


def test_frames_are_grouped_by_schema_id_and_unframed_payloads_left_out():
    values = [header(7) + b"a", None, b"", header(9) + b"b", b"\x01abcd", header(7), b"\x00\x00"]
    assert ids_of(values) == {7: [0, 5], 9: [3]}


def test_answers_map_to_a_writer_a_dead_letter_a_retry_or_a_run_error():
    r = Registry("http://reg:8081", login_from="the Airflow connection 'reg' (or AIRFLOW_CONN_REG)")
    assert answer(200, json.dumps({"schema": '"string"'}).encode(), 5, r, "AVRO") == Writer('"string"', "AVRO")
    desc = base64.b64encode(b"\x0a\x03a.p").decode()
    assert answer(200, json.dumps({"schema": desc, "schemaType": "PROTOBUF"}).encode(), 5, r, "PROTOBUF").text == (
        b"\x0a\x03a.p")
    other = answer(200, json.dumps({"schema": "x", "schemaType": "JSON"}).encode(), 5, r, "AVRO")
    assert (other.error_type, other.error) == (
        "unsupported_schema", "schema id 5 is a JSON schema in the schema registry at http://reg:8081; this "
        "pipeline reads avro")
    refs = answer(200, json.dumps({"schema": "{}", "references": [{"name": "a", "subject": "s-a", "version": 2}]})
                  .encode(), 5, r, "AVRO")
    assert (refs.text, refs.error_type, refs.pending) == ("{}", None, (("a", "s-a", 2),))  # fetch gets them
    proto_refs = answer(200, json.dumps({"schema": "{}", "schemaType": "PROTOBUF", "references": [
        {"name": "a", "subject": "s-a", "version": 2}]}).encode(), 5, r, "PROTOBUF")
    assert proto_refs.error_type == "unsupported_schema" and "s-a v2" in proto_refs.error
    unknown = answer(404, b'{"error_code":40403,"message":"Schema 5 not found"}', 5, r, "AVRO")
    assert (unknown.text, unknown.error_type, unknown.error) == (
        None, "unknown_schema_id",
        "unknown schema id 5 (the schema registry at http://reg:8081 does not know it: Schema 5 not found)")
    with pytest.raises(RegistryUnavailable, match=r"answered HTTP 404 without error code 40403 for schema id 5 "
                                                  r"\(Not Found\): is schema.registry.url the base"):
        answer(404, b"Not Found", 5, r, "AVRO")  # a wrong base URL: no message is to blame
    for status in (500, 503, 429, 408):
        assert answer(status, b"busy", 5, r, "AVRO") is None
    with pytest.raises(RegistryLoginRefused, match=r"http://reg:8081 refused the login \(HTTP 401: bad\): check "
                                                   r"the login in the Airflow connection 'reg' \(or AIRFLOW_CONN_REG\)"):
        answer(401, b'{"message":"bad"}', 5, r, "AVRO")
    with pytest.raises(RegistryLoginRefused, match="denied reading schemas"):
        answer(403, b"{}", 5, r, "AVRO")
    with pytest.raises(RegistryUnavailable, match="answered HTTP 400 for schema id 5"):
        answer(400, b"no", 5, r, "AVRO")
    with pytest.raises(RegistryUnavailable, match="Confluent-compatible"):
        answer(200, b"<html>", 5, r, "AVRO")


def test_fetch_retries_an_outage_with_backoff_then_fails_naming_the_registry():
    r = Registry("http://reg:8081", attempts=4, backoff_s=0.5)
    answers = iter([ConnectionRefusedError(111, "Connection refused"), (503, b"{}"), (200, b'{"schema":"\\"int\\""}')])
    slept = []

    def ask(url, _):
        assert url == "http://reg:8081/schemas/ids/3"
        got = next(answers)
        if isinstance(got, Exception):
            raise got
        return got

    assert fetch(r, 3, "AVRO", sleep=slept.append, ask=ask).text == '"int"'
    assert slept == [0.5, 1.0]

    def down(url, _):
        raise ConnectionRefusedError(111, "Connection refused")

    slept.clear()
    with pytest.raises(RegistryUnavailable) as exc:
        fetch(r, 3, "AVRO", sleep=slept.append, ask=down)
    assert slept == [0.5, 1.0, 2.0]
    line = str(exc.value)
    assert "\n" not in line and line.startswith(
        "deltadrain schema registry: cannot get schema id 3 from the schema registry at http://reg:8081 after 4 "
        "attempts (ConnectionRefusedError: [Errno 111] Connection refused)")
    # Carried out of a Spark task, the line is found again in the traceback text.
    spark_error = RuntimeError(f"Job aborted.\nTraceback (most recent call last):\n  ...\n"
                               f"deltadrain.formats.registry.RegistryUnavailable: {line}\n\tat org.apache.spark...")
    wrapped = ValueError("the stage failed")
    wrapped.__cause__ = spark_error
    assert failure_line(wrapped) == line and failure_line(ValueError("else")) is None
    assert reg.schema_url("http://r/api/ccompat/v7/", 4, "PROTOBUF") == (
        "http://r/api/ccompat/v7/schemas/ids/4?format=serialized")


def test_protobuf_text_as_apicurio_gives_it_is_compiled_and_text_protoc_rejects_is_a_dead_letter(monkeypatch):
    from google.protobuf import descriptor_pb2

    r = Registry("http://reg/apis/ccompat/v7")
    text = (ROOT / "config" / "schemas" / "clicks.proto").read_text()
    said = json.dumps({"schema": text, "schemaType": "PROTOBUF", "references": []}).encode()
    assert answer(200, said, 8, r, "PROTOBUF") == Writer(text, "PROTOBUF")  # kept as text: answer() is pure
    found = fetch(r, 8, "PROTOBUF", ask=lambda url, _: (200, said))
    proto = descriptor_pb2.FileDescriptorProto.FromString(found.text)
    fds = descriptor_pb2.FileDescriptorSet.FromString((ROOT / "config" / "schemas" / "clicks.desc").read_bytes())
    want = next(f for f in fds.file if f.name.endswith("clicks.proto"))
    assert (proto.name, proto.dependency, proto.message_type) == ("schema_8.proto", want.dependency, want.message_type)
    broken = json.dumps({"schema": "syntax = \"proto3\";\nmessage A { int32 x = 1 }", "schemaType": "PROTOBUF"})
    dead = fetch(r, 9, "PROTOBUF", ask=lambda url, _: (200, broken.encode()))
    assert (dead.text, dead.error_type, dead.error) == (
        None, "unsupported_schema", 'schema id 9 is Protobuf text that protoc rejects: schema_9.proto:2:25: Expected ";".')

    # protoc that cannot run here is no fault of the messages: the run fails, nothing is dead-lettered.
    def gone(*_):
        raise FileNotFoundError(2, "No such file or directory", "python")

    monkeypatch.setattr("deltadrain.formats.proto_source.compile_proto", gone)
    with pytest.raises(RegistryUnavailable, match=r"cannot compile the .proto text of schema id 10 with grpcio-tools"):
        fetch(r, 10, "PROTOBUF", ask=lambda url, _: (200, said))


def test_a_batch_of_many_schema_ids_is_read_with_each_writer_asked_once(server):
    good = [framed(11, {"event_id": f"a{i}", "customer": "c", "amount": i / 2}, V1) for i in range(30)]
    newer = [framed(12, {"quantity": i, "event_id": f"b{i}", "customer": "d", "amount": 1.0, "channel": "app"}, V2)
             for i in range(30)]
    lacking = [framed(13, {"event_id": "c1", "customer": "e"}, V3)]
    unknown = [framed(99, {"event_id": "z", "customer": "c", "amount": 1.0}, V1)]
    proto = [framed(20, {"event_id": "p", "customer": "c", "amount": 1.0}, V1)]
    values = [v for pair in zip(good, newer, strict=True) for v in pair] + lacking + unknown * 2 + proto
    cols = decoder(server.url).columns(values)
    got = {cols["_dd_message_id"][i].as_py(): (cols["amount"][i].as_py(), cols["quantity"][i].as_py(),
                                               cols["_dd_error_type"][i].as_py()) for i in range(len(values))}
    assert all(got[f"a{i}"] == (i / 2, None, None) for i in range(30))  # v1 has no quantity: null
    assert all(got[f"b{i}"] == (1.0, i, None) for i in range(30))  # v2's extra field is not a column
    assert got["c1"] == (None, None, None)
    errors = cols["_dd_error"].to_pylist()
    assert cols["_dd_error_type"].to_pylist()[-3:] == ["unknown_schema_id", "unknown_schema_id", "unsupported_schema"]
    assert errors[-2] == (f"unknown schema id 99 (the schema registry at {server.url} does not know it: Schema 99 "
                          f"not found)")
    assert cols["_dd_original"][len(values) - 2].as_py() == unknown[0]
    assert sorted(server.asked) == ["/schemas/ids/11", "/schemas/ids/12", "/schemas/ids/13", "/schemas/ids/20",
                                    "/schemas/ids/99"]
    # The next batch: writers are kept for the process, an unknown id is asked again (once).
    server.asked.clear()
    again = decoder(server.url, required=("event_id", "amount")).columns(good[:2] + lacking + unknown * 3)
    assert server.asked == ["/schemas/ids/99"]
    assert again["_dd_error_type"].to_pylist() == [None, None, "schema", *["unknown_schema_id"] * 3]
    assert again["_dd_error"][2].as_py() == "required field 'amount' is missing"
    # With avro.schema_id set, only that id is read: another is a dead letter, and not asked for.
    server.asked.clear()
    only = decoder(server.url, schema_id=12).columns(good[:1] + newer[:1])
    assert only["_dd_error"].to_pylist() == ["unknown schema id 11 (this pipeline reads schema id 12)", None]
    assert server.asked == []


def test_an_outage_fails_the_batch_whole_and_a_refused_login_names_its_fix(server, monkeypatch):
    values = [framed(11, {"event_id": "a", "customer": "c", "amount": 1.0}, V1)]
    server.fail_next = 2  # two 503s, then the answer: retried
    assert decoder(server.url).columns(values)["_dd_error_type"].to_pylist() == [None]
    assert len(server.asked) == 3
    reg._CACHE.clear()
    server.fail_next = 10
    with pytest.raises(RegistryUnavailable, match=r"after 4 attempts \(HTTP 503: store not ready\); nothing of "
                                                  r"the batch") as exc:
        decoder(server.url).columns(values)
    assert server.url in str(exc.value)
    server.fail_next = 0
    server.login = "drain:s3cret"
    monkeypatch.setenv("REG_USER", "drain")
    monkeypatch.setenv("REG_PASSWORD", "wrong")
    schema = {"url": server.url, "username_env": "REG_USER", "password_env": "REG_PASSWORD"}
    p = registry_payload(schema)
    with pytest.raises(RegistryLoginRefused) as refused:
        p.decoder(fields=FIELDS, id_field="event_id", required=["event_id"], max_bytes=4096, types=TYPES).columns(values)
    assert "wrong" not in str(refused.value) and "s3cret" not in str(refused.value)
    assert "check the login in the environment variables REG_USER and REG_PASSWORD" in str(refused.value)
    monkeypatch.setenv("REG_PASSWORD", "s3cret")
    p = registry_payload(schema)
    assert "s3cret" not in repr(p)
    cols = p.decoder(fields=FIELDS, id_field="event_id", required=["event_id"], max_bytes=4096,
                     types=TYPES).columns(values)
    assert cols["customer"].to_pylist() == ["c"]
    # The same login from an Airflow connection (here as the environment hands it to a job).
    reg._CACHE.clear()
    monkeypatch.setenv("AIRFLOW_CONN_SCHEMA_REGISTRY", json.dumps({"conn_type": "http", "login": "drain",
                                                                   "password": "s3cret"}))
    p = registry_payload({"url": server.url, "connection_id": "schema_registry"})
    assert p.decoder(fields=FIELDS, id_field="event_id", required=["event_id"], max_bytes=4096,
                     types=TYPES).columns(values)["customer"].to_pylist() == ["c"]
    monkeypatch.delenv("REG_PASSWORD")
    with pytest.raises(ConfigError, match="environment variable REG_PASSWORD .* is not set"):
        registry_payload(schema)


def registry_payload(registry: dict):
    from deltadrain.config import SchemaConfig

    return payload_of(SchemaConfig(format="avro", avro={"wire": "confluent"}, registry=registry, id_field="event_id",
                                   fields=FIELDS))


@pytest.mark.parametrize(("avro", "block", "message"), [
    ({}, {"registry": {"url": "http://u:pw@reg:8081"}}, "carries a login; put it in an Airflow connection"),
    ({}, {"registry": {"url": "ftp://reg"}}, "must be an http:// or https:// URL"),
    ({}, {"registry": {"url": "http://reg?password=x"}}, "has a query or '#' part"),
    ({}, {}, "format avro needs avro.schema_file, the writer's schema (.avsc), or registry.url"),
    ({"schema_file": "s.avsc"}, {}, "avro.wire confluent needs avro.schema_id, the id the messages carry, or "
                                    "registry.url"),
    ({"schema_file": "s.avsc", "schema_id": 1}, {"registry": {"connection_id": "r"}},
     "field 'schema.registry.url': Field required"),
    ({}, {"registry": {"url": "http://reg", "connection_id": "r", "password_env": "P"}}, "not both"),
    ({"wire": "plain"}, {"registry": {"url": "http://reg"}}, "registry needs avro.wire: confluent"),
])
def test_registry_settings_are_checked_at_load(tmp_path, avro, block, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as exc:
        load_config(avro_config(tmp_path, avro, **block))
    assert "pipeline 'clicks_avro', field 'schema" in str(exc.value) and "pw" not in str(exc.value)


def test_with_a_registry_the_schema_file_and_id_are_optional_and_the_connection_is_handed_over(tmp_path):
    cfg = load_config(avro_config(tmp_path, registry={"url": "https://reg.example:8081/apis/ccompat/v7/",
                                                       "connection_id": "schema_registry"}))
    p = cfg.pipelines[0]
    assert p.payload_schema.registry.url == "https://reg.example:8081/apis/ccompat/v7"
    assert p.payload_schema.avro.schema_file is None and p.payload_schema.avro.schema_id is None
    assert p.connection_ids() == ["schema_registry"]


def test_the_example_registry_pipeline_loads_and_produce_needs_a_schema_file_to_write_with():
    from deltadrain.dev.produce import generate, subject_of

    cfg = load_config(ROOT / "config" / "pipelines.registry.yaml")
    p = cfg.pipeline("clicks_avro_registry")
    assert p.payload_schema.registry.url == "http://127.0.0.1:18081/apis/ccompat/v7"
    assert p.connection_ids() == ["deltadrain_registry"]
    # `produce` registers the example's file under the topic's value subject and writes with its id.
    assert p.payload_schema.avro.schema_file == str(ROOT / "config" / "schemas" / "clicks.avsc")
    assert subject_of(p) == "clicks_avro_registry-value"
    spec = p.payload_schema
    bare = p.model_copy(update={"payload_schema": spec.model_copy(update={
        "avro": spec.avro.model_copy(update={"schema_file": None})})})
    with pytest.raises(ConfigError, match="pipeline 'clicks_avro_registry' reads its writers' schemas from the registry "
                                          "at http://127.0.0.1:18081/apis/ccompat/v7: `produce` needs schema.avro.schema_file"):
        next(generate(bare, 1, seed=1))


def proto_versions():
    """clicks.proto as registered (its FileDescriptorProto, importing the well-known Timestamp), and a next
    version with a message before Click (its indexes become [1]), no `amount`, and a new field."""
    from google.protobuf import descriptor_pb2

    fds = descriptor_pb2.FileDescriptorSet.FromString((ROOT / "config" / "schemas" / "clicks.desc").read_bytes())
    v1 = next(f for f in fds.file if f.name.endswith("clicks.proto"))
    v2 = descriptor_pb2.FileDescriptorProto()
    v2.CopyFrom(v1)
    v2.name = "clicks_v2.proto"
    click = v2.message_type[0]
    kept = [f for f in click.field if f.name != "amount"]
    del click.field[:]
    click.field.extend(kept)
    click.field.add(name="channel", number=8, type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
                    label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
    v2.message_type.insert(0, descriptor_pb2.DescriptorProto(name="Before"))
    return v1, v2


def test_protobuf_messages_are_parsed_as_the_message_their_id_and_indexes_name(server):
    from google.protobuf import descriptor_pb2, message_factory

    from deltadrain.formats.protobuf import ProtobufPayload, build_pool, write_indexes

    v1, v2 = proto_versions()
    for sid, f in ((21, v1), (22, v2)):
        server.schemas[sid] = {"schemaType": "PROTOBUF", "schema": base64.b64encode(f.SerializeToString()).decode()}

    def cls(f):
        pool = build_pool(descriptor_pb2.FileDescriptorSet(file=[f]).SerializeToString())
        return message_factory.GetMessageClass(pool.FindMessageTypeByName("dev.deltadrain.sample.Click"))

    one = header(21) + write_indexes([0]) + cls(v1)(event_id="p1", customer="c", amount=2.5, quantity=3).SerializeToString()
    two = header(22) + write_indexes([1]) + cls(v2)(event_id="p2", customer="d", quantity=4, channel="app").SerializeToString()
    wrong_index = header(22) + write_indexes([3]) + b""
    unknown = header(98) + write_indexes([0]) + b"\x0a\x01x"
    avro_id = header(11) + write_indexes([0]) + b"\x0a\x01x"
    p = ProtobufPayload(b"", "", "confluent", None, Registry(server.url, backoff_s=0.01))
    d = p.decoder(fields=FIELDS, id_field="event_id", required=["event_id"], max_bytes=4096, types=TYPES)
    cols = d.columns([one, two, two, wrong_index, unknown, avro_id])
    assert cols["_dd_message_id"].to_pylist()[:3] == ["p1", "p2", "p2"]
    assert cols["amount"].to_pylist()[:3] == [2.5, None, None] and cols["quantity"].to_pylist()[:3] == [3, 4, 4]
    assert cols["_dd_error_type"].to_pylist() == [None, None, None, "unknown_message_index", "unknown_schema_id",
                                                  "unsupported_schema"]
    assert cols["_dd_error"][3].as_py() == "message indexes [3] name no message of schema id 22 (clicks_v2.proto)"
    assert sorted(server.asked) == ["/schemas/ids/11?format=serialized", "/schemas/ids/21?format=serialized",
                                    "/schemas/ids/22?format=serialized", "/schemas/ids/98?format=serialized"]


@pytest.fixture(scope="module")
def tls_registry(tmp_path_factory):
    """The local registry over https, its certificate signed by a private CA (made with openssl, as the
    embedded Valkey's is), and a second CA that signed nothing of it."""
    import ssl

    from deltadrain.dev.services.valkey_tls import make_certificates

    ours, other = tmp_path_factory.mktemp("ca"), tmp_path_factory.mktemp("other-ca")
    make_certificates(ours)
    make_certificates(other)
    srv = ThreadingHTTPServer(("127.0.0.1", 0), FakeRegistryHandler)
    srv.lock, srv.asked, srv.fail_next, srv.login = threading.Lock(), [], 0, None
    srv.schemas = {11: {"schema": json.dumps(V1)}}
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(ours / "server.pem", ours / "server.key")
    srv.socket = context.wrap_socket(srv.socket, server_side=True)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    srv.url, srv.ca, srv.other_ca = f"https://127.0.0.1:{srv.server_address[1]}", ours / "ca.pem", other / "ca.pem"
    yield srv
    srv.shutdown()
    srv.server_close()


def test_an_https_registry_on_a_private_ca_is_read_with_its_ca_file_and_refused_once_without(
        tls_registry, tmp_path):
    """Without the CA the first ask fails on the certificate, and the run's one line names the setting
    to fix: no retries (no wait can make a certificate trusted). With another CA the line asks whether
    the file is the right one. With the file, given relative to the config, the writer is read."""
    waits = []
    for ca, fix in ((None, "set schema.registry.ca_file to the CA that signed it"),
                    (tls_registry.other_ca.read_text(), "is schema.registry.ca_file the CA that signed it?")):
        with pytest.raises(RegistryUntrusted, match=re.escape(fix)) as exc:
            fetch(Registry(tls_registry.url, ca_pem=ca, backoff_s=0.01), 11, "AVRO", sleep=waits.append)
        assert f"the schema registry at {tls_registry.url} presents a certificate this client does not trust" \
            in failure_line(exc.value)
    assert waits == [] and tls_registry.asked == []

    (tmp_path / "certs").mkdir()
    (tmp_path / "certs" / "registry-ca.pem").write_text(tls_registry.ca.read_text())
    cfg = load_config(avro_config(tmp_path, registry={"url": tls_registry.url, "ca_file": "certs/registry-ca.pem"}))
    schema = cfg.pipelines[0].payload_schema
    assert schema.registry.ca_file == str((tmp_path / "certs" / "registry-ca.pem").resolve())
    found = fetch(registry_of(schema), 11, "AVRO")
    assert json.loads(found.text) == V1 and tls_registry.asked == ["/schemas/ids/11"]


@pytest.mark.parametrize(("registry", "message"), [
    ({"url": "http://reg", "ca_file": "ca.pem"}, "field 'schema.registry': ca_file only applies to an https:// url"),
    ({"url": "https://reg", "ca_file": "missing.pem"}, "field 'schema.registry.ca_file': "),
    ({"url": "https://reg", "ca_file": "p.yaml"}, "field 'schema.registry.ca_file': "),
])
def test_a_registry_ca_file_that_cannot_serve_is_a_config_error_naming_it(tmp_path, registry, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as exc:
        load_config(avro_config(tmp_path, registry=registry))
    assert "pipeline 'clicks_avro', field 'schema.registry" in str(exc.value) and "ca_file" in str(exc.value)
    if registry["url"].startswith("https:"):  # the file, made absolute, and what is wrong with it
        assert str(tmp_path / registry["ca_file"]) in str(exc.value)
    if registry["ca_file"] == "missing.pem":
        assert "is not a readable PEM file of CA certificates" in str(exc.value)


def collecting(url: str, fields: dict, evolved=frozenset()) -> AvroBatchDecoder:
    """A decoder as a run with `evolution: add_columns` and a registry builds it: it collects new fields."""
    from deltadrain.formats.avro import AvroPayload

    types = {n: {"string": pa.string(), "double": pa.float64(), "long": pa.int64(), "int": pa.int32()}[t]
             for n, t in fields.items()}
    return AvroBatchDecoder(AvroPayload("", "confluent", None, Registry(url, backoff_s=0.01, timeout_s=5)),
                            fields=fields, id_field="event_id", required=["event_id"], max_bytes=4096, types=types,
                            evolved=evolved, collect_new=True)


def test_with_add_columns_each_writers_new_fields_travel_with_its_messages_typed_by_its_schema(server):
    """Writer v2 (id 12) adds quantity (long) and channel (string): its messages carry their values and the
    writer's types; v1's (id 12's elder, 11) carry none and keep the column-wise path. An evolved int
    column that v2 gives a long is carried too (the batch widens it); an unknown id stays a dead letter."""
    from deltadrain.formats.avro import decode_avro

    v4 = {**V2, "fields": [*V2["fields"], {"name": "tags", "type": {"type": "array", "items": "string"}},
                           {"name": "ratio", "type": "double"}]}
    server.schemas[14] = {"schema": json.dumps(v4)}
    old = [framed(11, {"event_id": f"a{i}", "customer": "c", "amount": 1.0}, V1) for i in range(20)]
    new = [framed(12, {"quantity": i, "event_id": f"b{i}", "customer": "d", "amount": 2.0, "channel": "app"}, V2)
           for i in range(5)]
    nan = framed(14, {"quantity": None, "event_id": "n1", "customer": "d", "amount": 2.0, "channel": "x",
                      "tags": ["t"], "ratio": float("nan")}, v4)
    unknown = framed(99, {"event_id": "z", "customer": "c", "amount": 1.0}, V1)
    values = old + new + [nan, unknown]
    fields = {"event_id": "string", "customer": "string", "amount": "double"}
    d = collecting(server.url, fields)
    cols = d.columns(values)
    extra, kinds = cols["_dd_extra"].to_pylist(), cols["_dd_extra_kinds"].to_pylist()
    assert extra[:20] == [None] * 20 and kinds[:20] == [None] * 20
    assert [json.loads(e) for e in extra[20:25]] == [{"channel": "app", "quantity": i} for i in range(5)]
    assert set(kinds[20:25]) == {'{"channel": "string", "quantity": "long"}'}
    assert cols["_dd_original"].to_pylist()[20:25] == new  # kept: the batch's vote may refuse them
    assert cols["_dd_error_type"].to_pylist()[25:] == ["schema", "unknown_schema_id"]
    assert cols["_dd_error"][25].as_py() == ("new field 'ratio' is double in its writer's schema, and nan is no "
                                             "double value a column holds")
    # Message by message gives the same (the column-wise path took only v1's, which add nothing).
    for i, value in enumerate(values):
        got = decode_avro(value, d.payload, fields=fields, id_field="event_id", required=["event_id"], max_bytes=4096,
                          writer_of=d.writer_of, columns_of=d.columns_of)
        if got.values is not None:
            assert got.values[-2:] == (extra[i], kinds[i]) and got.values[0] == cols["_dd_message_id"][i].as_py()
    # v4's array is left out; its reason travels in the signature (the run logs it).
    v4_kinds = json.loads(d.columns_of(14).signature)
    assert v4_kinds["tags"].startswith("-Avro field 'tags' is array") and v4_kinds["ratio"] == "double"

    # Once quantity is an evolved int column, v2's long goes with the new fields (to be widened), the
    # typed column stays null for those rows; v1 lacks it: null.
    evolved = collecting(server.url, {**fields, "quantity": "int", "channel": "string"},
                         frozenset({"quantity", "channel"}))
    cols = evolved.columns(old[:2] + new[:2])
    assert cols["quantity"].to_pylist() == [None] * 4 and cols["channel"].to_pylist() == [None, None, "app", "app"]
    assert cols["_dd_extra"].to_pylist() == [None, None, '{"quantity": 0}', '{"quantity": 1}']
    assert cols["_dd_extra_kinds"].to_pylist()[2:] == ['{"quantity": "long"}'] * 2
    # An outage still fails the batch whole: nothing decoded, nothing dead-lettered.
    reg._CACHE.clear()
    server.fail_next = 10
    with pytest.raises(RegistryUnavailable):
        collecting(server.url, fields).columns(new)


def test_with_add_columns_a_protobuf_writers_new_scalars_travel_with_its_messages(server):
    from google.protobuf import descriptor_pb2, message_factory

    from deltadrain.formats.protobuf import ProtobufPayload, build_pool, write_indexes

    v1, v2 = proto_versions()
    click = v2.message_type[1]
    T = descriptor_pb2.FieldDescriptorProto  # the protobuf type's name
    click.field.add(name="tags", number=9, type=T.TYPE_STRING, label=T.LABEL_REPEATED)
    click.field.add(name="seen", number=10, type=T.TYPE_MESSAGE, type_name=".google.protobuf.Timestamp",
                    label=T.LABEL_OPTIONAL)
    click.field.add(name="small", number=11, type=T.TYPE_SINT32, label=T.LABEL_OPTIONAL)
    for sid, f in ((21, v1), (22, v2)):
        server.schemas[sid] = {"schemaType": "PROTOBUF", "schema": base64.b64encode(f.SerializeToString()).decode()}
    pool = build_pool(descriptor_pb2.FileDescriptorSet(file=[v2]).SerializeToString())
    cls = message_factory.GetMessageClass(pool.FindMessageTypeByName("dev.deltadrain.sample.Click"))
    msg = cls(event_id="p2", customer="d", quantity=4, channel="app", tags=["a"], small=-3)
    msg.seen.FromMicroseconds(1_777_593_600_000_001)
    two = header(22) + write_indexes([1]) + msg.SerializeToString()
    bare = header(22) + write_indexes([1]) + cls(event_id="p3", customer="e").SerializeToString()
    fields = {"event_id": "string", "customer": "string", "quantity": "int"}
    p = ProtobufPayload(b"", "", "confluent", None, Registry(server.url, backoff_s=0.01))
    d = p.decoder(fields=fields, id_field="event_id", required=["event_id"], max_bytes=4096,
                  types={"event_id": pa.string(), "customer": pa.string(), "quantity": pa.int32()},
                  evolved=frozenset({"quantity"}), collect_new=True)
    cols = d.columns([two, bare])
    assert cols["_dd_error_type"].to_pylist() == [None, None]
    # quantity (int64) widens the evolved int column; channel (proto3 string) is "" when unset, as
    # Protobuf defines it, an enum its value's name; seen and note (fields with presence) are null when unset.
    assert [json.loads(e) for e in cols["_dd_extra"].to_pylist()] == [
        {"channel": "app", "quantity": 4, "seen": 1_777_593_600_000_001, "small": -3, "status": "STATUS_UNSPECIFIED"},
        {"channel": "", "quantity": 0, "small": 0, "status": "STATUS_UNSPECIFIED"}]
    assert json.loads(cols["_dd_extra_kinds"][0].as_py()) == {
        "channel": "string", "quantity": "long", "seen": "timestamp", "small": "int", "status": "string",
        "note": "string", "event_time": "timestamp",
        "tags": "-Protobuf field 'tags' is repeated, which no column type deltadrain writes holds"}
    assert cols["quantity"].to_pylist() == [None, None]


def test_a_bare_services_up_starts_the_embedded_registry_only_for_a_pipeline_that_reads_it(monkeypatch):
    from deltadrain.config.embedded import REGISTRY_CONNECTION_ID, airflow_env, registry_login, registry_url
    from deltadrain.dev import services

    monkeypatch.delenv("DELTADRAIN_REGISTRY_PORT", raising=False)
    monkeypatch.delenv("AIRFLOW_CONN_DELTADRAIN_REGISTRY", raising=False)
    reads_it = load_config(ROOT / "config" / "pipelines.registry.yaml")
    assert registry_url(reads_it) == "http://127.0.0.1:18081/apis/ccompat/v7"
    assert "registry" in services.defaults(reads_it)
    assert "registry" not in services.defaults(load_config(ROOT / "config" / "pipelines.yaml"))
    # Airflow gets its login as the connection the example names; its process, never its command line.
    conn = json.loads(airflow_env(reads_it)["AIRFLOW_CONN_DELTADRAIN_REGISTRY"])
    assert reads_it.pipelines[0].payload_schema.registry.connection_id == REGISTRY_CONNECTION_ID
    assert (conn["login"], conn["password"]) == (registry_login()["username"], registry_login()["password"])
    monkeypatch.setattr(services, "classpath", lambda kind: [Path(f"/cache/{kind}/quarkus-app/quarkus-run.jar")])
    svc = services.registry_service(reads_it)
    svc.prepare()
    command = svc.command()
    assert svc.ports == [18081] and command[-2:] == ["-jar", "/cache/registry/quarkus-app/quarkus-run.jar"]
    assert "-Dquarkus.http.port=18081" in command and registry_login()["password"] not in " ".join(command)
    assert svc.env["DELTADRAIN_REGISTRY_PASSWORD"] == registry_login()["password"]


def test_an_avro_writer_s_imports_are_fetched_in_place_of_their_first_use_and_a_missing_one_is_a_dead_letter():
    from deltadrain.formats.avro import parse_writer, read_datum

    source = {"type": "record", "name": "Source", "namespace": "io.x", "fields": [
        {"name": "lsn", "type": ["null", "long"]}, {"name": "at", "type": "io.x.Stamp"}]}
    stamp = {"type": "record", "name": "Stamp", "namespace": "io.x", "fields": [{"name": "ms", "type": "long"}]}
    envelope = {"type": "record", "name": "Envelope", "fields": [
        {"name": "op", "type": "string"}, {"name": "source", "type": "io.x.Source"},
        {"name": "again", "type": ["null", "io.x.Source"]}]}
    ref = {"name": "io.x.Source", "subject": "io.x.Source", "version": 1}
    answers = {"http://reg/schemas/ids/8": {"schema": json.dumps(envelope), "references": [ref]},
               "http://reg/subjects/io.x.Source/versions/1": {"schema": json.dumps(source), "references": [
                   {"name": "io.x.Stamp", "subject": "io.x.Stamp", "version": 3}]},
               "http://reg/subjects/io.x.Stamp/versions/3": {"schema": json.dumps(stamp)}}
    asked = []

    def ask(url, _):
        asked.append(url)
        if url not in answers:
            return 404, b'{"error_code":40401,"message":"No subject"}'
        return 200, json.dumps(answers[url]).encode()

    r = Registry("http://reg")
    found = fetch(r, 8, "AVRO", sleep=lambda s: None, ask=ask)
    assert [name for name, _ in found.imports] == ["io.x.Source", "io.x.Stamp"] and found.pending == ()
    schema, parsed = parse_writer(found, 8)
    assert schema["fields"][1]["type"]["name"] == "Source" and schema["fields"][2]["type"] == ["null", "io.x.Source"]
    import fastavro

    out = io.BytesIO()
    datum = {"op": "c", "source": {"lsn": 7, "at": {"ms": 1}}, "again": None}
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), datum)
    assert read_datum(out.getvalue(), parsed) == (datum, None)
    del answers["http://reg/subjects/io.x.Stamp/versions/3"]
    missing = fetch(r, 8, "AVRO", sleep=lambda s: None, ask=ask)
    assert (missing.text, missing.error_type) == (None, "unsupported_schema")
    assert "schema id 8 imports io.x.Stamp v3, which the schema registry at http://reg does not have" in missing.error
