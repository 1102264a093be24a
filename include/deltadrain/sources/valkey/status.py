"""Lifecycle counts at a Valkey source: per stream, what the group has not read (PENDING), what its
consumers hold (CLAIMED), the gaps, and the ranges under suspicion that runs which died left."""

from __future__ import annotations

from pathlib import Path

from deltadrain.config import PipelineConfig, ValkeySource
from deltadrain.paths import command_line
from deltadrain.sources.valkey.client import as_text, stream_counts, valkey_source
from deltadrain.sources.valkey.gaps import as_ranges, open_gaps


def valkey_counts(client, source: ValkeySource, gaps_at: str | None = None, pipeline: PipelineConfig | None = None
                  ) -> dict:
    """Counts per stream, and the gaps: those recorded in the hash `gaps_at` that no commit carries yet, and
    those the next drain will find (entries removed before the group read them). With the `pipeline`,
    `splits`: the ranges under suspicion, what runs that died left pending that drains split
    (valkey.crashes), in the order they settle it."""
    pending = claimed = 0
    consumers: dict[str, dict] = {}
    oldest_idle = 0
    partitions = {}
    missing: list[str] = []  # streams with no key: never written (or deleted)
    gaps = open_gaps(client, source.streams, source.group, gaps_at)
    for stream in source.streams:
        length, lag, in_pel = stream_counts(client, stream, source.group)
        pending += lag
        claimed += in_pel
        partitions[stream] = {"length": length, "pending": lag, "claimed": in_pel}
        if not length and not client.exists(stream):
            missing.append(stream)
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
            "oldest_claim_idle_ms": oldest_idle, "partitions": partitions, "gaps": as_ranges(gaps), "splits": splits,
            "missing_streams": missing}


def oldest_pending_ms(client, source: ValkeySource) -> int | None:
    """The append time (the ms of its stream id) of the oldest entry the group has not acknowledged: the
    first of its pending list, or the first after its last delivered id; None: no entry waits. Ids that
    producers chose themselves (not `*`) carry their time only if the producer put it there."""
    from deltadrain.positions import StreamId

    oldest: int | None = None
    for stream in source.streams:
        if not client.exists(stream):
            continue
        info = next((g for g in client.xinfo_groups(stream) if as_text(g["name"]) == source.group), None)
        firsts = []
        if info is not None and int(info.get("pending", 0)):
            firsts += [e["message_id"] for e in client.xpending_range(stream, source.group, min="-", max="+", count=1)]
        after = "-" if info is None else f"({as_text(info['last-delivered-id'])}"
        firsts += [entry_id for entry_id, _ in client.xrange(stream, min=after, max="+", count=1)]
        for first in firsts:
            ms = StreamId.parse(as_text(first)).ms
            oldest = ms if oldest is None else min(oldest, ms)
    return oldest


NEVER_WRITTEN, STREAM_GONE, BEHIND = "never_written", "stream_gone", "behind_checkpoint"


def stream_notes(pipeline: PipelineConfig, missing: list[str], positions: dict[str, str],
                 config: Path | None = None) -> list[dict]:
    """Notes on the pipeline's streams that do not exist (pure): never written, or, when the lake's
    checkpoint holds a position of one, deleted since. `config`: the config file the command named reads."""
    never = [s for s in missing if s not in positions]
    notes = []
    if never:
        many = len(never) > 1
        notes.append({"state": NEVER_WRITTEN, "note": (
            f"stream{'s' if many else ''} {', '.join(never)} {'have' if many else 'has'} never been written (no such "
            f"key on the server): nothing to drain from {'them' if many else 'it'} yet. A stream appears with its "
            f"first XADD (`{command_line(f'produce {pipeline.name} --count N', config)}` writes sample events)")})
    for stream in (s for s in missing if s in positions):
        notes.append({"state": STREAM_GONE, "note": (
            f"stream {stream} does not exist, though the lake's checkpoint holds its position {positions[stream]}: "
            "it was deleted (DEL, or the server lost its data) after batches were drained from it; new entries "
            "start it again, check the server")})
    return notes


def behind_notes(positions: dict[str, str], last_ids: dict[str, str]) -> list[dict]:
    """Notes on the streams whose newest id (last-generated-id) is below the position the lake's
    checkpoint holds (pure): the server lost entries a batch had committed. After a failover, the
    promoted replica had not received them; the appends the old primary acknowledged after them are
    lost too, and nothing on the server tells how many."""
    from deltadrain.positions import StreamId

    return [{"state": BEHIND, "note": (
        f"stream {stream} ends at {last_ids[stream]}, before the position {positions[stream]} the lake's "
        "checkpoint holds: the server lost entries that a batch had already committed (a replica promoted "
        "before it had them, or a restore from an older copy); appends acknowledged after them may be lost "
        "too and cannot be counted. The lake keeps what it committed; new entries go on draining")}
        for stream in sorted(last_ids) if stream in positions
        and StreamId.parse(last_ids[stream]) < StreamId.parse(positions[stream])]


def last_ids(client, streams) -> dict[str, str]:
    """last-generated-id of each stream that exists (XINFO STREAM, one call a stream)."""
    out = {}
    for stream in streams:
        try:
            out[stream] = as_text(client.xinfo_stream(stream)["last-generated-id"])
        except Exception as exc:
            if "no such key" not in str(exc).lower():
                raise
    return out


def valkey_splits(client, pipeline: PipelineConfig) -> list[dict]:
    """Pieces of the segments runs died on, and the rests of split ones, with the deaths alone of a
    single entry: the idle entries of the pending list, read PAGE at a time."""
    from deltadrain.sources.valkey.claim import alone_field
    from deltadrain.sources.valkey.crashes import RESTING, SPLIT_FROM, SUSPECT, reclaimable, segments
    from deltadrain.sources.valkey.drain import failures_key

    source = valkey_source(pipeline)
    key = failures_key(pipeline.name)
    found = segments((s, i, n, kind) for s, i, n, kind, _ in
                     reclaimable(client, source.streams, source.group, pipeline.min_idle_ms, key, own=""))
    shown = [seg for seg in found if seg.kind == RESTING or (seg.kind == SUSPECT and seg.deliveries >= SPLIT_FROM)]
    # A single entry's count of the runs that read it alone (valkey.crashes.count_alone), all of them dead.
    singles = [seg.pieces[0] for seg in shown if seg.entries == 1]
    counts = iter(client.hmget(key, [alone_field(p.stream, p.first) for p in singles]) if singles else ())
    out = []
    for seg in shown:
        alone = int(next(counts) or 0) if seg.entries == 1 else 0
        out += [{**piece, "alone": alone} for piece in seg.as_json()]
    return out


def status_lines(st: dict) -> list[str]:
    """`deltadrain status`'s lines of the source's own: the gaps and the ranges under suspicion."""
    lines = []
    for gap in st.get("gaps") or []:
        size = "unknown number of entries" if gap["missing"] is None else f"{gap['missing']} entries"
        lines.append(f"GAP: stream {gap['partition']} ids {gap['from']} .. {gap['to']} ({size}): {gap['reason']}")
    for piece in st.get("splits") or []:
        rest = ", the untried half of a split" if piece["kind"] == "rest" else ""
        lines.append(f"UNDER SUSPICION: stream {piece['partition']} ids {piece['ids'][0]} .. {piece['ids'][1]} "
                     f"({piece['entries']} entries, delivered {piece['deliveries']} times{rest}, "
                     f"{piece.get('alone', 0)} runs died reading one alone): runs died on them before committing; "
                     "the next runs read them half at a time (max_retries deaths alone: a dead letter)")
    return lines
