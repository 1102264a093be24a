"""Claim: take a batch from the consumer group, in parallel Spark tasks, decoding as it goes.

Each task owns part of one stream's quota: it first takes over entries idle longer than
min_idle_ms (XAUTOCLAIM), then reads new entries (XREADGROUP >). The messages never pass through
the driver, so its memory stays flat however large the backlog is. The claimed rows are then
checkpointed to disk by the caller, so that no later Spark action can run a claim a second time.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime

from deltadrain.decode import decode
from deltadrain.positions import StreamId

READ_CHUNK = 5_000  # entries per XREADGROUP / XAUTOCLAIM call
TASK_QUOTA = 50_000  # entries per Spark task: more tasks for a big stream share, same memory per task


@dataclass(frozen=True)
class ClaimTask:
    stream: str
    quota: int
    reclaim: bool  # the first task of each stream also takes over idle entries


@dataclass(frozen=True)
class ClaimContext:
    """Everything a claim task needs on an executor (pickled with the task)."""

    url: str
    username: str | None
    password: str | None = field(repr=False)
    group: str
    consumer: str
    min_idle_ms: int
    max_attempts: int  # max_retries + 1
    fields: dict[str, str]
    id_field: str
    required: list[str]
    max_bytes: int
    failures_key: str


def allocate(cap: int, backlog: dict[str, int]) -> dict[str, int]:
    """Split the batch cap over streams by their backlog (water-filling): a quiet stream never
    wastes its share while a busy one waits, and no stream gets more than it holds."""
    quotas = dict.fromkeys(backlog, 0)
    remaining = cap
    active = sorted(s for s, b in backlog.items() if b > 0)
    while remaining > 0 and active:
        share = remaining // len(active)
        if share == 0:
            for stream in active[:remaining]:
                quotas[stream] += 1
            break
        still_open = []
        for stream in active:
            take = min(share, backlog[stream] - quotas[stream])
            quotas[stream] += take
            remaining -= take
            if quotas[stream] < backlog[stream]:
                still_open.append(stream)
        active = still_open
    return quotas


def plan(quotas: dict[str, int]) -> list[ClaimTask]:
    """One task per TASK_QUOTA entries of each stream's quota; the first one reclaims idle entries."""
    tasks = []
    for stream, quota in sorted(quotas.items()):
        offsets = range(0, quota, TASK_QUOTA)
        tasks += [ClaimTask(stream, min(TASK_QUOTA, quota - start), reclaim=start == 0) for start in offsets]
    return tasks


def source_time(pos: StreamId) -> datetime:
    return datetime.fromtimestamp(pos.ms / 1000, tz=UTC)


def failure_field(stream: str, position: str) -> str:
    return f"{stream}\x00{position}"


def _row(ctx: ClaimContext, stream: str, entry_id, data: bytes | None, attempts: int, reclaimed: bool,
         last_failure: dict | None) -> tuple:
    pos = StreamId.parse(entry_id)
    meta = (stream, str(pos), pos.ms, pos.seq, source_time(pos), attempts, reclaimed)
    if attempts > ctx.max_attempts:
        last = (last_failure or {}).get("error", "no error was recorded")
        reason = f"delivered {attempts} times without a committed batch (max_retries={ctx.max_attempts - 1}); last error: {last}"
        first = (last_failure or {}).get("first")
        first_at = datetime.fromisoformat(first) if first else None
        return (*meta, None, "max_retries", reason, data, first_at, *([None] * len(ctx.fields)))
    got = decode(data, fields=ctx.fields, id_field=ctx.id_field, required=ctx.required, max_bytes=ctx.max_bytes)
    if got.values is None:
        return (*meta, got.message_id, got.error_type, got.error, data, None, *([None] * len(ctx.fields)))
    return (*meta, got.message_id, None, None, None, None, *got.values)


def _client(ctx: ClaimContext):
    import valkey

    url = ctx.url.replace("valkey://", "redis://", 1).replace("valkeys://", "rediss://", 1)
    return valkey.Valkey.from_url(url, username=ctx.username, password=ctx.password, socket_timeout=60)


def run_claim(task: ClaimTask, ctx: ClaimContext) -> Iterator[tuple]:
    """Executor side: claim up to task.quota entries of one stream and yield decoded rows."""
    from deltadrain.produce import VALKEY_FIELD

    client = _client(ctx)
    got = 0
    if task.reclaim:
        cursor = "0-0"
        while True:
            count = min(READ_CHUNK, task.quota - got)
            cursor, entries, deleted = _xautoclaim(client, task.stream, ctx, cursor, count)
            for gone in deleted:
                # In the PEL but trimmed from the stream (MAXLEN/XDEL) before it was processed:
                # a gap that must be reported, never skipped in silence (invariant 1).
                pos = StreamId.parse(gone)
                yield (task.stream, str(pos), pos.ms, pos.seq, source_time(pos), 0, True, None, "gap",
                       "entry was deleted from the stream (MAXLEN trimming or XDEL) before it was processed",
                       None, None, *([None] * len(ctx.fields)))
            if entries:
                counts = _delivery_counts(client, task.stream, ctx, entries)
                failures = _failures(client, ctx, task.stream, entries, counts)
                for entry_id, fields in entries:
                    pos = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
                    data = (fields or {}).get(VALKEY_FIELD)
                    yield _row(ctx, task.stream, pos, data, counts.get(pos, 2), True, failures.get(pos))
                got += len(entries)
            if cursor in ("0-0", b"0-0") or got >= task.quota:
                break
    while got < task.quota:
        resp = client.xreadgroup(ctx.group, ctx.consumer, {task.stream: ">"}, count=min(READ_CHUNK, task.quota - got))
        if not resp or not resp[0][1]:
            break
        for entry_id, fields in resp[0][1]:
            yield _row(ctx, task.stream, entry_id, (fields or {}).get(VALKEY_FIELD), 1, False, None)
        got += len(resp[0][1])
    client.close()


ARROW_ROWS = 8_192  # rows per Arrow record batch handed back to the JVM


def arrow_batches(rows: Iterator[tuple], arrow_schema) -> Iterator:
    """Rows -> Arrow record batches of ARROW_ROWS rows (what mapInArrow hands back to the JVM)."""
    import pyarrow as pa

    def flush(chunk):
        cols = zip(*chunk, strict=True)
        return pa.RecordBatch.from_arrays([pa.array(col, type=arrow_schema.field(i).type)
                                           for i, col in enumerate(cols)], arrow_schema.names)

    chunk: list[tuple] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) >= ARROW_ROWS:
            yield flush(chunk)
            chunk = []
    if chunk:
        yield flush(chunk)


def claim_arrow(task_batches, ctx: ClaimContext, arrow_schema):
    """mapInArrow body: task rows in, claimed rows out as Arrow record batches.

    Arrow instead of pickled rows: the claim's output crosses from Python to the JVM column-wise,
    which is what keeps the drain near the raw XREADGROUP rate.
    """
    def rows():
        for batch in task_batches:
            for task in batch.to_pylist():
                yield from run_claim(ClaimTask(task["stream"], task["quota"], task["reclaim"]), ctx)

    return arrow_batches(rows(), arrow_schema)


def _xautoclaim(client, stream: str, ctx: ClaimContext, cursor, count: int):
    """(next cursor, [(id, fields)], [ids deleted from the stream while pending])."""
    raw = client.xautoclaim(stream, ctx.group, ctx.consumer, ctx.min_idle_ms, start_id=cursor, count=count)
    deleted = raw[2] if len(raw) > 2 else []
    entries = [(entry_id, fields) for entry_id, fields in raw[1] if entry_id is not None]
    return raw[0], entries, deleted


def _delivery_counts(client, stream: str, ctx: ClaimContext, entries) -> dict[str, int]:
    """XAUTOCLAIM does not return delivery counts; XPENDING for the claimed range does."""
    ids = [e[0].decode() if isinstance(e[0], bytes) else e[0] for e in entries]
    lo = min(ids, key=StreamId.parse)
    hi = max(ids, key=StreamId.parse)
    rows = client.xpending_range(stream, ctx.group, min=lo, max=hi, count=len(ids) * 2 + 10,
                                 consumername=ctx.consumer)
    return {(r["message_id"].decode() if isinstance(r["message_id"], bytes) else r["message_id"]):
            int(r["times_delivered"]) for r in rows}


def _failures(client, ctx: ClaimContext, stream: str, entries, counts: dict[str, int]) -> dict[str, dict]:
    keys = [e[0].decode() if isinstance(e[0], bytes) else e[0] for e in entries]
    keys = [k for k in keys if counts.get(k, 2) > ctx.max_attempts]
    if not keys:
        return {}
    values = client.hmget(ctx.failures_key, [failure_field(stream, k) for k in keys])
    return {k: json.loads(v) for k, v in zip(keys, values, strict=True) if v}
