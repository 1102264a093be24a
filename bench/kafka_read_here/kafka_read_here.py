"""Where a Kafka range is read: in the drain's own process (a confluent-kafka consumer assigned the
range, `kafka.consume`) against Spark tasks on the warm Connect server, side by side by range size
(bench/kafka_read_here/README.md).

One topic of the example Kafka pipeline (field ids, headers read for replay ids, read_committed) holds
the largest size; a size's range is the first size/PARTITIONS offsets of each partition (a single
message: partition 0's first). Each read is `kafka.drain.read_ranges`, the drain's claim step: read,
decode, stage to Parquet, with `READ_HERE_MAX` set so that it reads where the side says. The Spark side
reads through a new Connect session each time, as a task has (its creation is not timed; the
drain's side gets one too, which it only asks for the claim schema). Per size, ROUNDS
rounds alternate which side goes first.

    PYTHONPATH=$PWD/include DELTADRAIN_HOME=/tmp/ddkh DELTADRAIN_KAFKA_PORT=27492 \\
        DELTADRAIN_KAFKA_CONTROLLER_PORT=27493 DELTADRAIN_SPARK_CONNECT_PORT=27014 \\
        .venv/bin/python bench/kafka_read_here/kafka_read_here.py WORKDIR [ROUNDS] [SIZES] > RESULT.json

The Kafka and Spark Connect services of that DELTADRAIN_HOME are started if they are not running, and
stopped again at the end.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import statistics
import sys
import time
import uuid
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
SIDES = ("here", "spark")
PARTITIONS = 4


def make_config(workdir: Path) -> Path:
    data = yaml.safe_load((ROOT / "config" / "pipelines.yaml").read_text())
    p = copy.deepcopy(next(p for p in data["pipelines"] if p["source"]["kind"] == "kafka"))
    name = f"kh_{uuid.uuid4().hex[:6]}"
    p.update(name=name, target={**p["target"], "path": name})
    p["source"].update(topic=name, partitions=PARTITIONS, group=name)
    p.pop("quality", None)
    data.update(pipelines=[p], data_dir=str(workdir / "lake"))
    path = workdir / "kafka_read_here.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def ranges_of(size: int) -> dict[int, tuple[int, int]]:
    if size < PARTITIONS:
        return {0: (0, size)}
    return {q: (0, size // PARTITIONS) for q in range(PARTITIONS)}


def one_read(cfg, p, side: str, size: int, workdir: Path) -> dict:
    from deltadrain.config.embedded import spark_connect_url
    from deltadrain.dev.bench import _peak_rss_kib, _rss_kib, reset_peak_rss
    from deltadrain.runtime.session import connect_session
    from deltadrain.sources.kafka import drain as kafka_drain

    kafka_drain.READ_HERE_MAX = 10**9 if side == "here" else -1
    session = connect_session(spark_connect_url(cfg))  # a task has one either way (the claim schema needs it)
    staged = workdir / f"staged-{side}-{size}-{uuid.uuid4().hex[:6]}"
    try:
        before = _rss_kib(os.getpid())
        reset_peak_rss()
        started = time.perf_counter()
        got = kafka_drain.read_ranges(session, cfg, p, ranges_of(size), {}, str(staged))
        seconds = time.perf_counter() - started
        peak = _peak_rss_kib(os.getpid())
    finally:
        session.stop()
        shutil.rmtree(staged, ignore_errors=True)
    expected = sum(end - start for start, end in ranges_of(size).values())
    assert got.total.rows == expected, (side, size, got.total.rows)
    # This process's resident memory before the read and its peak during it: what reading here costs.
    return {"side": side, "size": expected, "read_s": round(seconds, 3), "rss_before_mib": round(before / 1024, 1),
            "rss_peak_mib": round(peak / 1024, 1)}


def main(workdir: Path, rounds: int, sizes: list[int]) -> dict:
    from deltadrain.config import load_config
    from deltadrain.dev import services
    from deltadrain.dev.produce import ensure_topic, produce
    from deltadrain.sources.kafka.client import kafka_client_conf

    cfg = load_config(make_config(workdir))
    p = cfg.pipelines[0]
    wanted = ["kafka", "spark_connect"]
    started = [name for name in wanted if services.FACTORIES[name](cfg).pid() is None]
    services.up(cfg, wanted)
    rows = []
    try:
        ensure_topic(kafka_client_conf(cfg, p), p.source.topic, PARTITIONS)
        produce(cfg, p, max(sizes), seed=3, progress=False)
        for side in SIDES:  # the server's first Kafka read, and this process's first consumer, warm up
            rows.append({**one_read(cfg, p, side, 1000, workdir), "warm_up": True})
        for size in sizes:
            for r in range(rounds):
                for side in (SIDES if r % 2 == 0 else SIDES[::-1]):
                    rows.append(one_read(cfg, p, side, size, workdir))
                    print(json.dumps(rows[-1]), file=sys.stderr)
    finally:
        services.down(cfg, started)

    def median(side: str, size: int) -> float:
        return round(statistics.median(x["read_s"] for x in rows
                                       if x["side"] == side and x["size"] == size and not x.get("warm_up")), 3)

    sized = sorted({x["size"] for x in rows if not x.get("warm_up")})
    table = {size: {side: median(side, size) for side in SIDES} for size in sized}
    return {"runs": rows, "median_read_s": table, "partitions": PARTITIONS, "id_from": p.source.id_from,
            "isolation_level": p.source.isolation_level, "cpus": os.cpu_count(), "load_avg": os.getloadavg()}


if __name__ == "__main__":
    work = Path(sys.argv[1]).resolve()
    work.mkdir(parents=True, exist_ok=True)
    sizes = [int(s) for s in sys.argv[3].split(",")] if len(sys.argv) > 3 else [1, 1000, 10_000, 50_000, 200_000]
    print(json.dumps(main(work, int(sys.argv[2]) if len(sys.argv) > 2 else 3, sizes), indent=2))
