"""Lifecycle counts of a pipeline (docs/contract.md, "Lifecycle"): PENDING, CLAIMED, PUBLISHED, DEAD, plus the checkpoint."""

from __future__ import annotations

from deltadrain.checkpoint import carries_batch, read_checkpoint
from deltadrain.config import DeltadrainConfig, KafkaSource, PipelineConfig, ValkeySource
from deltadrain.connections import as_text, kafka_consumer_conf, stream_counts, valkey_client
from deltadrain.deadletter import DEAD, REPLAYED
from deltadrain.gaps import as_ranges, gaps_key, open_gaps
from deltadrain.lake import inserted_rows, is_table, recent_commits
from deltadrain.metrics import last_runs


def stale_after_ms(pipeline: PipelineConfig) -> int:
    """How long a claim may sit before its run is taken for gone. Valkey: min_idle_ms, after which the
    next drain or the reaper takes the entries over. Kafka: the drain task's execution_timeout, which
    Airflow kills the task at; the next drain reads such a range again whatever the notice says."""
    if isinstance(pipeline.source, ValkeySource):
        return pipeline.min_idle_ms
    return int(pipeline.airflow.execution_timeout.total_seconds() * 1000)


def mark_stale(counts: dict, after_ms: int) -> dict:
    """Flag each claimant idle longer than `after_ms` and count what they hold as STALE_CLAIMED."""
    claims = (counts.get("claimed_by") or {}).values()
    for claim in claims:
        claim["stale"] = claim["idle_ms"] > after_ms
    counts["STALE_CLAIMED"] = sum(c["claimed"] for c in claims if c["stale"])
    counts["stale_after_ms"] = after_ms
    return counts


def valkey_counts(client, source: ValkeySource, gaps_at: str | None = None, pipeline: PipelineConfig | None = None
                  ) -> dict:
    """Counts per stream, and the gaps: those recorded in the hash `gaps_at` that no commit carries yet, and
    those the next drain will find (entries removed before the group read them). With the `pipeline`,
    `splits`: the ranges under suspicion, what runs that died left pending that drains split
    (valkey_crashes), in the order they settle it."""
    pending = claimed = 0
    consumers: dict[str, dict] = {}
    oldest_idle = 0
    partitions = {}
    gaps = open_gaps(client, source.streams, source.group, gaps_at)
    for stream in source.streams:
        length, lag, in_pel = stream_counts(client, stream, source.group)
        pending += lag
        claimed += in_pel
        partitions[stream] = {"length": length, "pending": lag, "claimed": in_pel}
        if in_pel:
            for c in client.xinfo_consumers(stream, source.group):
                entry = consumers.setdefault(as_text(c["name"]), {"claimed": 0, "idle_ms": int(c["idle"])})
                entry["claimed"] += int(c["pending"])
                entry["idle_ms"] = min(entry["idle_ms"], int(c["idle"]))
            first = client.xpending_range(stream, source.group, min="-", max="+", count=1)
            if first:
                oldest_idle = max(oldest_idle, int(first[0]["time_since_delivered"]))
    splits = valkey_splits(client, pipeline) if claimed and pipeline is not None else []
    return {"PENDING": pending, "CLAIMED": claimed, "claimed_by": {k: v for k, v in consumers.items() if v["claimed"]},
            "oldest_claim_idle_ms": oldest_idle, "partitions": partitions, "gaps": as_ranges(gaps), "splits": splits}


def valkey_splits(client, pipeline: PipelineConfig) -> list[dict]:
    """Pieces of the segments runs died on, and the rests of split ones, with the deaths alone of a
    single entry: the idle entries of the pending list, read PAGE at a time."""
    from deltadrain.claim import alone_field
    from deltadrain.drain import failures_key
    from deltadrain.valkey_crashes import RESTING, SPLIT_FROM, SUSPECT, reclaimable, segments

    source: ValkeySource = pipeline.source
    key = failures_key(pipeline.name)
    found = segments((s, i, n, kind) for s, i, n, kind, _ in
                     reclaimable(client, source.streams, source.group, pipeline.min_idle_ms, key, own=""))
    shown = [seg for seg in found if seg.kind == RESTING or (seg.kind == SUSPECT and seg.deliveries >= SPLIT_FROM)]
    # A single entry's count of the runs that read it alone (valkey_crashes.count_alone), all of them dead.
    singles = [seg.pieces[0] for seg in shown if seg.entries == 1]
    counts = iter(client.hmget(key, [alone_field(p.stream, p.first) for p in singles]) if singles else ())
    out = []
    for seg in shown:
        alone = int(next(counts) or 0) if seg.entries == 1 else 0
        out += [{**piece, "alone": alone} for piece in seg.as_json()]
    return out


def dead_after_ms(pipeline: PipelineConfig) -> int:
    """When status shows a Kafka claim notice's own run as dead: once Airflow would have killed it
    (stale) and the next drain counts it (min_idle_ms)."""
    return max(stale_after_ms(pipeline), pipeline.min_idle_ms)


def kafka_counts(conf: dict, source: KafkaSource, positions: dict[str, str], published: dict[str, int],
                 dead: dict[str, int], with_group: bool = True, first_run: bool | None = None,
                 crashes: dict | None = None, min_idle_ms: int = 60_000, stale_ms: int | None = None,
                 committed_by: str | None = None, complete: bool = True, until: float | None = None) -> dict:
    """Per partition: end offset, lake checkpoint, PENDING (after the checkpoint, not claimed), CLAIMED
    (inside the range of a running batch, from the claim notice on the group offset: see
    kafka_offsets.announce_claims), offsets retention deleted unread (gap), the group's committed
    offset (informational), PUBLISHED and DEAD rows. Without the group (`with_group=False`) nothing
    is known to be claimed. `dead_runs`: the offsets that runs which died read (kafka_crashes; `crashes`
    is the lake's record): the runs the notices carry, and the notice's own run once it is older
    than `stale_ms` (stale: a younger one may be a long batch still running). `until`
    (time.monotonic()) bounds the broker calls together (default: each its own TIMEOUT)."""
    import time

    from deltadrain.kafka_crashes import DeadRuns, settle, suspects
    from deltadrain.kafka_offsets import claimed, committed, read_notice, remaining, start_offsets, watermarks

    marks = watermarks(conf, source.topic, until)
    starts, gap_list = start_offsets(positions, marks, source.starting_offsets, first_run, complete)
    gaps = {g.partition: g.as_dict() for g in gap_list}
    group = committed(conf, source.group, source.topic, sorted(marks), remaining(until)) if with_group else {}
    now_ms = int(time.time() * 1000)
    partitions, claimed_by, dead_runs = {}, {}, []
    for part, (low, high) in sorted(marks.items()):
        key = str(part)
        offset, meta = group.get(part, (None, None))
        notice = read_notice(meta)
        kept = (crashes or {}).get(key) or {}
        record = settle(DeadRuns.from_json(kept), list(kept.get("earlier") or []), notice, starts[part], now_ms,
                        min_idle_ms, stale_ms, committed_by).record
        dead_runs += suspects({part: record})
        held = claimed(notice, starts[part], high)
        partitions[key] = {"earliest": low, "end_offset": high,
                           "lake_checkpoint": int(positions[key]) if key in positions else None,
                           "pending": high - starts[part] - held, "claimed": held,
                           "claimed_range": notice["range"] if held else None, "group_offset": offset,
                           "gap": gaps.get(part), "published": published.get(key, 0), "dead": dead.get(key, 0)}
        if held:
            run = claimed_by.setdefault(notice["run"], {"claimed": 0, "idle_ms": now_ms - notice["since_ms"],
                                                        "ranges": {}})
            run["claimed"] += held
            run["ranges"][key] = notice["range"]
    return {"PENDING": sum(v["pending"] for v in partitions.values()),
            "CLAIMED": sum(v["claimed"] for v in partitions.values()), "claimed_by": claimed_by,
            "oldest_claim_idle_ms": max((v["idle_ms"] for v in claimed_by.values()), default=0),
            "gaps": list(gaps.values()), "dead_runs": dead_runs, "partitions": partitions}


def _per_partition(spark, path: str, column: str, where=None) -> dict[str, int]:
    df = spark.read.format("delta").load(path)
    if where is not None:
        df = df.where(where)
    return {r[column]: r["count"] for r in df.groupBy(column).count().collect()}


def pipeline_status(cfg: DeltadrainConfig, pipeline: PipelineConfig, spark) -> dict:
    target, dlq = str(cfg.target_path(pipeline)), str(cfg.dlq_path(pipeline))
    out: dict = {"pipeline": pipeline.name, "source": pipeline.source.kind}
    if isinstance(pipeline.source, ValkeySource):
        out.update(valkey_counts(valkey_client(cfg, pipeline), pipeline.source, gaps_key(pipeline.name), pipeline))
    out["PUBLISHED"] = spark.read.format("delta").load(target).count() if is_table(spark, target) else 0
    dead = replayed = 0
    if is_table(spark, dlq):
        counts = {r.state: r["count"] for r in spark.read.format("delta").load(dlq).groupBy("state").count().collect()}
        dead, replayed = counts.get(DEAD, 0), counts.get(REPLAYED, 0)
    out["DEAD"], out["REPLAYED"] = dead, replayed
    checkpoint = read_checkpoint(spark, target, pipeline.name, dlq, str(cfg.quarantine_path(pipeline)))
    out["checkpoint"] = checkpoint.as_dict()
    if isinstance(pipeline.source, KafkaSource):
        from pyspark.sql import functions as F

        positions = checkpoint.positions
        if checkpoint.found_in == "rows":  # rows hold the last offset read, the checkpoint the next one
            positions = {k: str(int(v) + 1) for k, v in positions.items()}
        published = _per_partition(spark, target, "_dd_partition") if is_table(spark, target) else {}
        dead_by = (_per_partition(spark, dlq, "partition", (F.col("pipeline") == F.lit(pipeline.name))
                                  & (F.col("state") == F.lit(DEAD))) if is_table(spark, dlq) else {})
        out.update(kafka_counts(kafka_consumer_conf(cfg, pipeline), pipeline.source, positions, published, dead_by,
                                first_run=checkpoint.batch == 0, crashes=checkpoint.meta.get("crashes"),
                                min_idle_ms=pipeline.min_idle_ms, stale_ms=dead_after_ms(pipeline),
                                committed_by=checkpoint.run_id, complete=checkpoint.found_in != "rows"))
    mark_stale(out, stale_after_ms(pipeline))  # both sources' claimants, now in `out`
    out["last_batch"] = None
    if is_table(spark, target):
        for commit in recent_commits(spark, target, 20):
            meta = commit["meta"]
            if carries_batch(meta, pipeline.name):
                out["last_batch"] = {"batch": meta.get("batch"), "run_id": meta.get("run_id"),
                                     "table_version": commit["version"], "at": commit["timestamp"],
                                     "written": inserted_rows(commit["metrics"]),
                                     "claimed": meta.get("claimed"), "dead_lettered": meta.get("dead_lettered"),
                                     "filtered": meta.get("filtered")}
                break
    out["last_runs"] = last_runs(spark, cfg, pipeline, 5)
    return out
