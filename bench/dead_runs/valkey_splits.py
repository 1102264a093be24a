"""What looking for dead runs' entries costs a Valkey run (bench/dead_runs/README.md).

Every Valkey drain now pages the pending list for entries idle past min_idle_ms before it claims
(`valkey.crashes.find_split`: XPENDING ... IDLE, one call per stream when nothing is stuck). This
times, on the sample `orders` pipeline's streams holding COUNT entries, with its own Valkey (started
and stopped here; DELTADRAIN_HOME and DELTADRAIN_VALKEY_PORT private to it):

1. nothing stuck: `find_split` against the XINFO GROUPS call every run already makes per stream
   (`backlog`), alternating, ROUNDS times;
2. a dead run's DEAD entries, delivered once (reclaimed whole: the scan finds no split) and
   delivered twice (the scan looks up transform failures, then splits): `find_split`, 5 rounds each;
3. handing the untried half to REST after the first half was claimed (`mark_rest`), 3 rounds.

Usage: DELTADRAIN_HOME=/tmp/ddsplit DELTADRAIN_VALKEY_PORT=26971 .venv/bin/python bench/dead_runs/valkey_splits.py \\
           [COUNT [DEAD [ROUNDS]]]
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))  # bench/common: shared helpers

from timing import median_ms

from deltadrain.config import load_config
from deltadrain.dev import services
from deltadrain.dev.produce import produce
from deltadrain.sources.valkey.client import valkey_client
from deltadrain.sources.valkey.crashes import REST, find_split, mark_rest
from deltadrain.sources.valkey.drain import backlog, ensure_groups, failures_key

OWN = "drain-bench"


def dead_run(client, p, dead: int, deliveries: int) -> None:
    """Fresh group; a consumer claims `dead` entries of each stream's share and dies; each further
    delivery is another consumer's XAUTOCLAIM of them (then it dies too)."""
    per_stream = -(-dead // len(p.source.streams))
    for stream in p.source.streams:
        client.xgroup_destroy(stream, p.source.group)
    ensure_groups(client, p.source)
    for stream in p.source.streams:
        got = 0
        while got < per_stream:
            reply = client.xreadgroup(p.source.group, "drain-dead-1", {stream: ">"}, count=min(5000, per_stream - got))
            if not reply:
                break
            got += len(reply[0][1])
        for n in range(2, deliveries + 1):
            cursor = "0-0"
            while True:
                cursor, _, _ = client.xautoclaim(stream, p.source.group, f"drain-dead-{n}", 0, start_id=cursor,
                                                 count=5000, justid=False)
                if cursor in (b"0-0", "0-0"):
                    break


def split_of(client, p, own: str = OWN):
    return find_split(client, p.source.streams, p.source.group, 0, failures_key(p.name), own, p.max_retries + 1)


def main(count: int, dead: int, rounds: int) -> dict:
    cfg = load_config()
    p = cfg.pipeline("orders")
    out: dict = {"count": count, "dead": dead, "streams": len(p.source.streams)}
    with services.running(cfg, ["valkey"]):
        client = valkey_client(cfg, p)
        try:
            produce(cfg, p, count, seed=1, progress=False)
            ensure_groups(client, p.source)
            times: dict[str, list] = {"find_split": [], "backlog": []}
            for i in range(rounds):
                for what in ("find_split", "backlog") if i % 2 else ("backlog", "find_split"):
                    began = time.perf_counter()
                    split_of(client, p) if what == "find_split" else backlog(client, p.source)
                    times[what].append(time.perf_counter() - began)
            out["nothing stuck (ms, median)"] = {k: median_ms(v, 2) for k, v in times.items()}

            for deliveries in (1, 2):
                dead_run(client, p, dead, deliveries)
                took, split = [], None
                for _ in range(5):
                    began = time.perf_counter()
                    split = split_of(client, p)
                    took.append(time.perf_counter() - began)
                out[f"{dead} dead, delivered {deliveries}x: find_split (ms, median)"] = median_ms(took, 2)
                out[f"{dead} dead, delivered {deliveries}x: split"] = None if split is None else {
                    "how": split.how, "segment": split.segment.entries, "read": sum(n for _, _, n in split.read)}

            marked = []
            for _ in range(3):
                dead_run(client, p, dead, 2)
                split = split_of(client, p)
                for stream, start, n in split.read:  # this run's first half
                    client.xautoclaim(stream, p.source.group, OWN, 0, start_id=start, count=n, justid=True)
                began = time.perf_counter()
                moved = mark_rest(client, split, p.source.group, 0, failures_key(p.name), OWN)
                marked.append(time.perf_counter() - began)
                rest = sum(int(c["pending"]) for s in p.source.streams
                           for c in client.xinfo_consumers(s, p.source.group) if c["name"] in (REST, REST.encode()))
                assert moved == rest == split.segment.entries - sum(n for _, _, n in split.read), (moved, rest)
            out[f"mark_rest of {moved} (ms, median of 3)"] = median_ms(marked, 2)
        finally:
            client.delete(*p.source.streams)
    return out


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:]]
    print(json.dumps(main(*(args + [200_000, 100_000, 200][len(args):])), indent=2))
