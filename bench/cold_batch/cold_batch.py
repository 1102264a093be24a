"""A pipeline's first batches on a Spark Connect server `services up` just started, with and without its
warm-up, and the wall time of a one-message `deltadrain drain` while the server runs (README.md).

usage: cold_batch.py warm|cold COUNT BATCHES ONE_MESSAGE_RUNS
  Starts Valkey and the Connect server in $DELTADRAIN_HOME (ports from DELTADRAIN_*_PORT), with the
  warm-up `services up` runs (warm) or without it (cold); produces COUNT sample events (2% malformed)
  into the example config's `orders` and drains them with `deltadrain drain orders`, BATCHES times;
  then ONE_MESSAGE_RUNS times produces one event and times the whole `deltadrain drain orders` process.
  Stops what it started. Prints one JSON report.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time


def cli(*args: str) -> tuple[float, subprocess.CompletedProcess]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "deltadrain.cli", *args], capture_output=True, text=True)
    took = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"deltadrain {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return took, done


def main(mode: str, count: int, batches: int, runs: int) -> dict:
    from deltadrain.config import load_config
    from deltadrain.dev import services

    cfg = load_config()
    report: dict = {"mode": mode, "count": count}
    try:
        services.up(cfg, ["valkey"])
        started = time.monotonic()
        if mode == "warm":
            row = services.up(cfg, ["spark_connect"])[0]
            report["warm_up"] = row.get("warm_up")
        else:
            services.FACTORIES["spark_connect"](cfg).up()
        report["server_up_s"] = round(time.monotonic() - started, 1)
        report["batches"] = []
        for b in range(batches):
            cli("produce", "orders", "--count", str(count), "--seed", str(b), "--start", str(b * count),
                "--malformed-ratio", "0.02", "--no-progress")
            wall, done = cli("drain", "orders")
            s = json.loads(done.stdout.strip().splitlines()[-1])
            report["batches"].append({"batch": s["batch"], "written": s["written"], "dead": s["dead_lettered"],
                                      "seconds": s["seconds"], "wall_s": round(wall, 2), "timings": s["timings"],
                                      "spark": s["spark"]})
        walls = []
        for i in range(runs):
            cli("produce", "orders", "--count", "1", "--seed", "99", "--start", str(batches * count + i),
                "--no-progress")
            wall, done = cli("drain", "orders")
            s = json.loads(done.stdout.strip().splitlines()[-1])
            assert s["written"] == 1 and s["spark"].startswith("on the Spark Connect server"), s
            walls.append(round(wall, 2))
        report["one_message_wall_s"] = walls
        report["one_message_median_s"] = statistics.median(walls) if walls else None
        first, second = (report["batches"] + [{}, {}])[:2]
        if first and second:
            report["first_over_second"] = round(first["seconds"] / second["seconds"], 2)
    finally:
        services.down(cfg, ["spark_connect", "valkey"])
    return report


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])), indent=2))
