"""What the batch cap buys (bench/batch_sizes/README.md): one Spark session drains the same
backlog in rounds of MESSAGES_PER_ROUND entries, each round with one batch cap, the caps in rotating
order, after a warm-up of two 200 000-entry batches. Per round: msg/s, the batches' seconds, and where
the CPU went (core-seconds per 100 000 messages by role, `bench.cpu_by_role`). Before the drains, the
raw XREADGROUP limit over the whole backlog (`bench.phase_raw_read`, a group of its own), so that the
ratios to it are side by side.

    DELTADRAIN_HOME=/tmp/ddsizes DELTADRAIN_VALKEY_PORT=26994 \\
        .venv/bin/python bench/batch_sizes/batch_sizes.py WORKDIR [CAPS] [ROUNDS] [MESSAGES_PER_ROUND] > out.json

CAPS defaults to 200000,500000,1000000, ROUNDS to 2 (each cap measured ROUNDS times), and
MESSAGES_PER_ROUND to 1 000 000. The Valkey service of that DELTADRAIN_HOME is started if it is not
running; everything the rounds drain is produced first.
"""

import json
import sys
import time
from pathlib import Path

from deltadrain.catchup import drain
from deltadrain.config import load_config
from deltadrain.dev import services
from deltadrain.dev.bench import _bench_config, _machine, cpu_by_role, cpu_report, phase_raw_read
from deltadrain.dev.produce import produce
from deltadrain.runtime.session import get_spark

WARM_UP = [200_000, 200_000]


def main(workdir: Path, caps: list[int], rounds: int, per_round: int) -> dict:
    workdir.mkdir(parents=True, exist_ok=True)
    config, name = _bench_config(workdir, 4, caps[0])
    cfg = load_config(config)
    base = cfg.pipeline(name)
    services.up(cfg, ["valkey"])
    server = services.valkey_service(cfg).pid()  # its process group: services start in a session of their own
    total = sum(WARM_UP) + per_round * len(caps) * rounds
    started = time.monotonic()
    produce(cfg, base, total, seed=7, progress=False)
    produced = {"messages": total, "seconds": round(time.monotonic() - started, 1)}
    spark = get_spark("batch-sizes")
    spark.sparkContext.setLogLevel("ERROR")

    def drained(cap: int, messages: int) -> dict:
        pipeline = base.model_copy(update={"batch_cap": cap})
        before, started, batches = cpu_by_role(server, spark), time.monotonic(), []
        while sum(b["claimed"] for b in batches) < messages:
            s = drain(cfg, pipeline, spark=spark)
            if s.outcome != "committed":
                raise RuntimeError(f"batch {s.batch} ended {s.outcome}: {s.error}")
            batches.append({"claimed": s.claimed, "seconds": s.seconds, "timings": s.timings})
        seconds = time.monotonic() - started
        n = sum(b["claimed"] for b in batches)
        return {"cap": cap, "messages": n, "seconds": round(seconds, 2), "rate": round(n / seconds),
                "batches": batches, "cpu": cpu_report(before, cpu_by_role(server, spark), n, seconds)}

    raw = phase_raw_read(cfg, base, spark, server)
    print(json.dumps({"raw_read": raw}), file=sys.stderr, flush=True)
    warm_up = [drained(cap, cap) for cap in WARM_UP]
    measured = []
    for r in range(rounds):
        order = caps[r % len(caps):] + caps[:r % len(caps)]  # each cap goes first once in len(caps) rounds
        for cap in order:
            measured.append(drained(cap, per_round))
            print(json.dumps({k: v for k, v in measured[-1].items() if k != "batches"}), file=sys.stderr, flush=True)
    spark.stop()
    summary = {}
    for cap in caps:
        mine = [m for m in measured if m["cap"] == cap]
        n, seconds = sum(m["messages"] for m in mine), sum(m["seconds"] for m in mine)
        summary[str(cap)] = {"messages": n, "seconds": round(seconds, 2), "rate": round(n / seconds),
                             "to_raw_read": round(n / seconds / raw["rate"], 3), "per_round": [m["rate"] for m in mine]}
    return {"machine": _machine(), "produced": produced, "caps": caps, "rounds": rounds,
            "messages_per_round": per_round, "raw_read": raw, "summary": summary, "warm_up": warm_up,
            "measured": measured}


if __name__ == "__main__":
    args = sys.argv[1:]
    caps = [int(c) for c in args[1].split(",")] if len(args) > 1 else [200_000, 500_000, 1_000_000]
    out = main(Path(args[0]), caps, int(args[2]) if len(args) > 2 else 2, int(args[3]) if len(args) > 3 else 1_000_000)
    print(json.dumps(out, indent=1))
