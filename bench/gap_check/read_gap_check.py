"""What checking every claim read for gaps costs (bench/gap_check/README.md).

A claim task's XREADGROUP runs in one MULTI/EXEC with XINFO STREAM and XINFO GROUPS
(`claim.read_new_past_gaps`), so that entries trimmed past the group's position while the task reads
are recorded as a gap. This reads COUNT ~200-byte entries of one stream in READ_CHUNK chunks, the
plain way (`claim.read_new`) and the checked way, alternating ROUNDS times each, from a Valkey of its
own (`common/own_valkey.py`: AOF with `appendfsync always`, as `services up` runs it).

Usage: .venv/bin/python bench/gap_check/read_gap_check.py PORT [COUNT [ROUNDS]]
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from deltadrain.sources.valkey.claim import READ_CHUNK, ClaimContext, read_new, read_new_past_gaps, reader

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))  # bench/common: shared helpers
from own_valkey import own_valkey

STREAM, GROUP = "bench:{0}", "g"


def fill(client, count: int) -> None:
    body = json.dumps({"event_id": "evt-000000001", "customer": "cust-00001", "amount": 12.5, "quantity": 3,
                       "status": "paid", "event_time": "2026-01-01T00:00:00Z", "note": "x" * 40}).encode()
    pipe = client.pipeline(transaction=False)
    for i in range(count):
        pipe.xadd(STREAM, {b"data": body})
        if i % READ_CHUNK == READ_CHUNK - 1:
            pipe.execute()
    pipe.execute()


def read_all(client, ctx: ClaimContext, checked: bool, count: int) -> float:
    client.xgroup_destroy(STREAM, GROUP)
    client.xgroup_create(STREAM, GROUP, id="0")
    r = reader(ctx)
    got, start = 0, time.perf_counter()
    while got < count:
        chunk = (read_new_past_gaps(r, ctx, STREAM, READ_CHUNK) if checked
                 else read_new(r, GROUP, ctx.consumer, STREAM, READ_CHUNK))
        if not chunk:
            break
        got += len(chunk)
    seconds = time.perf_counter() - start
    r.close()
    assert got == count, got
    return seconds


def main() -> None:
    port = int(sys.argv[1])
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 200_000
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    with own_valkey(port) as (client, _):
        fill(client, count)
        client.xgroup_create(STREAM, GROUP, id="0")
        ctx = ClaimContext(url=f"redis://127.0.0.1:{port}/0", username=None, password=None, group=GROUP,
                           consumer="bench", min_idle_ms=60_000, max_attempts=4, fields={}, id_field="event_id",
                           required=[], max_bytes=1 << 20, failures_key="bench:failures", gaps_key="bench:gaps")
        for _ in range(rounds):
            for checked in (False, True):
                seconds = read_all(client, ctx, checked, count)
                print(json.dumps({"read": "checked" if checked else "plain", "entries": count,
                                  "seconds": round(seconds, 3), "entries_per_s": round(count / seconds)}),
                      flush=True)


if __name__ == "__main__":
    main()
