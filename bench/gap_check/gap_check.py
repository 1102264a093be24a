"""What the Valkey drain's gap check costs a run (bench/gap_check/README.md).

Before its XREADGROUP, every Valkey drain asks each stream whether entries were removed before the
group read them (XINFO STREAM and XINFO GROUPS, `gaps.stream_state` / `unread_gap`) and reads the
pipeline's gap records (HGETALL). This times exactly those calls, on the sample `orders` pipeline's
streams holding COUNT entries, with its own Valkey (started and stopped here; DELTADRAIN_HOME and
DELTADRAIN_VALKEY_PORT private to it). The streams are deleted afterwards.

Usage: DELTADRAIN_HOME=/tmp/ddgapcost DELTADRAIN_VALKEY_PORT=26961 .venv/bin/python bench/gap_check/gap_check.py [COUNT [ROUNDS]]
"""

from __future__ import annotations

import json
import statistics
import sys
import time

from deltadrain.config import load_config
from deltadrain.dev import services
from deltadrain.dev.produce import produce
from deltadrain.sources.valkey.client import valkey_client
from deltadrain.sources.valkey.drain import ensure_groups
from deltadrain.sources.valkey.gaps import gaps_key, recorded, unread_gaps


def main(count: int = 200_000, rounds: int = 300) -> dict:
    cfg = load_config()
    p = cfg.pipeline("orders")
    with services.running(cfg, ["valkey"]):
        client = valkey_client(cfg, p)
        try:
            produce(cfg, p, count, seed=1, progress=False)
            ensure_groups(client, p.source)
            times, found = [], []
            for _ in range(rounds):
                began = time.perf_counter()
                found = unread_gaps(client, p.source.streams, p.source.group, gaps_key(p.name))
                recorded(client, gaps_key(p.name))
                times.append(time.perf_counter() - began)
            lengths = {s: client.xlen(s) for s in p.source.streams}
        finally:
            for key in (*p.source.streams, gaps_key(p.name)):
                client.delete(key)
    ms = sorted(t * 1000 for t in times)
    return {"streams": lengths, "rounds": rounds, "median_ms": round(statistics.median(ms), 3),
            "p95_ms": round(ms[int(len(ms) * 0.95)], 3), "max_ms": round(ms[-1], 3), "gaps_found": len(found)}


if __name__ == "__main__":
    print(json.dumps(main(*map(int, sys.argv[1:3]))))
