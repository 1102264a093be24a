"""What the number of ids per XACK costs the acknowledgement of a Valkey batch
(bench/ack_chunks/README.md). `acknowledge.acknowledge` sends one XACK per ACK_IDS staged positions of
a stream; a batch of COUNT entries over four streams is acknowledged with each size in
turn (alternating the order), every time after the same entries were read into the group again, from
a Valkey of its own (started and stopped here, AOF with `appendfsync always` as `services up` runs it).

Usage: PYTHONPATH=$PWD/include .venv/bin/python bench/ack_chunks/ack_chunks.py PORT [COUNT [ROUNDS [SIZES]]]
(SIZES: ids per XACK, comma-separated, default 500,5000)
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from deltadrain.sources.valkey import acknowledge as ack
from deltadrain.sources.valkey.claim import ClaimContext

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))  # bench/common: shared helpers
from own_valkey import own_valkey

STREAMS, GROUP = [f"bench:{{{k}}}" for k in range(4)], "g"


def fill(client, count: int) -> None:
    for k, stream in enumerate(STREAMS):
        pipe = client.pipeline(transaction=False)
        for i in range(count // len(STREAMS)):
            pipe.xadd(stream, {b"data": b"x" * 200}, id=f"{1790000000000 + i}-{k}")
            if i % 10_000 == 9_999:
                pipe.execute()
        pipe.execute()


def claim_all(client) -> None:
    for stream in STREAMS:
        client.xgroup_destroy(stream, GROUP)
        client.xgroup_create(stream, GROUP, id="0")
        while client.xreadgroup(GROUP, "bench", {stream: ">"}, count=50_000):
            pass


def staged_file(directory: Path, count: int) -> str:
    """The columns `acknowledge` reads, as a claim stages them: the streams interleaved."""
    per = count // len(STREAMS)
    rows = [(STREAMS[n % len(STREAMS)], f"{1790000000000 + n // len(STREAMS)}-{n % len(STREAMS)}")
            for n in range(per * len(STREAMS))]
    path = directory / "staged.parquet"
    pq.write_table(pa.table({"_dd_partition": [r[0] for r in rows], "_dd_position": [r[1] for r in rows],
                             "_dd_attempts": pa.array([1] * len(rows), pa.int32()),
                             "payload": ["x" * 60] * len(rows)}), path)
    return str(path)


def main() -> None:
    port = int(sys.argv[1])
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 200_000
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 4
    chunks = [int(c) for c in (sys.argv[4] if len(sys.argv) > 4 else "500,5000").split(",")]
    with own_valkey(port) as (client, data):
        fill(client, count)
        for stream in STREAMS:
            client.xgroup_create(stream, GROUP, id="0")
        staged = staged_file(Path(data), count)
        ctx = ClaimContext(url=f"redis://127.0.0.1:{port}/0", username=None, password=None, group=GROUP,
                           consumer="bench", min_idle_ms=60_000, max_attempts=4, fields={}, id_field="event_id",
                           required=[], max_bytes=1 << 20, failures_key="bench:failures", gaps_key="bench:gaps")
        times: dict[int, list[float]] = {c: [] for c in chunks}
        for r in range(rounds):
            for chunk in chunks if r % 2 == 0 else list(reversed(chunks)):
                claim_all(client)
                ack.ACK_IDS = chunk
                started = time.perf_counter()
                done = ack.acknowledge([staged], ctx)
                times[chunk].append(round(time.perf_counter() - started, 3))
                pending = sum(client.xpending(s, GROUP)["pending"] for s in STREAMS)
                assert done == count and pending == 0, (done, pending)
        print(json.dumps({"command": " ".join(["bench/ack_chunks/ack_chunks.py", *sys.argv[1:]]),
                          "entries": count, "streams": len(STREAMS), "seconds": times,
                          "median": {c: statistics.median(t) for c, t in times.items()}}, indent=2))


if __name__ == "__main__":
    main()
