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
from datetime import datetime

from deltadrain.formats.changes import ORDER, UpsertDecoder, UpsertSpec
from deltadrain.formats.decode import BatchDecoder
from deltadrain.formats.payloads import Payload
from deltadrain.positions import StreamId
from deltadrain.run.isolation import convicted, death_reason
from deltadrain.sources.valkey.client import VALKEY_FIELD, as_text
from deltadrain.sources.valkey.gaps import (
    ZERO,
    carried_ends_of,
    deleted_while_pending,
    record,
    state_of,
    unread_gap,
)

# The largest stream id halves deltadrain stores: "ms-seq" as two int64 columns, and the milliseconds
# as a timestamp too (`_dd_source_ts`: Spark's and Python's timestamps end with the year 9999, and
# PySpark collects them in the local time zone, up to 14 hours east). Valkey allows up to 2^64 - 1 in
# both, reachable only through explicit XADD ids; such an entry fails its claim with
# `unstorable_id_message`.
MAX_SEQ = 2**63 - 1
MAX_MS = 253_402_214_399_999  # 9999-12-30T23:59:59.999Z
# Consumers of the group that are no run: the untried halves of split segments (valkey.crashes), and
# what runs that stopped without dying handed back (acknowledge.release).
REST = "deltadrain-rest"
RELEASED = "deltadrain-released"
READ_CHUNK = 5_000  # entries per XREADGROUP / XAUTOCLAIM call
TASK_QUOTA = 50_000  # entries per Spark task: more tasks for a big stream share, same memory per task


@dataclass(frozen=True)
class ClaimTask:
    stream: str
    quota: int
    reclaim: bool  # the first task of each stream also takes over idle entries
    start: str = "0-0"  # where its XAUTOCLAIM starts
    new: bool = True  # False: a split (valkey.crashes) reads `quota` idle entries from `start`, nothing new


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
    gaps_key: str = ""  # where deleted-while-pending gaps are recorded (deltadrain.sources.valkey.gaps)
    cluster: bool = False  # `url` is a Valkey Cluster's seed URLs, joined by commas
    ca_file: str | None = None  # over TLS: the CA the server's certificate must be signed by
    payload: Payload | None = None  # Avro or Protobuf payloads' schema (deltadrain.formats.payloads); None: JSON
    evolved: frozenset = frozenset()  # fields typed by the table's evolved columns (schema.evolution)
    collect_new: bool = False  # keep the fields no column holds (PipelineConfig.collects_new_fields)
    upsert: UpsertSpec | None = None  # target.mode upsert: keys, deletes and order (deltadrain.formats.changes)


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


def failure_field(stream: str, position: str) -> str:
    return f"{stream}\x00{position}"


def alone_field(stream: str, position: str) -> str:
    """The failures hash's count of the runs that read this entry and nothing else (valkey.crashes)."""
    return f"{stream}\x00{position}\x00alone"


GAP = "entry was deleted from the stream (MAXLEN trimming or XDEL) before it was processed"


@dataclass
class Entries:
    """A chunk of one stream's claimed entries, column by column (one Arrow record batch later).
    `preset` holds the rows whose verdict is known before decoding: gaps and retries run out."""

    stream: str
    positions: list = field(default_factory=list)
    data: list = field(default_factory=list)
    attempts: list = field(default_factory=list)
    reclaimed: list = field(default_factory=list)
    preset: dict = field(default_factory=dict)

    def add(self, position: str, data, attempts: int, reclaimed: bool, preset: tuple | None = None) -> None:
        if preset is not None:
            self.preset[len(self.positions)] = preset
        self.positions.append(position)
        self.data.append(data)
        self.attempts.append(attempts)
        self.reclaimed.append(reclaimed)

    @classmethod
    def unparsed(cls, stream: str, entries: list) -> Entries:
        """First deliveries (XREADGROUP >, or history reads with XRANGE), as a `reader` client returns
        them: [id, [field, value, ...]] each; attempt 1, nothing preset."""
        n = len(entries)
        return cls(stream, [e[0].decode() for e in entries], [payload_of(e[1], VALKEY_FIELD) for e in entries],
                   [1] * n, [False] * n)


def retries_run_out(ctx: ClaimContext, attempts: int, data, last_failure: dict | None,
                    alone_reads: int = 0) -> tuple | None:
    """The preset verdict of an entry that has had its attempts, else None: one whose transform failed
    (a failure is recorded) and that was delivered more than max_retries + 1 times, or one that runs
    which read it alone (this one included, `alone_reads`) died on max_retries times
    (`isolation.convicted`). Deliveries to runs that died holding it among others convict nothing."""
    max_retries = ctx.max_attempts - 1
    if last_failure is not None and attempts > ctx.max_attempts:
        reason = (f"delivered {attempts} times without a committed batch (max_retries={max_retries}); "
                  f"last error: {last_failure.get('error')}")
    elif convicted(alone_reads - 1, 0, max_retries):
        reason = death_reason(alone_reads - 1, max_retries, f"delivered {attempts} times in all")
    else:
        return None
    first = (last_failure or {}).get("first")
    return None, "max_retries", reason, data, datetime.fromisoformat(first) if first else None


def decoder_for(ctx, arrow_schema) -> BatchDecoder:
    """The decoder of a claim or Kafka read context (fields, id_field, required, max_bytes, payload)."""
    kwargs = {"fields": ctx.fields, "id_field": ctx.id_field, "required": ctx.required, "max_bytes": ctx.max_bytes,
              "types": {f.name: f.type for f in arrow_schema if f.name in ctx.fields or f.name == ORDER},
              "evolved": ctx.evolved, "collect_new": ctx.collect_new}
    if getattr(ctx, "upsert", None) is not None:
        return UpsertDecoder(ctx.upsert, **kwargs)
    return ctx.payload.decoder(**kwargs) if ctx.payload is not None else BatchDecoder(**kwargs)


def unstorable_id(positions: list[str]) -> str | None:
    """The first stream id with a half above MAX_MS / MAX_SEQ, or None."""
    for position in positions:
        ms, _, seq = position.partition("-")
        if int(ms) > MAX_MS or int(seq or 0) > MAX_SEQ:
            return position
    return None


def unstorable_id_message(stream: str, position: str) -> str:
    return (f"stream {stream!r}: entry {position} has an id deltadrain cannot store (milliseconds up to {MAX_MS}, "
            f"sequence up to {MAX_SEQ}); it was added with an explicit XADD id, and Valkey numbers every later "
            f"entry of the stream after it. Let Valkey assign the ids (XADD *) on a new stream, move these entries "
            f"there, and drain that stream instead")


def record_batch(chunk: Entries, decoder: BatchDecoder, arrow_schema):
    """One chunk -> one Arrow record batch of the claim schema; the payloads decoded column-wise."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(chunk.positions)
    positions = pa.array(chunk.positions, pa.string())
    halves = pc.split_pattern(positions, "-", max_splits=1)  # "ms-seq", compared as two integers
    try:
        ms, seq = (pc.cast(pc.list_element(halves, i), pa.int64()) for i in (0, 1))
        fits = n == 0 or pc.max(ms).as_py() <= MAX_MS
    except pa.ArrowInvalid:  # above 2^63 - 1
        fits = False
    if not fits:
        position = unstorable_id(chunk.positions)
        assert position is not None  # the same bounds, checked one id at a time
        raise ValueError(unstorable_id_message(chunk.stream, position))
    cols = {"_dd_partition": pa.array([chunk.stream] * n, pa.string()),
            "_dd_position": positions, "_dd_pos_hi": ms, "_dd_pos_lo": seq,
            "_dd_source_ts": ms.cast(pa.timestamp("ms", tz="UTC")),
            "_dd_attempts": pa.array(chunk.attempts, pa.int32()), "_dd_reclaimed": pa.array(chunk.reclaimed, pa.bool_())}
    cols.update(decoder.columns(chunk.data, preset=chunk.preset))
    return pa.RecordBatch.from_arrays([cols[f.name].cast(f.type) for f in arrow_schema], schema=arrow_schema)


def _client(ctx: ClaimContext):
    from deltadrain.sources.valkey.client import connect

    return connect(ctx.url, ctx.cluster, ctx.username, ctx.password, ctx.ca_file, socket_timeout=60)


def run_claim(task: ClaimTask, ctx: ClaimContext) -> Iterator[Entries]:
    """Executor side: claim up to task.quota entries of one stream, a chunk at a time."""
    client = reader(ctx)
    got = 0
    if task.reclaim:
        cursor = task.start
        while True:
            count = min(READ_CHUNK, task.quota - got)
            cursor, entries, deleted = _xautoclaim(client, task.stream, ctx, cursor, count)
            chunk = Entries(task.stream)
            gap = deleted_while_pending(task.stream, deleted)
            if gap is not None and ctx.gaps_key:
                # XAUTOCLAIM has just dropped these ids from the pending list: record them now, or a
                # run that dies before its commit loses the only trace of them (invariant 1).
                record(client, ctx.gaps_key, [gap])
            for gone in deleted:
                # In the PEL but trimmed from the stream (MAXLEN/XDEL) before it was processed:
                # a gap marker, counted by the staging, never written as a row.
                chunk.add(str(StreamId.parse(gone)), None, 0, True, preset=(None, "gap", GAP, None, None))
            if entries:
                counts = _delivery_counts(client, task.stream, ctx, entries)
                failures, alone = _failures(client, ctx, task.stream, entries, counts)
                for entry_id, fields in entries:
                    pos = as_text(entry_id)
                    data = (fields or {}).get(VALKEY_FIELD)
                    attempts = counts.get(pos, 2)
                    chunk.add(pos, data, attempts, True,
                              retries_run_out(ctx, attempts, data, failures.get(pos), alone.get(pos, 0)))
                got += len(entries)
            if not task.new:
                got += len(deleted)  # a split's quota counts the pending list, deleted entries too
            if chunk.positions:
                yield chunk
            if cursor in ("0-0", b"0-0") or got >= task.quota:
                break
    carried = carried_ends_of(client, ctx.gaps_key, [task.stream]).get(task.stream, ZERO) if task.new else ZERO
    while task.new and got < task.quota:
        entries = read_new_past_gaps(client, ctx, task.stream, min(READ_CHUNK, task.quota - got), carried)
        if not entries:
            break
        yield Entries.unparsed(task.stream, entries)
        got += len(entries)
    client.close()


def _unparsed(response, **_options):
    return response


def reader(ctx: ClaimContext):
    """A client whose XREADGROUP and XRANGE replies stay as the server sent them (RESP2):
    [id, [field, value, ...]] per entry. The client's own parsing builds a dict of every entry's
    fields in Python, only for the one field we take out (`payload_of`): a claim task's read and
    decode took 1.34 s per 100 000 entries without it against 1.44 s with it, side by side."""
    client = _client(ctx)
    for command in ("XREADGROUP", "XRANGE"):
        client.set_response_callback(command, _unparsed)
    return client


def read_new(client, group: str, consumer: str, stream: str, count: int) -> list:
    """XREADGROUP > of one stream with a `reader` client: its new entries, unparsed."""
    reply = client.xreadgroup(group, consumer, {stream: ">"}, count=count)
    return reply[0][1] if reply else []


def read_new_past_gaps(client, ctx: ClaimContext, stream: str, count: int, carried=ZERO) -> list:
    """`read_new`, in one transaction with the XINFO calls the gap check reads, and the gap it reads
    past recorded. The run checked for gaps before it claimed, but the stream goes on changing: entries
    trimmed (MAXLEN under a producer that outruns the drain) or deleted past the group's position
    after that check would be skipped by XREADGROUP without a trace (invariant 1). `carried`: the end
    of an XDEL gap a commit already carried (gaps.carried_ends_of)."""
    if ctx.cluster:
        info, groups, reply = _read_in_script(client, ctx, stream, count)
    else:
        pipe = client.pipeline(transaction=True)
        pipe.xinfo_stream(stream)
        pipe.xinfo_groups(stream)
        pipe.xreadgroup(ctx.group, ctx.consumer, {stream: ">"}, count=count)
        info, groups, reply = pipe.execute()
    gap = unread_gap(stream, state_of(info, groups, ctx.group, carried))
    if gap is not None and ctx.gaps_key:
        # As soon as the read returns: a task that dies before its commit leaves the record behind.
        record(client, ctx.gaps_key, [gap])
    return reply[0][1] if reply else []


# A cluster client has no MULTI: the same three reads, atomic, as one script on the stream's primary.
_READ = """
local info = redis.call('XINFO', 'STREAM', KEYS[1])
local groups = redis.call('XINFO', 'GROUPS', KEYS[1])
local reply = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', ARGV[3], 'STREAMS', KEYS[1], '>')
return {info, groups, reply}
"""


def _read_in_script(client, ctx: ClaimContext, stream: str, count: int):
    """`read_new_past_gaps`'s transaction for a cluster client: the replies parsed as valkey-py parses them."""
    from valkey._parsers.helpers import pairs_to_dict, parse_xinfo_stream

    info, groups, reply = client.eval(_READ, 1, stream, ctx.group, ctx.consumer, count)
    return (parse_xinfo_stream(info), [pairs_to_dict(g, decode_keys=True) for g in groups], reply or [])


def payload_of(fields: list | dict | None, name: bytes):
    """The value of field `name` in an entry's [field, value, ...] list (None when it has none). A
    cluster client parses replies on its nodes' connections: there an entry's fields come as a dict."""
    if isinstance(fields, dict):
        return fields.get(name)
    items = fields or []
    for i in range(0, len(items) - 1, 2):
        if items[i] == name:
            return items[i + 1]
    return None


def claim_arrow(task_batches, ctx: ClaimContext, arrow_schema):
    """mapInArrow body: task rows in, claimed rows out as Arrow record batches.

    Arrow instead of pickled rows, and payloads decoded column-wise (deltadrain.formats.decode.BatchDecoder):
    that is what keeps the claim near the raw XREADGROUP rate.
    """
    decoder = decoder_for(ctx, arrow_schema)
    for batch in task_batches:
        for task in batch.to_pylist():
            for chunk in run_claim(ClaimTask(**task), ctx):
                yield record_batch(chunk, decoder, arrow_schema)


def _xautoclaim(client, stream: str, ctx: ClaimContext, cursor, count: int):
    """(next cursor, [(id, fields)], [ids deleted from the stream while pending])."""
    raw = client.xautoclaim(stream, ctx.group, ctx.consumer, ctx.min_idle_ms, start_id=cursor, count=count)
    deleted = raw[2] if len(raw) > 2 else []
    entries = [(entry_id, fields) for entry_id, fields in raw[1] if entry_id is not None]
    return raw[0], entries, deleted


def _delivery_counts(client, stream: str, ctx: ClaimContext, entries) -> dict[str, int]:
    """XAUTOCLAIM does not return delivery counts; XPENDING for the claimed range does."""
    ids = [as_text(e[0]) for e in entries]
    lo = min(ids, key=StreamId.parse)
    hi = max(ids, key=StreamId.parse)
    rows = client.xpending_range(stream, ctx.group, min=lo, max=hi, count=len(ids) * 2 + 10,
                                 consumername=ctx.consumer)
    return {as_text(r["message_id"]): int(r["times_delivered"]) for r in rows}


def _failures(client, ctx: ClaimContext, stream: str, entries, counts: dict[str, int]
              ) -> tuple[dict[str, dict], dict[str, int]]:
    """The recorded transform failures of the entries delivered more than max_retries + 1 times, and
    the reads alone of every redelivered entry (valkey.crashes)."""
    keys = [as_text(e[0]) for e in entries]
    again = [k for k in keys if counts.get(k, 2) > 1]
    spent = [k for k in again if counts.get(k, 2) > ctx.max_attempts]
    if not again:
        return {}, {}
    fields = [alone_field(stream, k) for k in again] + [failure_field(stream, k) for k in spent]
    values = client.hmget(ctx.failures_key, fields)
    alone = {k: int(v) for k, v in zip(again, values[:len(again)], strict=True) if v}
    failures = {k: json.loads(v) for k, v in zip(spent, values[len(again):], strict=True) if v}
    return failures, alone
