"""What decoding Avro and Protobuf payloads costs against JSON, for the same records
(bench/avro_decode/README.md).

COUNT sample events (`deltadrain produce`'s, ~200 bytes as JSON) are made five ways from one seed: JSON
(the `clicks` pipeline of config/pipelines.yaml), Avro in the Confluent wire format (`clicks_avro`)
and plain Avro datums (`orders_avro`, config/pipelines.avro.yaml), Protobuf in the Confluent wire
format (`clicks_proto`) and plain (`orders_proto`, config/pipelines.protobuf.yaml; decoded message by
message, `protobuf.decode_protobuf` for each). Each is decoded into the claim's
Arrow columns the way a read task does (`claim.decoder_for`: the JSON path's Arrow reader, the Avro
path's fastavro read with the values put into Arrow a column at a time), CHUNK messages per call; the
Confluent-framed Avro also message by message (`avro.decode_avro` for each, the path bad messages
take), and with a schema registry (`avro_confluent_registry`: the same messages, each id's writer
asked of a local HTTP server that answers as a Confluent-compatible registry, kept for the process
after the first batch, as a read task's worker keeps it). The seven alternate ROUNDS times; the wall
and CPU seconds of each pass are kept, and the medians reported. No services, no Spark.

Usage: .venv/bin/python bench/avro_decode/avro_decode.py [COUNT [ROUNDS [CHUNK]]]
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

import pyarrow as pa

from deltadrain.config import RegistrySettings, load_config
from deltadrain.dev.produce import generate
from deltadrain.sources.valkey.claim import decoder_for

ROOT = Path(__file__).resolve().parents[2]
TYPES = {"event_id": pa.string(), "customer": pa.string(), "amount": pa.float64(), "quantity": pa.int64(),
         "status": pa.string(), "event_time": pa.timestamp("us", tz="UTC")}


def local_registry(schema_text: str) -> str:
    """A local HTTP server answering GET /schemas/ids/{id} with `schema_text` (any id): its URL."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    body = json.dumps({"schema": schema_text}).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # http.server's name
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}"


class Ctx:
    """The part of a read context the decoder is built from."""

    def __init__(self, p):
        from deltadrain.formats.payloads import payload_of

        s = p.payload_schema
        self.fields, self.id_field, self.required = dict(s.fields), s.id_field, list(s.required)
        self.max_bytes, self.payload = p.max_message_bytes, payload_of(s)


def one_pass(decoder, values: list[bytes], chunk: int) -> tuple[float, float, int]:
    wall, cpu = time.perf_counter(), time.process_time()
    good = 0
    for start in range(0, len(values), chunk):
        cols = decoder.columns(values[start:start + chunk])
        good += cols["_dd_error_type"].null_count
    return time.perf_counter() - wall, time.process_time() - cpu, good


def main(count: int = 200_000, rounds: int = 5, chunk: int = 10_000) -> dict:
    json_p = load_config(ROOT / "config" / "pipelines.yaml").pipeline("clicks")
    avro_cfg = load_config(ROOT / "config" / "pipelines.avro.yaml")
    proto_cfg = load_config(ROOT / "config" / "pipelines.protobuf.yaml")
    sides = {"json": json_p, "avro_confluent": avro_cfg.pipeline("clicks_avro"),
             "avro_plain": avro_cfg.pipeline("orders_avro"), "avro_confluent_per_message": avro_cfg.pipeline("clicks_avro"),
             "protobuf_confluent": proto_cfg.pipeline("clicks_proto"), "protobuf_plain": proto_cfg.pipeline("orders_proto")}
    clicks = sides["avro_confluent"]
    url = local_registry((ROOT / "config" / "schemas" / "clicks.avsc").read_text())
    spec = clicks.payload_schema
    sides["avro_confluent_registry"] = clicks.model_copy(update={"payload_schema": spec.model_copy(update={
        "registry": RegistrySettings(url=url), "avro": spec.avro.model_copy(update={"schema_id": None})})})
    schema = [pa.field(name, kind) for name, kind in TYPES.items()]
    data, decoders = {}, {}
    for name, p in sides.items():
        data[name] = [m.value for m in generate(p, count, seed=7)]
        decoders[name] = decoder_for(Ctx(p), schema)
    decoders["avro_confluent_per_message"].fast = False  # every message through avro.decode_avro
    ids = {name: [None] for name in sides}
    runs: dict[str, list] = {name: [] for name in sides}
    for _ in range(rounds):
        for name in sides:
            wall, cpu, good = one_pass(decoders[name], data[name], chunk)
            assert good == count, f"{name}: {count - good} messages did not decode"
            runs[name].append((wall, cpu))
    for name in sides:  # the same records: the same ids in the same order
        ids[name] = decoders[name].columns(data[name][:1000])["_dd_message_id"].to_pylist()
    assert all(ids[name] == ids["json"] for name in sides)
    out = {"count": count, "rounds": rounds, "chunk": chunk, "load_average": os.getloadavg(),
           "bytes_per_message": {n: round(sum(map(len, data[n])) / count, 1) for n in sides}}
    for name in sides:
        wall = statistics.median(w for w, _ in runs[name])
        cpu = statistics.median(c for _, c in runs[name])
        out[name] = {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "cpu_us_per_message": round(cpu / count * 1e6, 2),
                     "wall_all": [round(w, 3) for w, _ in runs[name]], "cpu_all": [round(c, 3) for _, c in runs[name]]}
    return out


if __name__ == "__main__":
    print(json.dumps(main(*(int(a) for a in sys.argv[1:])), indent=1))
