"""Valkey: split what runs that died left pending, until what kills runs is alone (invariant 6; the
rule itself is `isolation`'s).

A Valkey claim is a delivery. The entries of a run that dies (a crash, a hang stopped at the task's
execution_timeout, out of memory, a worker restarted) stay pending, idle, with a consumer that is
gone. Most such runs were not killed by their data, so a death convicts no entry: it only makes the
next runs read less. Entries a dead run left are suspects, unless a transform failure is recorded
for them (the drain's culprits, which ride along with new entries and are isolated in the run) or a
run that stopped without dying handed them back to RELEASED (a lost race, a gap under on_gap: fail).
Then, one segment at a time, in (stream, id) order:

- a run reads the first half of the first suspect segment and nothing else, and hands the other
  half to the consumer REST, delivery counts kept (XCLAIM ... JUSTID);
- a REST segment is read whole by a later run: if it kills that run too, it is suspect again;
- a run that reads a single entry and nothing else counts one read alone for it (`alone_field` in
  the drain's failures hash) before it claims it. An entry read alone more than max_retries times
  has died alone max_retries times: the claim makes it a `max_retries` dead letter, unread by the
  transform (`claim.retries_run_out`). An acknowledged entry's count is deleted with it.

A segment is a run of pending entries, idle past min_idle_ms, of one kind and one delivery count, so
the pieces of earlier splits stay apart. A message that kills every run is read by at most
`isolation.crash_loop_runs(batch_cap, max_retries)` runs and ends in the DLQ alone; its neighbours
are published. Everything above the I/O helpers at the end is pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from deltadrain.run.isolation import read_width
from deltadrain.sources.valkey.claim import RELEASED, REST, alone_field

SUSPECT, RESTING, CULPRIT, HANDED_BACK = "suspect", "rest", "culprit", "released"
SPLIT_FROM = 1  # deliveries: a dead run's entries are split from their first redelivery
PAGE = 1_000  # XPENDING entries per call


@dataclass(frozen=True)
class Piece:
    """One stream's part of a segment: `entries` pending entries from id `first` to `last`."""

    stream: str
    first: str
    last: str
    entries: int


@dataclass(frozen=True)
class Segment:
    kind: str  # SUSPECT, RESTING, CULPRIT or HANDED_BACK
    deliveries: int
    pieces: tuple[Piece, ...]

    @property
    def entries(self) -> int:
        return sum(p.entries for p in self.pieces)

    def as_json(self) -> list[dict]:
        return [{"partition": p.stream, "ids": [p.first, p.last], "entries": p.entries,
                 "deliveries": self.deliveries, "kind": self.kind} for p in self.pieces]


def segments(entries: Iterable[tuple[str, str, int, str]]) -> Iterator[Segment]:
    """(stream, id, deliveries, kind) of the reclaimable entries, in (stream, id) order -> the runs of
    one kind and delivery count (a run goes on from one stream's last entry to the next one's first).
    Lazy: each segment is yielded once the entry after it is read, so `choose` reads no further."""
    seg: Segment | None = None
    for stream, entry, deliveries, kind in entries:
        if seg is not None and (seg.kind, seg.deliveries) != (kind, deliveries):
            yield seg
            seg = None
        if seg is None:
            seg = Segment(kind, deliveries, (Piece(stream, entry, entry, 1),))
            continue
        tail = seg.pieces[-1]
        if tail.stream == stream:
            pieces = (*seg.pieces[:-1], Piece(stream, tail.first, entry, tail.entries + 1))
        else:
            pieces = (*seg.pieces, Piece(stream, entry, entry, 1))
        seg = Segment(kind, deliveries, pieces)
    if seg is not None:
        yield seg


@dataclass(frozen=True)
class Split:
    """What a run reads instead of a batch: (stream, from id, entries) for each stream, and why."""

    segment: Segment
    read: tuple[tuple[str, str, int], ...]
    how: str  # FIRST_HALF or REST_OF_SPLIT

    @property
    def entries(self) -> int:
        return sum(n for _, _, n in self.read)

    @property
    def marks_rest(self) -> bool:
        return self.how == FIRST_HALF and self.entries < self.segment.entries

    @property
    def alone(self) -> tuple[str, str] | None:
        """(stream, id) of the one entry the run reads, when it reads one entry only."""
        if self.entries == 1:
            stream, first, _ = self.read[0]
            return stream, first
        return None

    def summary(self) -> list[dict]:
        how = ALONE if self.alone else self.how
        return [{**piece, "read": how} for piece in self.segment.as_json()]


FIRST_HALF, REST_OF_SPLIT, ALONE = "first half", "whole: the rest of a split", "alone"


def first_entries(segment: Segment, n: int) -> tuple[tuple[str, str, int], ...]:
    """The first `n` entries of a segment, as (stream, from id, entries) per stream."""
    out = []
    for piece in segment.pieces:
        if n <= 0:
            break
        take = min(n, piece.entries)
        out.append((piece.stream, piece.first, take))
        n -= take
    return tuple(out)


def choose(found: Iterable[Segment]) -> Split | None:
    """The split a run reads, or None for an ordinary batch (new entries, idle ones reclaimed whole).
    The first REST segment or suspect segment in (stream, id) order decides: the earliest pieces are
    settled first, as Kafka's checkpoint settles its ranges in offset order."""
    for seg in found:
        if seg.kind == RESTING:
            return Split(seg, first_entries(seg, seg.entries), REST_OF_SPLIT)
        if seg.kind == SUSPECT and seg.deliveries >= SPLIT_FROM:
            n = read_width(seg.entries, seg.deliveries, inside=False)
            return Split(seg, first_entries(seg, n), FIRST_HALF)
    return None


def kind_of(consumer: str, failure_recorded: bool) -> str:
    if consumer == REST:
        return RESTING
    if consumer == RELEASED:
        return HANDED_BACK
    if failure_recorded:
        return CULPRIT
    return SUSPECT


# -- I/O: the pending list ------------------------------------------------------------------------

def reclaimable(client, streams: Iterable[str], group: str, min_idle_ms: int, failures_key: str,
                own: str, start: str = "-") -> Iterator[tuple[str, str, int, str, str]]:
    """(stream, id, deliveries, kind, holder) of every pending entry idle past min_idle_ms that `own`
    does not hold, in (stream, id) order from `start`, PAGE entries a call. Transform failures are
    looked up only for entries delivered SPLIT_FROM times or more (the only ones that may be split)."""
    from deltadrain.sources.valkey.claim import failure_field
    from deltadrain.sources.valkey.client import as_text

    for stream in sorted(streams):
        while True:
            try:
                rows = client.xpending_range(stream, group, min=start, max="+", count=PAGE, idle=min_idle_ms)
            except Exception as exc:
                if "NOGROUP" in str(exc):
                    break
                raise
            got = [(as_text(r["message_id"]), int(r["times_delivered"]), as_text(r["consumer"])) for r in rows]
            ask = [i for i, n, holder in got if n >= SPLIT_FROM and holder not in (REST, RELEASED)]
            failed = set()
            if ask:
                values = client.hmget(failures_key, [failure_field(stream, i) for i in ask])
                failed = {i for i, v in zip(ask, values, strict=True) if v}
            for entry, deliveries, holder in got:
                if holder != own:
                    yield stream, entry, deliveries, kind_of(holder, entry in failed), holder
            if len(rows) < PAGE:
                break
            start = f"({got[-1][0]}"
        start = "-"


def find_split(client, streams: Iterable[str], group: str, min_idle_ms: int, failures_key: str,
               own: str) -> Split | None:
    entries = ((s, i, n, kind) for s, i, n, kind, _ in
               reclaimable(client, streams, group, min_idle_ms, failures_key, own))
    return choose(segments(entries))


def count_alone(client, split: Split, failures_key: str) -> int:
    """Before the claim of a split that reads one entry: one more read alone for it (`alone_field`).
    Counted first, so that a run killed while it reads the entry is counted. Returns the count."""
    assert split.alone is not None  # a split that reads one entry
    stream, entry = split.alone
    return int(client.hincrby(failures_key, alone_field(stream, entry), 1))


def uncount_alone(client, split: Split, failures_key: str) -> None:
    """Take back `count_alone`'s count of a run that stopped without dying (it handed its claim back)."""
    assert split.alone is not None  # a split that reads one entry
    stream, entry = split.alone
    field = alone_field(stream, entry)
    if int(client.hincrby(failures_key, field, -1)) <= 0:
        client.hdel(failures_key, field)


def mark_rest(client, split: Split, group: str, min_idle_ms: int, failures_key: str, own: str) -> int:
    """After this run claimed the first half: hand the rest of the segment (the entries in its pieces'
    ranges still idle and held by others) to REST, delivery counts and idleness kept (`claim_held`:
    only what its holder still holds and the stream still has). Returns how many moved."""
    from deltadrain.sources.valkey.acknowledge import claim_held

    moved = 0
    for piece in split.segment.pieces:
        for holder, ids in _rest_of(client, piece, split.segment, group, min_idle_ms, failures_key, own):
            moved += len(claim_held(client, piece.stream, group, holder, REST, min_idle_ms, max(min_idle_ms, 1), ids))
    return moved


def _rest_of(client, piece: Piece, seg: Segment, group: str, min_idle_ms: int, failures_key: str,
             own: str) -> Iterator[tuple[str, list[str]]]:
    """(holder, ids) of the segment's entries in `piece`'s range that `own` did not claim, PAGE at most."""
    from deltadrain.positions import StreamId

    last = StreamId.parse(piece.last)
    held: dict[str, list[str]] = {}
    for _, entry, deliveries, kind, holder in reclaimable(client, [piece.stream], group, min_idle_ms, failures_key,
                                                          own, start=piece.first):
        if StreamId.parse(entry) > last:
            break
        if (kind, deliveries) == (seg.kind, seg.deliveries):
            held.setdefault(holder, []).append(entry)
            if len(held[holder]) >= PAGE:
                yield holder, held.pop(holder)
    yield from held.items()
