"""Where a Valkey batch claims: in the drain's own process (`stage_here`) against Spark tasks on the warm
Connect server (`stage`), side by side by batch size (bench/claim_here/README.md).

Each side drains a pipeline of its own (the example Valkey pipeline on a stream of its own) through a
new Connect session per run, as a task does, with `CLAIM_HERE_MAX` set so that it claims where the side
says: the drain's process on one thread ("here"), on `CLAIM_HERE_THREADS` threads ("threads"), or Spark
tasks. Per size, `rounds` rounds turn which side goes first; measured: the drain's claim step, the
whole run (the drain's own timings) and this process's peak resident memory over the run.

    DELTADRAIN_HOME=/tmp/ddch DELTADRAIN_VALKEY_PORT=26392 DELTADRAIN_SPARK_CONNECT_PORT=26014 \\
        .venv/bin/python bench/claim_here/claim_here.py WORKDIR [ROUNDS] [SIZES] > RESULT.json
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
THREADS = os.cpu_count() or 1
SIDES = ("here", "threads", "spark")  # the drain's process on one thread, on CLAIM_HERE_THREADS, Spark tasks


def make_config(workdir: Path) -> Path:
    data = yaml.safe_load((ROOT / "config" / "pipelines.yaml").read_text())
    template = next(p for p in data["pipelines"] if p["source"]["kind"] == "valkey")
    pipes = []
    for side in SIDES:
        pipe = json.loads(json.dumps(template))
        pipe.update(name=f"claim_{side}", target={**pipe["target"], "path": f"claim_{side}"}, batch_cap=1_000_000)
        pipe["source"]["streams"] = [f"claim_{side}:{{0}}"]
        pipe.pop("quality", None)
        pipes.append(pipe)
    data.update(pipelines=pipes, data_dir=str(workdir / "lake"))
    path = workdir / "pipelines.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def one_run(cfg, side: str, size: int, sent: dict) -> dict:
    from deltadrain.catchup import drain_batches
    from deltadrain.config.embedded import spark_connect_url
    from deltadrain.dev.bench.measure import _peak_rss_kib, reset_peak_rss
    from deltadrain.dev.produce import produce
    from deltadrain.runtime.session import connect_session
    from deltadrain.sources.valkey import drain as valkey_drain

    pipeline = cfg.pipeline(f"claim_{side}")
    produce(cfg, pipeline, size, seed=sent[side], start=sent[side], progress=False)
    sent[side] += size
    valkey_drain.CLAIM_HERE_MAX = -1 if side == "spark" else 10**9
    valkey_drain.CLAIM_HERE_THREADS = THREADS if side == "threads" else 1
    session = connect_session(spark_connect_url(cfg))
    reset_peak_rss()
    try:
        summary = json.loads(drain_batches(cfg, pipeline, session, max_batches=1).line())
    finally:
        session.stop()
    assert summary["claimed"] == size and summary.get("error") is None, summary
    # This process's peak resident over the run: the claim here, and the client's share of the rest.
    return {"side": side, "size": size, "claim_s": summary["timings"]["claim"], "run_s": summary["seconds"],
            "rss_peak_mib": round(_peak_rss_kib(os.getpid()) / 1024, 1)}


def main(workdir: Path, rounds: int, sizes: list[int]) -> dict:
    from deltadrain.config import load_config
    from deltadrain.dev import services

    cfg = load_config(make_config(workdir))
    wanted = ["valkey", "spark_connect"]
    started = [name for name in wanted if services.FACTORIES[name](cfg).pid() is None]
    services.up(cfg, wanted)
    sent = dict.fromkeys(SIDES, 0)
    rows = []
    try:
        for side in SIDES:  # each side's first batch creates its tables and warms the server
            rows.append({**one_run(cfg, side, 10, sent), "warm_up": True})
        for size in sizes:
            for r in range(rounds):
                for side in SIDES[r % len(SIDES):] + SIDES[:r % len(SIDES)]:  # each side first in turn
                    rows.append(one_run(cfg, side, size, sent))
                    print(json.dumps(rows[-1]), file=sys.stderr)
    finally:
        services.down(cfg, started)

    def median(side: str, size: int, key: str) -> float:
        return round(statistics.median(x[key] for x in rows
                                       if x["side"] == side and x["size"] == size and not x.get("warm_up")), 3)

    table = {size: {side: {k: median(side, size, k) for k in ("claim_s", "run_s")} for side in SIDES}
             for size in sizes}
    return {"runs": rows, "median": table, "cpus": os.cpu_count(), "load_avg": os.getloadavg()}


if __name__ == "__main__":
    work = Path(sys.argv[1]).resolve()
    work.mkdir(parents=True, exist_ok=True)
    sizes = [int(s) for s in sys.argv[3].split(",")] if len(sys.argv) > 3 else [1, 1000, 10_000, 50_000]
    print(json.dumps(main(work, int(sys.argv[2]) if len(sys.argv) > 2 else 3, sizes), indent=2))
