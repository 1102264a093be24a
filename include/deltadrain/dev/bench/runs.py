"""Whole benchmark runs: the phases in order, side by side, in rounds, and the ratios between sides."""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import yaml

from deltadrain.dev.bench.phases import _subphase
from deltadrain.dev.bench.setup import _bench_config, _config_copy, bench_source


def _machine() -> str:
    return (f"{platform.node()} {platform.machine()}, {os.cpu_count()} cores, "
            f"{round(os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30)} GiB")


def _step(label: str, fn):
    print(f"[bench] {label} ...", file=sys.stderr, flush=True)
    started = time.monotonic()
    out = fn()
    print(f"[bench] {label}: {json.dumps(out)[:300]} ({time.monotonic() - started:.0f}s)", file=sys.stderr, flush=True)
    return out


def combine_rounds(rounds: list[dict]) -> dict:
    """Per-round results of both sides -> each side's rate over all rounds and their ratio (pure).

    The ratio of the summed rates weighs every message alike; the per-round ratios show the spread.
    """
    def overall(side: str) -> dict:
        messages = sum(r[side]["messages"] for r in rounds)
        seconds = round(sum(r[side]["seconds"] for r in rounds), 2)
        return {"messages": messages, "seconds": seconds, "rate": round(messages / seconds) if seconds else 0}

    ss, dr = overall("structured_streaming"), overall("drain")
    per_round = [round(r["drain"]["rate"] / r["structured_streaming"]["rate"], 3) for r in rounds]
    return {"structured_streaming": ss, "drain": dr,
            "ratios": {"drain_to_structured_streaming": round(dr["rate"] / ss["rate"], 3) if ss["rate"] else None,
                       "per_round": per_round}}


def run_kafka_bench(count: int, partitions: int, batch: int, workdir: Path | None = None, rounds: int = 1,
                    executor: str = "local") -> dict:
    """deltadrain's Kafka drain against Structured Streaming (AvailableNow + foreachBatch MERGE with
    txnAppId/txnVersion) on the same topic, same target columns, same batch size, one after the other.
    `executor="local"`: each side in a fresh driver process (JVM start excluded from both);
    `executor="connect"`: each side a client of the embedded Spark Connect server, which a warm-up
    round of both sides (not counted) has warmed as a server that lives on is warm.

    With `rounds` > 1 both sides drain the topic again into fresh tables, in alternating order, so
    that neither side always runs first; a single run of each moves by ±10 % on a small machine,
    mostly in its cold first batch."""
    from deltadrain.config import load_config
    from deltadrain.dev import services

    workdir = workdir or Path(tempfile.mkdtemp(prefix="deltadrain-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    config, name = _bench_config(workdir, partitions, batch, kind="kafka")
    cfg = load_config(config)
    with bench_source(cfg, cfg.pipeline(name)):
        if executor == "local":
            return _kafka_rounds(cfg, config, name, workdir, count, partitions, batch, rounds)
        with services.running(cfg, ["spark_connect"]):
            return _kafka_rounds(cfg, config, name, workdir, count, partitions, batch, rounds, connect=True)


def _kafka_rounds(cfg, config: Path, name: str, workdir: Path, count: int, partitions: int, batch: int,
                  rounds: int, connect: bool = False) -> dict:
    from deltadrain.dev.produce import produce

    pipeline = cfg.pipeline(name)
    report: dict = {"machine": _machine(), "source": "kafka", "executor": "connect" if connect else "local",
                    "count": count, "partitions": partitions, "batch_cap": batch}

    def produced() -> dict:
        started = time.monotonic()
        r = produce(cfg, pipeline, count, seed=7, progress=True)
        return {"messages": r.count, "rate": round(r.count / (time.monotonic() - started)),
                "per_partition": dict(r.per_partition)}

    def phase(side: str, label: str) -> dict:
        out = _step(label, lambda: _subphase(side + ("_connect" if connect else ""), config, name, workdir))
        # The machine may be shared: the 1-minute load average after each phase says how fair it was.
        out["load_avg_1m_after"] = os.getloadavg()[0]
        return out

    labels = {"structured_streaming": "Structured Streaming AvailableNow + foreachBatch MERGE",
              "drain": "deltadrain drain"}

    def fresh() -> None:  # the drain starts from its (empty) lake, the alternative from a new checkpoint
        for left in ("lake", "ss-target", "ss-checkpoint"):
            shutil.rmtree(workdir / left, ignore_errors=True)

    report["produce"] = _step("produce", produced)
    if connect:
        report["warm_up"] = {side: phase(side, f"warm-up: {labels[side]}") for side in labels}
        fresh()
    results = []
    for i in range(rounds):
        if i:
            fresh()
        # The alternative first in round 1: the topic was just written, so both read it from the page cache.
        order = ["structured_streaming", "drain"] if i % 2 == 0 else ["drain", "structured_streaming"]
        results.append({side: phase(side, f"round {i + 1}/{rounds}: {labels[side]}") for side in order})
    if rounds == 1:
        report.update(results[0])
        report["ratios"] = {"drain_to_structured_streaming": round(
            report["drain"]["rate"] / report["structured_streaming"]["rate"], 3)}
    else:
        report.update(combine_rounds(results))
        report["rounds"] = results
    return report


def run_lake_bench(source: str, count: int, partitions: int, batch: int, workdir: Path | None = None) -> dict:
    """One backlog drained twice, each in a fresh local driver (JVM start excluded) with a consumer group
    of its own: into a lake on the local disk, then into one on the embedded S3 server (docs/object-store.md).
    Each side's timings per step say where the time goes."""
    from deltadrain.config import load_config
    from deltadrain.config.embedded import S3_BUCKET
    from deltadrain.dev import services
    from deltadrain.dev.produce import produce

    workdir = workdir or Path(tempfile.mkdtemp(prefix="deltadrain-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    config, name = _bench_config(workdir, partitions, batch, kind=source)
    local = _config_copy(config, "disk")
    on_s3 = _config_copy(config, "s3")
    doc = yaml.safe_load(on_s3.read_text())
    doc["data_dir"] = f"s3a://{S3_BUCKET}/bench/{name}"
    on_s3.write_text(yaml.safe_dump(doc, sort_keys=False))
    cfg = load_config(config)
    pipeline = cfg.pipeline(name)
    report: dict = {"machine": _machine(), "source": source, "count": count, "partitions": partitions,
                    "batch_cap": batch}

    def phase(label: str, conf: Path) -> dict:
        out = _step(label, lambda: _subphase("drain", conf, name, workdir))
        out["load_avg_1m_after"] = os.getloadavg()[0]  # a shared machine: how fair the phase was
        return out

    with bench_source(cfg, pipeline), services.running(cfg, ["s3"]):
        if source == "kafka":
            from deltadrain.dev.produce import ensure_topic
            from deltadrain.sources.kafka.client import kafka_client_conf, kafka_source

            ensure_topic(kafka_client_conf(cfg, pipeline), kafka_source(pipeline).topic, partitions)
        report["produce"] = _step("produce", lambda: produce(cfg, pipeline, count, seed=7, progress=True).count)
        report["disk"] = phase("drain into a lake on the local disk", local)
        report["s3"] = phase("drain into a lake on the local S3 server", on_s3)
    report["ratios"] = {"s3_to_disk": round(report["s3"]["rate"] / report["disk"]["rate"], 3)
                        if report["disk"]["rate"] else None}
    report["load_avg"] = os.getloadavg()
    return report


def run_bench(count: int, partitions: int, batch: int, workdir: Path | None = None, executor: str = "local",
              rounds: int = 1, server_warm_up: int = 0) -> dict:
    """`executor="connect"`: the raw read, the drain in a local driver, the drain on the embedded Spark
    Connect server and a single-process delta-rs consumer, on the same entries (`_executor_phases`)."""
    from deltadrain.config import load_config
    from deltadrain.dev import services

    workdir = workdir or Path(tempfile.mkdtemp(prefix="deltadrain-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    config, name = _bench_config(workdir, partitions, batch)
    cfg = load_config(config)
    with bench_source(cfg, cfg.pipeline(name)):
        if executor == "local":
            return _valkey_phases(cfg, config, name, workdir, count, partitions, batch)
        with services.running(cfg, ["spark_connect"]):
            return _executor_phases(cfg, config, name, workdir, count, partitions, batch, rounds, server_warm_up)


def _executor_phases(cfg, config: Path, name: str, workdir: Path, count: int, partitions: int,
                     batch: int, rounds: int = 1, server_warm_up: int = 0) -> dict:
    """One backlog drained three ways, each with a consumer group and a lake of its own: the drain in a
    local driver (a process of its own, JVM start excluded), the drain as a client of the Spark Connect
    server, and the single-process delta-rs consumer; against the raw XREADGROUP rate. Each side first
    drains a small backlog (1/10) that creates its tables and, for the Connect server, warms it; a fresh
    driver and a fresh Python process start cold, as tasks do.

    With `rounds` > 1 the producer adds the backlog again before each round and every side drains it
    again: the server then runs batches of the full size it has run before, as a server that lives on
    does. The headline ratios (`warm`) leave the first round out; every round's are kept.

    `server_warm_up` full-size commits on the server before the rounds (`phase_server_warm_up`) stand
    for a server that has run for a while: the Connect drain's rounds then meet its steady state."""
    from deltadrain.dev.produce import produce

    pipeline = cfg.pipeline(name)
    report: dict = {"machine": _machine(), "executor": "connect", "count": count, "partitions": partitions,
                    "batch_cap": batch, "rounds": rounds, "server_warm_up_commits": server_warm_up}
    copies = {side: _config_copy(config, side) for side in ("connect", "single")}
    confs = {"drain": config, "drain_connect": copies["connect"], "single_process": copies["single"]}

    def produced(n: int, start: int) -> dict:
        started = time.monotonic()
        r = produce(cfg, pipeline, n, seed=7, start=start, progress=False)
        return {"messages": r.count, "rate": round(r.count / (time.monotonic() - started))}

    def phase(label: str, kind: str, conf: Path) -> dict:
        out = _step(label, lambda: _subphase(kind, conf, name, workdir))
        out["load_avg_1m_after"] = os.getloadavg()[0]  # a shared machine: how fair the phase was
        return out

    labels = {"drain": "drain, local driver", "drain_connect": "drain, Connect server",
              "single_process": "single-process consumer"}
    small = max(count // 10, 1)
    report["produce_small"] = _step("produce small backlog", lambda: produced(small, 0))
    report["warm_up"] = {kind: phase(f"warm-up: {label}", kind, confs[kind]) for kind, label in labels.items()}
    if server_warm_up:
        report["server_warm_up"] = _step(f"server warm-up: {server_warm_up} commits", lambda: _subphase(
            "server_warm_up", confs["drain_connect"], name, workdir, server_warm_up))
    results = []
    for i in range(rounds):
        tag = f"round {i + 1}/{rounds}: "
        one = {"produce": _step(tag + "produce", lambda i=i: produced(count, small + i * count)),
               "raw_read": phase(tag + "raw XREADGROUP", "raw_read", config)}
        one.update({kind: phase(tag + label, kind, confs[kind]) for kind, label in labels.items()})
        one["ratios"] = executor_ratios([one])
        results.append(one)
    if rounds == 1:
        report.update(results[0])
    else:
        report["rounds_detail"] = results
        report["ratios"] = {"all_rounds": executor_ratios(results), "warm": executor_ratios(results[1:])}
    report["load_avg"] = os.getloadavg()
    return report


def executor_ratios(rounds: list[dict]) -> dict:
    """The Valkey executor bench's ratios over `rounds` (pure): each side's rate over all their messages
    (every message weighs alike) against the raw read's, and the Connect drain against the others."""
    def rate(side: str) -> float:
        seconds = sum(r[side]["seconds"] for r in rounds)
        return sum(r[side]["messages"] for r in rounds) / seconds if seconds else 0.0

    raw, local, connect, single = (rate(s) for s in ("raw_read", "drain", "drain_connect", "single_process"))
    return {"drain_to_raw_read": round(local / raw, 3), "drain_connect_to_raw_read": round(connect / raw, 3),
            "single_process_to_raw_read": round(single / raw, 3),
            "drain_connect_to_single_process": round(connect / single, 3),
            "drain_connect_to_drain": round(connect / local, 3)}


def _valkey_phases(cfg, config: Path, name: str, workdir: Path, count: int, partitions: int,
                   batch: int) -> dict:
    from deltadrain.dev.produce import produce

    pipeline = cfg.pipeline(name)
    report: dict = {"machine": _machine(), "count": count, "partitions": partitions, "batch_cap": batch}
    step = _step

    def produced(n: int, start: int) -> dict:
        started = time.monotonic()
        r = produce(cfg, pipeline, n, seed=7, start=start, progress=True)
        return {"messages": r.count, "rate": round(r.count / (time.monotonic() - started))}

    # Small backlog first (memory at 1/10 of the backlog), then the full one; same batch cap for both,
    # so that the driver's peaks compare backlogs, not batch sizes.
    small = max(count // 10, 1)
    report["produce_small"] = step("produce small backlog", lambda: produced(small, 0))
    report["drain_small"] = step("drain small backlog", lambda: _subphase("drain", config, name, workdir))
    report["produce"] = step("produce full backlog", lambda: produced(count, small))
    report["raw_read"] = step("raw XREADGROUP", lambda: _subphase("raw_read", config, name, workdir))
    report["drain"] = step("drain full backlog", lambda: _subphase("drain", config, name, workdir))
    report["delta_append"] = step("plain Delta append", lambda: _subphase("append", config, name, workdir))

    def one_message() -> dict:
        produce(cfg, pipeline, 1, seed=8, start=0)
        return _subphase("drain", config, name, workdir)

    report["one_message"] = step("one-message batch", one_message)
    report["window"] = step("1x vs 100x target", lambda: _subphase("window", config, name, workdir, 10_000))
    slower_raw = min(report["raw_read"]["rate"], report["delta_append"]["rate"])
    report["ratios"] = {
        "drain_to_slower_raw_limit": round(report["drain"]["rate"] / slower_raw, 3),
        "driver_python_memory_10x_backlog": round(
            report["drain"]["driver_python_peak_mib"] / report["drain_small"]["driver_python_peak_mib"], 3),
        "driver_jvm_memory_10x_backlog": round(
            report["drain"]["driver_jvm_peak_mib"] / report["drain_small"]["driver_jvm_peak_mib"], 3),
        "driver_jvm_live_heap_10x_backlog": round(
            report["drain"]["driver_jvm_live_heap_mib"] / report["drain_small"]["driver_jvm_live_heap_mib"], 3),
        "batch_time_100x_to_1x": report["window"]["ratio_100x_to_1x"],
    }
    return report
