"""What looking for unreported quarantine rows (`quality.quarantine.unreported`) costs a batch check under
`on_failure: quarantine` (bench/quarantine_check/README.md).

The sample `orders` pipeline, its suite swapped for one that about half the sample rows break
(amount <= 250), drains BATCHES batches of SIZE messages in one warm Spark session. Each batch is
checked right after its drain, alternately with `unreported` as it is and with it answering
"nothing" at once (the code before it), so the two sides run interleaved on the same machine
state. Then `unreported` alone is timed on the checked batch: the re-check path, with the batch's
rows in the quarantine and its results row read. Its own Valkey and lake (DELTADRAIN_HOME, a
fresh directory, and DELTADRAIN_VALKEY_PORT private to it); the streams are deleted afterwards.

Usage: DELTADRAIN_HOME=/tmp/ddqcost DELTADRAIN_VALKEY_PORT=26962 .venv/bin/python bench/quarantine_check/quarantine_check.py [SIZE [BATCHES]]
"""

from __future__ import annotations

import json
import statistics
import sys
import time

from deltadrain.catchup import drain
from deltadrain.config import Expectation, QualityConfig, load_config
from deltadrain.dev import services
from deltadrain.dev.produce import produce
from deltadrain.quality import check, quarantine
from deltadrain.runtime.session import get_spark
from deltadrain.sources.valkey.client import valkey_client


def main(size: int = 10_000, batches: int = 10) -> dict:
    cfg = load_config()
    p = cfg.pipeline("orders").model_copy(update={"quality": QualityConfig(
        on_failure="quarantine", expectations=[Expectation(column="amount", kind="between", min=0, max=250)])})
    real, nothing = quarantine.unreported, (lambda *a, **k: quarantine.Unreported([], 0, []))
    timed: dict[str, list[float]] = {"check_with": [], "check_without": [], "recheck_lookup": []}
    with services.running(cfg, ["valkey"]):
        client = valkey_client(cfg, p)
        spark = get_spark("bench-quarantine-check")
        spark.sparkContext.setLogLevel("ERROR")
        try:
            for b in range(batches):
                produce(cfg, p, size, seed=5, start=b * size, progress=False)
                batch = drain(cfg, p, spark=spark).batch
                side = "check_with" if b % 2 == 0 else "check_without"
                check.unreported = real if side == "check_with" else nothing
                began = time.perf_counter()
                check.check_batch(cfg, p, spark, batch)
                timed[side].append(time.perf_counter() - began)
                check.unreported = real
                began = time.perf_counter()
                found = real(spark, cfg, p, batch, None)
                timed["recheck_lookup"].append(time.perf_counter() - began)
                assert not found.runs, found  # every run that moved rows has its results row
        finally:
            check.unreported = real
            for key in p.source.streams:
                client.delete(key)
    # The first two batches warm the session up; medians of the rest.
    medians = {k: round(statistics.median(v[2:] if k == "recheck_lookup" else v[1:]), 3) for k, v in timed.items()}
    return {"size": size, "batches": batches, "seconds": {k: [round(x, 3) for x in v] for k, v in timed.items()},
            "median_s": medians, "with_over_without": round(medians["check_with"] / medians["check_without"], 3)}


if __name__ == "__main__":
    print(json.dumps(main(*map(int, sys.argv[1:3]))))
