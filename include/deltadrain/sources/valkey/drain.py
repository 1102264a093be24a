"""The steps of a Valkey pipeline's drain run; `Drain.run` puts them in the contract's order.

plan: find what runs that died left (crashes) and the entries deleted unread (gaps) -> claim with
XAUTOCLAIM + XREADGROUP in Spark tasks (up to CLAIM_HERE_MAX entries: the same tasks on threads of this
process), decoding and staging in the same tasks -> (the shared publish) -> acknowledge: XACK after the
commit; or release: hand the claims back.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime

from deltadrain.config import DeltadrainConfig, PipelineConfig, ValkeySource
from deltadrain.formats.changes import spec_of
from deltadrain.formats.payloads import payload_of
from deltadrain.lake.checkpoint import Checkpoint
from deltadrain.logs import fields, run_logger
from deltadrain.run.drain import Drain
from deltadrain.run.rows import DrainError, claim_schema, id_column
from deltadrain.run.stage import Staged, stage, stage_here, task_rows
from deltadrain.run.steps import Gaps, Leases, RecordsGaps, RunPlan
from deltadrain.sources.valkey.acknowledge import acknowledge, claim_held, release
from deltadrain.sources.valkey.acl import acl_probe_key, check_after_commit
from deltadrain.sources.valkey.claim import RELEASED, ClaimContext, allocate, claim_arrow, failure_field
from deltadrain.sources.valkey.claim import plan as task_plan
from deltadrain.sources.valkey.client import (
    as_text,
    group_counts,
    source_credentials,
    tls_ca,
    valkey_client,
    valkey_source,
    valkey_url,
)
from deltadrain.sources.valkey.crashes import Split, count_alone, find_split, mark_rest, uncount_alone
from deltadrain.sources.valkey.gaps import (
    as_ranges,
    count,
    describe_gap,
    forget,
    found_unread,
    gaps_key,
    move_past,
    recorded,
)
from deltadrain.sources.valkey.gaps import record as record_gaps

# A claim of at most this many entries runs in the drain's own process (`stage_here`), a larger one in
# Spark tasks. On a Connect server each session starts Python workers of its own before its first claim
# task; beside that, the drain's process (on CLAIM_HERE_THREADS) claimed 200 000 entries in half the
# time the server's tasks took (bench/claim_here/README.md). The claim streams, a
# READ_CHUNK of entries at a time per thread, so the bound is not a memory limit but the largest size
# measured; above it a cluster's executors claim in parallel.
CLAIM_HERE_MAX = 200_000
# Its claim tasks (one per TASK_QUOTA entries of a stream) run on this many threads, each staging a file
# of its own: the reads, the JSON decode and the Parquet writes release the GIL.
CLAIM_HERE_THREADS = os.cpu_count() or 1


def claim_here(entries: int) -> bool:
    return entries <= CLAIM_HERE_MAX


def failures_key(pipeline: str) -> str:
    return f"deltadrain:{{{pipeline}}}:failures"


def ensure_groups(client, source: ValkeySource) -> None:
    for stream in source.streams:
        try:
            client.xgroup_create(stream, source.group, id="0", mkstream=True)
        except Exception as exc:  # BUSYGROUP: it exists, which is the usual case
            if "BUSYGROUP" not in str(exc):
                raise


def group_backlog(client, source: ValkeySource) -> dict[str, tuple[int, int]]:
    """Per stream: (entries not yet delivered to the group (lag), entries pending in it)."""
    return {stream: group_counts(client, stream, source.group) for stream in source.streams}


def backlog(client, source: ValkeySource) -> dict[str, int]:
    """Per stream: lag plus pending, what a run may claim."""
    return {stream: sum(counts) for stream, counts in group_backlog(client, source).items()}


def claim_context(cfg: DeltadrainConfig, pipeline: PipelineConfig, consumer: str) -> ClaimContext:
    source = valkey_source(pipeline)
    creds = source_credentials(source)
    schema = pipeline.payload_schema
    return ClaimContext(
        url=valkey_url(cfg, source), username=creds.username, password=creds.password, group=source.group,
        consumer=consumer, min_idle_ms=pipeline.min_idle_ms, max_attempts=pipeline.max_retries + 1,
        fields=dict(schema.fields), id_field=schema.id_field, required=list(schema.required),
        max_bytes=pipeline.max_message_bytes, failures_key=failures_key(pipeline.name),
        gaps_key=gaps_key(pipeline.name), cluster=source.cluster, ca_file=tls_ca(source),
        payload=payload_of(schema), evolved=schema.evolved_columns, collect_new=schema.collects_new_fields,
        upsert=spec_of(pipeline))


class ValkeyDrain(Leases, RecordsGaps, Drain[dict[str, int]]):
    """Claims through the consumer group (XAUTOCLAIM + XREADGROUP), acknowledges with XACK; a run that
    stops without dying hands its claims back (`Leases`), and the gaps its claims find stay recorded in
    Valkey until a commit carries them (`RecordsGaps`)."""

    def __init__(self, cfg: DeltadrainConfig, pipeline: PipelineConfig, spark, run_id: str | None = None):
        if not isinstance(pipeline.source, ValkeySource):
            raise DrainError(f"pipeline '{pipeline.name}' is not a Valkey pipeline")
        super().__init__(cfg, pipeline, spark, run_id)
        self.source: ValkeySource = pipeline.source
        self.consumer = f"drain-{self.run_id}"
        self.split: Split | None = None  # what runs that died left, when this run reads part of it
        self.client = valkey_client(cfg, pipeline)
        self.ctx = claim_context(cfg, self.pipeline, self.consumer)

    # -- the steps (Drain.run puts them in order) -------------------------------------------------

    def plan(self, checkpoint: Checkpoint) -> RunPlan[dict[str, int]]:
        """The quotas per stream (by backlog, up to the batch cap), or the part of what runs that died
        left that this run reads (`split`); the entries each stream lost before the group read them."""
        source = self.source
        ensure_groups(self.client, source)
        check_after_commit(self.client, source.streams[0], source.group, acl_probe_key(self.pipeline.name),
                           [self.ctx.failures_key, self.ctx.gaps_key])
        counts = group_backlog(self.client, source)
        quotas = allocate(self.pipeline.batch_cap, {stream: sum(c) for stream, c in counts.items()})
        # Nothing pending in the group: no run died on anything, and the pending list is not paged.
        split = self.split = self.find_split() if any(pending for _, pending in counts.values()) else None
        if split is None:
            # Before this run's XREADGROUP moves the group past them. A split reads no new entries:
            # the run that next does finds them, so that each is reported once.
            self.find_unread_gaps()
        return RunPlan(start=checkpoint.positions, positions=checkpoint.positions, claims=bool(sum(quotas.values())),
                       detail=quotas)

    def claim(self, plan: RunPlan[dict[str, int]]) -> Staged:
        split = self.split
        if split is not None and split.alone:
            count_alone(self.client, split, self.ctx.failures_key)
        staged = self.claim_batch(plan.detail, split=split)
        if split is not None and split.marks_rest:
            mark_rest(self.client, split, self.source.group, self.pipeline.min_idle_ms,
                      self.ctx.failures_key, self.consumer)
        self.summary.reclaimed = staged.total.reclaimed
        return staged

    def gaps(self, plan: RunPlan[dict[str, int]], staged: Staged | None) -> Gaps:
        """Every recorded gap no commit has carried yet: this run's, and those of runs that died or lost
        the race after recording theirs."""
        carried = recorded(self.client, self.ctx.gaps_key)
        ranges = as_ranges(carried)
        return Gaps(ranges, count(ranges), "entries were deleted from the source before this pipeline committed "
                    f"them: {'; '.join(describe_gap(g) for g in ranges)}", found=carried)

    def forget_gaps(self, gaps: Gaps) -> None:
        forget(self.client, self.ctx.gaps_key, gaps.found)

    def acknowledge(self, plan: RunPlan[dict[str, int]], staged: Staged | None, keep: frozenset[tuple[str, str]]) -> int:
        """XACK what the batch staged, but the culprits left pending for redelivery (`keep`)."""
        return acknowledge(staged.files, self.ctx, keep=keep) if staged is not None else 0

    def claim_batch(self, quotas: dict[str, int], reclaim: bool = True, split: Split | None = None) -> Staged:
        """Claim and stage the batch in exactly one Spark job: no later action can run a claim
        (XREADGROUP) a second time, whatever Spark recomputes. `reclaim=False` takes new entries
        only, never idle ones with XAUTOCLAIM; a `split` only the idle entries it names."""
        from pyspark.sql.types import BooleanType, LongType, StringType, StructField, StructType

        ctx = self.ctx
        if split is not None:
            tasks = [(stream, n, True, start, False) for stream, start, n in split.read]
        else:
            tasks = [(t.stream, t.quota, t.reclaim and reclaim, t.start, t.new) for t in task_plan(quotas)]
        task_schema = StructType([
            StructField("stream", StringType()), StructField("quota", LongType()), StructField("reclaim", BooleanType()),
            StructField("start", StringType()), StructField("new", BooleanType())])
        args = (lambda batches, arrow_schema: claim_arrow(batches, ctx, arrow_schema), claim_schema(self.pipeline),
                id_column(self.pipeline), str(self.scratch / "claimed"))
        if claim_here(sum(task[1] for task in tasks)):
            return stage_here([dict(zip(task_schema.names, task, strict=True)) for task in tasks], *args,
                              threads=CLAIM_HERE_THREADS)
        # One claim task per Spark partition (parallelize keeps the slices), all tasks in parallel.
        return stage(task_rows(self.spark, tasks, task_schema), *args)

    def settle_culprits(self, culprits):
        """Culprits out of retries become dead letters (returned); the others stay pending for
        redelivery, their error recorded so that their dead letter can name it later."""
        rows = culprits.collect()  # at most MAX_CULPRITS rows
        key = failures_key(self.pipeline.name)
        fields = [failure_field(r._dd_partition, r._dd_position) for r in rows]
        old = {f: json.loads(v) for f, v in zip(fields, self.client.hmget(key, fields), strict=True) if v}
        now = datetime.now(UTC)
        firsts = {f: datetime.fromisoformat(old[f]["first"]) if f in old else now for f in fields}
        spent, retry = [], {}
        for f, r in zip(fields, rows, strict=True):
            if r._dd_attempts >= self.ctx.max_attempts:
                spent.append(r)
            else:
                retry[f] = json.dumps({"error": r._dd_culprit_error, "error_type": "transform",
                                       "first": firsts[f].isoformat(), "last": now.isoformat(),
                                       "attempts": r._dd_attempts})
        if retry:
            self.client.hset(key, mapping=retry)
        schema = culprits.drop("_dd_culprit_error").schema
        dead = self.dead_records(spent, schema.names, "transform", "transform failed",
                                 lambda r: firsts[failure_field(r._dd_partition, r._dd_position)])
        pending = [(r._dd_partition, r._dd_position) for f, r in zip(fields, rows, strict=True) if f in retry]
        return self.spark.createDataFrame(dead, schema), pending

    def originals(self, keys: list[tuple[str, str]]) -> dict[tuple[str, str], bytes]:
        from deltadrain.sources.valkey.client import VALKEY_FIELD

        pipe = self.client.pipeline(transaction=False)
        for stream, position in keys:
            pipe.xrange(stream, position, position, count=1)
        return {key: entries[0][1].get(VALKEY_FIELD) for key, entries in zip(keys, pipe.execute(), strict=True)
                if entries}

    def backlog_total(self) -> int:
        return sum(backlog(self.client, self.source).values())

    def release(self, staged: Staged) -> int:
        """Hand this run's claims back (it stopped without dying). A read alone it counted was no death."""
        if self.split is not None and self.split.alone:
            uncount_alone(self.client, self.split, self.ctx.failures_key)
        return release(staged.files, self.ctx)

    def hand_back(self) -> int:
        """After a claim job that failed without dying (its tasks raised: the schema registry is out),
        every entry this run's consumer holds goes to RELEASED, as `release` does with staged ones: the
        next run reclaims them whole, and a long outage convicts no message of killing runs."""
        if self.split is not None and self.split.alone:
            uncount_alone(self.client, self.split, self.ctx.failures_key)
        group, done = self.source.group, 0
        for stream in self.source.streams:
            while True:
                rows = self.client.xpending_range(stream, group, min="-", max="+", count=1000,
                                                  consumername=self.consumer)
                moved = claim_held(self.client, stream, group, self.consumer, RELEASED, 0,
                                   max(self.pipeline.min_idle_ms, 1), [as_text(r["message_id"]) for r in rows])
                done += len(moved)
                if not moved or len(rows) < 1000:
                    break
        return done

    def find_split(self) -> Split | None:
        """What runs that died left pending, split (valkey.crashes): this run then reads that part
        only. None: an ordinary batch."""
        source = self.source
        split = find_split(self.client, source.streams, source.group, self.pipeline.min_idle_ms,
                           self.ctx.failures_key, self.consumer)
        if split is not None:
            self.summary.dead_runs = split.summary()
            s = self.summary
            log = run_logger(s.pipeline, s.run_id, s.batch, source=source.kind)
            for piece in s.dead_runs:
                log.warning("%s", fields(step="split", partition=piece["partition"], first=piece["ids"][0],
                                         last=piece["ids"][1], entries=piece["entries"],
                                         deliveries=piece["deliveries"], read=piece["read"]))
        return split

    def find_unread_gaps(self) -> None:
        """Record the entries each stream lost before the group read them (two XINFO calls a stream).
        Under on_gap: continue, a gap with nothing readable after it is then gone past: the group
        moves to the stream's end, so that the commit that carries the gap is the last to report it."""
        source = self.source
        found = found_unread(self.client, source.streams, source.group, self.ctx.gaps_key)
        record_gaps(self.client, self.ctx.gaps_key, [gap for gap, _ in found])
        if source.on_gap == "continue":
            for gap, st in found:
                move_past(self.client, gap.partition, source.group, st)

    def finish(self) -> None:
        self._drop_consumer_if_idle()

    def _drop_consumer_if_idle(self) -> None:
        """A finished run's consumer has nothing pending; remove it so XINFO stays readable."""
        try:
            for stream in self.source.streams:
                consumers = self.client.xinfo_consumers(stream, self.source.group)
                mine = next((c for c in consumers if as_text(c["name"]) == self.consumer), None)
                if mine is not None and int(mine["pending"]) == 0:
                    self.client.xgroup_delconsumer(stream, self.source.group, self.consumer)
        except Exception:
            pass  # best effort; the reaper removes idle consumers too
