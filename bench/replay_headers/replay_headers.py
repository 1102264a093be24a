"""What reading the records' headers costs a field-id Kafka drain's claim (bench/replay_headers/README.md).
A replayed dead letter carries its message id in a header, so field-id pipelines read it to give a copy
without an id of its own the dead letter's id.

The same offset ranges of one topic are read, decoded and staged (`kafka.drain.read_ranges`, the
drain's claim step) with and without headers, alternating which goes first, in one Spark session.

    DELTADRAIN_HOME=/tmp/ddkafka DELTADRAIN_KAFKA_PORT=27392 DELTADRAIN_KAFKA_CONTROLLER_PORT=27393 \\
        .venv/bin/python bench/replay_headers/replay_headers.py WORKDIR [MESSAGES] [ROUNDS]

The Kafka service of that DELTADRAIN_HOME is started if it is not running.
"""

import copy
import json
import shutil
import statistics
import sys
import time
import uuid
from pathlib import Path

import yaml

from deltadrain.config import load_config
from deltadrain.dev import services
from deltadrain.dev.produce import ensure_topic, produce
from deltadrain.paths import PROJECT_ROOT
from deltadrain.runtime.session import get_spark
from deltadrain.sources.kafka.client import kafka_consumer_conf
from deltadrain.sources.kafka.drain import read_ranges
from deltadrain.sources.kafka.offsets import watermarks


def config(workdir: Path) -> Path:
    data = yaml.safe_load((PROJECT_ROOT / "config" / "pipelines.yaml").read_text())
    p = copy.deepcopy(next(p for p in data["pipelines"] if p["source"]["kind"] == "kafka"))
    name = f"rh_{uuid.uuid4().hex[:6]}"
    p.update(name=name, target={"path": name})
    p["source"].update(topic=name, partitions=6, group=name, id_from="field")
    p.pop("quality", None)
    data.update(pipelines=[p], data_dir=str(workdir / "lake"))
    path = workdir / "replay_headers.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def main(workdir: Path, count: int, rounds: int) -> dict:
    workdir.mkdir(parents=True, exist_ok=True)
    cfg = load_config(config(workdir))
    services.up(cfg, ["kafka"])
    p = cfg.pipelines[0]
    ensure_topic(kafka_consumer_conf(cfg, p), p.source.topic, 6)
    produce(cfg, p, count, seed=9, progress=False)
    ranges = {q: (low, high) for q, (low, high) in watermarks(kafka_consumer_conf(cfg, p), p.source.topic).items()}
    spark = get_spark("replay-headers")
    times: dict[str, list] = {"headers": [], "none": []}
    rows: dict[str, int] = {}
    read_ranges(spark, cfg, p, ranges, {}, str(workdir / "warm"), headers=True)  # the JVM's first read is cold
    for i in range(rounds):
        for side in ("headers", "none") if i % 2 else ("none", "headers"):
            staged = workdir / f"staged-{side}-{i}"
            started = time.perf_counter()
            got = read_ranges(spark, cfg, p, ranges, {}, str(staged), headers=side == "headers")
            times[side].append(time.perf_counter() - started)
            rows[side] = got.total.rows
            shutil.rmtree(staged, ignore_errors=True)
    med = {side: statistics.median(t) for side, t in times.items()}
    return {"messages": count, "rounds": rounds, "rows_staged": rows,
            "claim_median_s": {side: round(m, 3) for side, m in med.items()},
            "headers_over_none": round(med["headers"] / med["none"], 3),
            "claim_s": {side: [round(x, 3) for x in t] for side, t in times.items()}}


if __name__ == "__main__":
    args = sys.argv[1:]
    print(json.dumps(main(Path(args[0]), int(args[1]) if len(args) > 1 else 400_000,
                          int(args[2]) if len(args) > 2 else 6), indent=1))
