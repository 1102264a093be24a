"""A local HTTP server that speaks the schema registry's `GET /schemas/ids/{id}` (the Confluent-compatible
API), to reach answers a real registry will not give on demand, with the writer schemas it starts with;
and the example's Confluent-framed Avro pipeline config that reads through a registry."""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml

from deltadrain.formats import registry as reg

ROOT = Path(__file__).resolve().parents[2]

V1 = {"type": "record", "name": "Click", "namespace": "t", "fields": [
    {"name": "event_id", "type": "string"}, {"name": "customer", "type": "string"},
    {"name": "amount", "type": "double"}]}
# The producer's next version: a long before the others, and a field the pipeline does not declare.
V2 = {"type": "record", "name": "Click", "namespace": "t", "fields": [
    {"name": "quantity", "type": ["null", "long"], "default": None}, {"name": "event_id", "type": "string"},
    {"name": "customer", "type": "string"}, {"name": "amount", "type": "double"},
    {"name": "channel", "type": "string", "default": "web"}]}
# A version without `amount`: null when it is optional, a `schema` dead letter when it is required.
V3 = {"type": "record", "name": "Click", "namespace": "t", "fields": [
    {"name": "event_id", "type": "string"}, {"name": "customer", "type": "string"}]}


class FakeRegistryHandler(BaseHTTPRequestHandler):
    def do_GET(self):  # http.server's name
        srv = self.server
        with srv.lock:
            srv.asked.append(self.path)
            failing = srv.fail_next > 0
            srv.fail_next -= failing
        if failing:
            return self._send(503, {"error_code": 50003, "message": "store not ready"})
        if srv.login is not None:
            want = "Basic " + base64.b64encode(srv.login.encode()).decode()
            if self.headers.get("Authorization") != want:
                return self._send(401, {"error_code": 40101, "message": "Unauthorized"})
        path, _, query = self.path.partition("?")
        if query not in ("", "format=serialized"):
            return self._send(422, {"error_code": 42202, "message": f"unknown option {query}"})
        parts = path.strip("/").split("/")
        if parts[:2] != ["schemas", "ids"] or len(parts) != 3:
            return self._send(404, {"error_code": 40401, "message": "not found"})
        found = srv.schemas.get(int(parts[2]))
        if found is None:
            return self._send(404, {"error_code": 40403, "message": f"Schema {parts[2]} not found"})
        if found.get("schemaType") == "PROTOBUF" and query != "format=serialized":
            found = {**found, "schema": "syntax = \"proto3\"; // as text: what a client without a parser cannot read"}
        self._send(200, found)

    def _send(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@contextmanager
def fake_registry() -> Iterator[ThreadingHTTPServer]:
    """The fake registry serving V1..V3 (ids 11..13) and a protobuf schema (20) at `.url`; `.asked` lists the
    paths asked, `.fail_next` answers that many requests 503, `.login` ("user:password") demands Basic auth."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), FakeRegistryHandler)
    srv.lock, srv.asked, srv.fail_next, srv.login = threading.Lock(), [], 0, None
    srv.schemas = {11: {"schema": json.dumps(V1)}, 12: {"schema": json.dumps(V2)}, 13: {"schema": json.dumps(V3)},
                   20: {"schema": "syntax = \"proto3\"; message M {}", "schemaType": "PROTOBUF"}}
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    srv.url = f"http://127.0.0.1:{srv.server_address[1]}"
    reg._CACHE.clear()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
        reg._CACHE.clear()


def avro_config(tmp_path, avro: dict | None = None, **schema_block) -> Path:
    """The example's Confluent-framed Avro pipeline, with no schema file or id unless `avro` gives them."""
    data = yaml.safe_load((ROOT / "config" / "pipelines.avro.yaml").read_text())
    pipe = data["pipelines"][0]
    pipe["schema"]["avro"] = {"wire": "confluent", **(avro or {})}
    pipe["schema"].update(schema_block)
    data["pipelines"] = [pipe]
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    return path
