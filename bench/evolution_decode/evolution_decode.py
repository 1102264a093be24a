"""What schema evolution (`schema.evolution: add_columns`) costs a read task's JSON decode
(bench/evolution_decode/README.md).

COUNT sample events of the `clicks` pipeline (config/pipelines.yaml; each carries a `note` field the
pipeline does not declare) are decoded into the claim's Arrow columns three ways, CHUNK messages per
call: evolution none (`note` ignored, today's path); add_columns once the table has a `note` column
(it is then an evolved field, typed by the table); add_columns in the batch that brings `note` (a
field no column holds yet: every message is decoded one by one and keeps its new fields). The three
alternate ROUNDS times; the medians of wall and CPU seconds are reported. No services, no Spark.

Usage: .venv/bin/python bench/evolution_decode/evolution_decode.py [COUNT [ROUNDS [CHUNK]]]
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

import pyarrow as pa

from deltadrain.config import load_config
from deltadrain.dev.produce import generate
from deltadrain.formats.decode import BatchDecoder

ROOT = Path(__file__).resolve().parents[2]
TYPES = {"event_id": pa.string(), "customer": pa.string(), "amount": pa.float64(), "quantity": pa.int64(),
         "status": pa.string(), "event_time": pa.timestamp("us", tz="UTC"), "note": pa.string()}


def one_pass(decoder, values: list[bytes], chunk: int) -> tuple[float, float, int]:
    wall, cpu = time.perf_counter(), time.process_time()
    good = 0
    for start in range(0, len(values), chunk):
        good += decoder.columns(values[start:start + chunk])["_dd_error_type"].null_count
    return time.perf_counter() - wall, time.process_time() - cpu, good


def main(count: int = 200_000, rounds: int = 3, chunk: int = 10_000) -> dict:
    p = load_config(ROOT / "config" / "pipelines.yaml").pipeline("clicks")
    s = p.payload_schema
    values = [m.value for m in generate(p, count, seed=7)]
    common = {"id_field": s.id_field, "required": list(s.required), "max_bytes": p.max_message_bytes}
    evolved = {**s.fields, "note": "string"}
    sides = {
        "none": BatchDecoder(fields=dict(s.fields), types=TYPES, **common),
        "add_columns, note a column already": BatchDecoder(fields=evolved, types=TYPES, evolved=frozenset({"note"}),
                                                           collect_new=True, **common),
        "add_columns, note new in the batch": BatchDecoder(fields=dict(s.fields), types=TYPES, collect_new=True,
                                                           **common),
    }
    runs: dict[str, list] = {name: [] for name in sides}
    for _ in range(rounds):
        for name, decoder in sides.items():
            runs[name].append(one_pass(decoder, values, chunk))
    return {"count": count, "rounds": rounds, "chunk": chunk, "load_average": os.getloadavg(),
            "sides": {name: {"wall_s": statistics.median(r[0] for r in rs), "cpu_s": statistics.median(r[1] for r in rs),
                             "cpu_us_per_msg": round(statistics.median(r[1] for r in rs) / count * 1e6, 2),
                             "good": rs[0][2], "passes": rs} for name, rs in runs.items()}}


if __name__ == "__main__":
    print(json.dumps(main(*map(int, sys.argv[1:])), indent=2))
