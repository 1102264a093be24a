"""What counting the messages a transform filters out (`Drain.count_filtered`) costs a drain run
(bench/filtered_count/README.md).

The sample `orders` pipeline (transform `deltadrain.transforms.sample_orders`, so the drain takes
its transform pass) drains BATCHES batches of SIZE messages in one warm Spark session, alternately
with the count as it is and with it answering 0 at once (the code before it), so the two sides run
interleaved on the same machine state. The count is also timed alone, inside the runs that make
it. Its own Valkey and lake (DELTADRAIN_HOME, a fresh directory, and DELTADRAIN_VALKEY_PORT private
to it); the streams are deleted afterwards.

Usage: DELTADRAIN_HOME=/tmp/ddfcost DELTADRAIN_VALKEY_PORT=26963 .venv/bin/python bench/filtered_count/filtered_count.py [SIZE [BATCHES]]
"""

from __future__ import annotations

import json
import statistics
import sys
import time

from deltadrain.catchup import drain
from deltadrain.config import load_config
from deltadrain.dev import services
from deltadrain.dev.produce import produce
from deltadrain.run.drain import Drain
from deltadrain.runtime.session import get_spark
from deltadrain.sources.valkey.client import valkey_client


def main(size: int = 100_000, batches: int = 9) -> dict:
    cfg = load_config()
    p = cfg.pipeline("orders").model_copy(update={"batch_cap": size})
    real = Drain.count_filtered
    counts: list[float] = []

    def timed_count(self, good, stats):
        began = time.perf_counter()
        try:
            return real(self, good, stats)
        finally:
            counts.append(time.perf_counter() - began)

    runs: dict[str, list[float]] = {"run_with": [], "run_without": []}
    with services.running(cfg, ["valkey"]):
        client = valkey_client(cfg, p)
        spark = get_spark("bench-filtered-count")
        spark.sparkContext.setLogLevel("ERROR")
        try:
            for b in range(batches):
                produce(cfg, p, size, seed=7, start=b * size, progress=False)
                side = "run_with" if b % 2 == 0 else "run_without"
                Drain.count_filtered = timed_count if side == "run_with" else (lambda self, good, stats: 0)
                summary = drain(cfg, p, spark=spark)
                assert summary.outcome == "committed" and summary.written == size, summary
                runs[side].append(summary.seconds)
        finally:
            Drain.count_filtered = real
            for key in p.source.streams:
                client.delete(key)
    # The first batch warms the session up; medians of the rest.
    medians = {k: round(statistics.median(v[1:]), 3) for k, v in runs.items()}
    medians["count"] = round(statistics.median(counts[1:]), 3)
    return {"size": size, "batches": batches, "seconds": {k: [round(x, 3) for x in v] for k, v in runs.items()},
            "count_seconds": [round(x, 3) for x in counts], "median_s": medians,
            "with_over_without": round(medians["run_with"] / medians["run_without"], 3)}


if __name__ == "__main__":
    print(json.dumps(main(*map(int, sys.argv[1:3]))))
