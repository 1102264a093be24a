"""Before/after: K drains of one pipeline in one Spark session, on a fresh lake, per batch.

Used to measure a change to the drain side by side with the version before it, on the same data
(bench/ab_compare/README.md has a run made with it). Run it from each checkout in turn, alternating, e.g.:

    PYTHONPATH=/path/to/checkout/include DELTADRAIN_JARS=$PWD/.cache/jars \
        .venv/bin/python bench/ab_compare/ab_drain.py CONFIG PIPELINE 7

Kafka pipelines read from the lake's checkpoint, so a fresh lake re-reads the topic from the start;
a Valkey pipeline needs a consumer group of its own per run (a copy of the config with another
`group`). The lake directory of CONFIG is deleted first.
"""

import shutil
import sys
import time

import deltadrain
from deltadrain.catchup import drain
from deltadrain.config import load_config
from deltadrain.runtime.session import get_spark


def main(config: str, name: str, runs: int) -> None:
    cfg = load_config(config)
    pipeline = cfg.pipeline(name)
    shutil.rmtree(cfg.lake_dir(), ignore_errors=True)
    spark = get_spark("ab-drain")
    spark.sparkContext.setLogLevel("ERROR")
    print("code:", deltadrain.__file__, flush=True)
    started, total, warm = time.time(), 0, []
    for i in range(runs):
        s = drain(cfg, pipeline, spark=spark)
        if s.outcome == "empty":
            break
        total += s.claimed
        if i:
            warm.append(s.seconds)
        print(s.outcome, s.claimed, s.written, s.dead_lettered, s.seconds, s.timings, flush=True)
    seconds = time.time() - started
    print("TOTAL", total, round(seconds, 1), round(total / seconds), "warm mean",
          round(sum(warm) / max(1, len(warm)), 2), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
