"""Gaps: Valkey entries deleted before the drain got them (invariant 1: reported, never skipped).

Two ways an entry can go before it is in the target or the DLQ:
- removed before the group read it (MAXLEN/MINID trimming, XDEL): `unread_gap` decides from what
  XINFO STREAM and XINFO GROUPS say, before the run's XREADGROUP moves the group past it;
- deleted while pending: XAUTOCLAIM names such ids and drops them from the pending list
  (`deleted_while_pending`).

Either way the gap is recorded in the pipeline's gaps hash before the group or the pending list
forgets it, so a run that dies or loses the race after that does not lose the report: the next
committed batch carries every recorded gap in its commit metadata, then forgets the ones it carried.
(Under on_gap: fail, no batch commits while a gap is recorded, until a run accepts the gaps.)

An XDEL ahead of the group is found from the group's position, up to the deleted id, by every run
until the group reads past it. A commit that carried such a gap leaves its end in the `carried`
hash, so that the runs after it do not take the same deletion for a new gap.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from deltadrain.positions import StreamId
from deltadrain.sources.valkey.client import as_text

SEQ_MAX = 2**64 - 1
ZERO = StreamId(0, 0)
LISTED_IDS = 100  # ids listed in a deleted-while-pending gap; `missing` always counts them all


def _entries(n: int) -> str:
    return "1 entry was" if n == 1 else f"{n} entries were"


def gaps_key(pipeline: str) -> str:
    return f"deltadrain:{{{pipeline}}}:gaps"


def carried_key(key: str) -> str:
    """Per stream, the end of the furthest unread gap a commit carried (next to the gaps hash `key`)."""
    return f"{key}:carried"


def successor(i: StreamId) -> StreamId:
    return StreamId(i.ms, i.seq + 1) if i.seq < SEQ_MAX else StreamId(i.ms + 1, 0)


def predecessor(i: StreamId) -> StreamId:
    return StreamId(i.ms, i.seq - 1) if i.seq else StreamId(i.ms - 1, SEQ_MAX)


@dataclass(frozen=True)
class Gap:
    """Entries of one stream between `first` and `last` (inclusive) that no run will ever get.
    `missing` is how many, or None when the server's counters cannot tell."""

    partition: str
    kind: str  # "unread" (removed before delivery) or "pending" (deleted while pending)
    first: str
    last: str
    missing: int | None
    reason: str
    ids: tuple[str, ...] = ()

    @property
    def field(self) -> str:
        """Its field in the gaps hash: the same gap found again by another run lands on the same field."""
        return f"{self.partition}\x00{self.kind}\x00{self.first}"

    def as_dict(self) -> dict:
        out: dict[str, object] = {"partition": self.partition, "kind": self.kind, "from": self.first, "to": self.last,
               "missing": self.missing, "reason": self.reason}
        if self.ids:
            out["ids"] = list(self.ids)
        return out


@dataclass(frozen=True)
class StreamState:
    """What XINFO STREAM and XINFO GROUPS (one group) say, as the gap decision needs it."""

    length: int
    entries_added: int | None  # every entry ever appended (Valkey 7+)
    first: StreamId | None  # the first entry still in the stream; None when it is empty
    last: StreamId  # last-generated-id
    max_deleted: StreamId  # the highest id XDEL removed; 0-0 when none
    delivered: StreamId  # the group's last-delivered-id
    entries_read: int | None  # the group's logical read counter; None when the server lost track
    # The end of the furthest unread gap a commit carried: an XDEL evidence (max-deleted-entry-id)
    # at or below it is that gap, already reported.
    carried: StreamId = ZERO

    @classmethod
    def of(cls, stream: dict, group: dict | None, carried: StreamId = ZERO) -> StreamState:
        """From valkey-py's xinfo_stream() and this group's row of xinfo_groups() (None: no group yet,
        which the drain creates at 0-0)."""
        def sid(value) -> StreamId:
            return StreamId.parse(as_text(value)) if value else ZERO

        length = int(stream["length"])
        first = sid(stream.get("recorded-first-entry-id") or (stream.get("first-entry") or [None])[0])
        added, read = stream.get("entries-added"), (group or {}).get("entries-read")
        return cls(length=length, entries_added=None if added is None else int(added),
                   first=first if length else None, last=sid(stream.get("last-generated-id")),
                   max_deleted=sid(stream.get("max-deleted-entry-id")),
                   delivered=sid((group or {}).get("last-delivered-id")),
                   entries_read=None if read is None else int(read), carried=carried)

    def new_deletion(self) -> bool:
        """An XDEL beyond the group's position that no commit carried yet. A carried end past the
        stream's last id belongs to an earlier stream of the same name: it hides nothing."""
        carried = self.carried if self.carried <= self.last else ZERO
        return self.max_deleted > self.delivered and self.max_deleted > carried


def unread_gap(stream: str, st: StreamState) -> Gap | None:
    """Entries after the group's last-delivered-id (`got`) that the stream no longer holds, or None.

    Entries the group was delivered (ids <= got) are never a gap here: trimming or XDEL of them
    after their acknowledgement loses nothing, and one deleted while pending is XAUTOCLAIM's to report.
    - Every entry left is after `got` (or none is left): the entries after `got` ever appended are
      entries_added minus those appended up to `got`, and all that are left are among them, so the
      difference with the length is exact. Those appended up to `got` are 0 when `got` is 0-0, else
      the group's read counter; when the server lost that counter, the gap is only possible, and
      reported as such with an unknown size.
    - Otherwise trimming removed nothing after `got`; only an XDEL beyond it did (max-deleted-entry-id
      > got): that entry at least, how many more is not known without scanning the stream. Unless a
      commit already carried a gap up to that id (`StreamState.carried`): then it is that gap, found
      again from a group that has not read past it yet.
    Ids are compared as integer pairs (StreamId), never as strings."""
    got = st.delivered
    if got >= st.last or (st.entries_added is not None and st.entries_added == st.length):
        return None  # nothing appended after it, or nothing ever removed
    start = str(successor(got))
    if st.first is None or st.first > got:
        end = st.last if st.first is None else predecessor(st.first)
        if st.new_deletion():
            end = max(end, st.max_deleted)  # also XDELs among the entries left
        if end < successor(got):
            return None  # the first entry left directly follows `got`, and no XDEL was beyond it
        before = 0 if got == ZERO else st.entries_read
        where = "the stream is empty" if st.first is None else f"its first entry is {st.first}"
        if before is None or st.entries_added is None:
            return Gap(stream, "unread", start, str(end), None,
                       f"entries after {got} up to {end} may have been removed (trimming or XDEL) before the group "
                       f"read them ({where}); the server's counters cannot tell whether any were")
        missing = st.entries_added - before - st.length
        if missing <= 0:
            return None
        return Gap(stream, "unread", start, str(end), missing,
                   f"{_entries(missing)} removed after {got} (MAXLEN/MINID trimming or XDEL) before the group "
                   f"read them; {where}")
    if st.new_deletion():
        return Gap(stream, "unread", start, str(st.max_deleted), None,
                   f"entries after {got} up to {st.max_deleted} were deleted (XDEL) before the group read them; "
                   f"at least {st.max_deleted} itself, how many in all is not known")
    return None


def deleted_while_pending(stream: str, ids: list) -> Gap | None:
    """The gap of ids XAUTOCLAIM reported as deleted from the stream while they were pending."""
    if not ids:
        return None
    ordered = sorted({StreamId.parse(i) for i in ids})
    listed = tuple(str(i) for i in ordered[:LISTED_IDS])
    return Gap(stream, "pending", str(ordered[0]), str(ordered[-1]), len(ordered),
               f"{_entries(len(ordered))} deleted from the stream (MAXLEN trimming or XDEL) while pending, "
               f"before any run committed them", listed)


# -- the server side (small; the decisions are above) ------------------------------------------

def stream_state(client, stream: str, group: str, carried: StreamId = ZERO) -> StreamState | None:
    """Two XINFO calls; None when the stream does not exist. `carried`: see `carried_ends_of`."""
    try:
        info = client.xinfo_stream(stream)
    except Exception as exc:
        if "no such key" in str(exc).lower():
            return None
        raise
    return state_of(info, client.xinfo_groups(stream), group, carried)


def state_of(stream_info: dict, groups: list, group: str, carried: StreamId = ZERO) -> StreamState:
    """The StreamState of `group` from XINFO STREAM and XINFO GROUPS replies (valkey-py's dicts)."""
    mine = next((g for g in groups if as_text(g["name"]) == group), None)
    return StreamState.of(stream_info, mine, carried)


def carried_ends_of(client, key: str | None, streams) -> dict[str, StreamId]:
    """Per stream, the end of the furthest unread gap a commit carried (one HMGET for them all)."""
    streams = list(streams)
    if not key or not streams:
        return {}
    return {s: StreamId.parse(as_text(v)) for s, v in zip(streams, client.hmget(carried_key(key), streams),
                                                          strict=True) if v}


def found_unread(client, streams, group: str, key: str | None) -> list[tuple[Gap, StreamState]]:
    """`unread_gap` of each stream that exists, with the state it was found in. `key`: the gaps hash,
    next to which the ends of carried gaps are kept (None: none are known)."""
    carried = carried_ends_of(client, key, streams)
    return [(gap, st) for stream in streams
            if (st := stream_state(client, stream, group, carried.get(stream, ZERO))) is not None
            and (gap := unread_gap(stream, st)) is not None]


def unread_gaps(client, streams, group: str, key: str | None) -> list[Gap]:
    """`unread_gap` of each stream that exists (two XINFO calls a stream, and one HMGET)."""
    return [gap for gap, _ in found_unread(client, streams, group, key)]


def open_gaps(client, streams, group: str, key: str | None) -> dict[str, str]:
    """The gaps no commit carries yet: recorded in the hash `key`, and those the next drain will find
    (entries removed before the group read them), as the hash holds them."""
    return {**(recorded(client, key) if key else {}), **as_recorded(unread_gaps(client, streams, group, key))}


# The group's last-delivered-id to the stream's end, when no entry follows it: `XREADGROUP >` moves
# it only by delivering, so an unread gap with nothing after it would be found by every run. Only
# while the stream's last-generated-id is the one the gap was found with (an entry appended, and
# trimmed, since then would be a gap no one recorded). ENTRIESREAD keeps the group's lag exact.
_MOVE_PAST = """
local info = redis.call('XINFO', 'STREAM', KEYS[1])
local last, added
for i = 1, #info, 2 do
  if info[i] == 'last-generated-id' then last = info[i + 1] end
  if info[i] == 'entries-added' then added = info[i + 1] end
end
if last ~= ARGV[2] then return 0 end
for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local name, got
  for i = 1, #g, 2 do
    if g[i] == 'name' then name = g[i + 1] end
    if g[i] == 'last-delivered-id' then got = g[i + 1] end
  end
  if name == ARGV[1] then
    if #redis.call('XRANGE', KEYS[1], '(' .. got, '+', 'COUNT', 1) > 0 then return 0 end
    redis.call('XGROUP', 'SETID', KEYS[1], ARGV[1], last, 'ENTRIESREAD', added)
    return 1
  end
end
return 0
"""


def move_past(client, stream: str, group: str, st: StreamState) -> bool:
    """Move `group` past an unread gap of `stream` found in state `st` when nothing readable follows
    it (call only once the gap is recorded). False when an entry follows, or the stream moved on."""
    return bool(client.eval(_MOVE_PAST, 1, stream, group, str(st.last)))


def as_recorded(gaps: list[Gap]) -> dict[str, str]:
    """Gaps as the gaps hash holds them: field -> JSON."""
    return {g.field: json.dumps(g.as_dict(), sort_keys=True) for g in gaps}


def record(client, key: str, gaps: list[Gap]) -> None:
    if gaps:
        client.hset(key, mapping=as_recorded(gaps))


def recorded(client, key: str) -> dict[str, str]:
    """Field -> JSON of every gap not yet carried by a commit (a handful: one per stream and run)."""
    return {as_text(f): as_text(v) for f, v in client.hgetall(key).items()}


# Forget only the fields a commit carried as they were: a run that recorded the same gap again,
# wider, in the meantime keeps its version for the next commit.
_FORGET = """
local n = 0
for i = 1, #ARGV, 2 do
  if redis.call('HGET', KEYS[1], ARGV[i]) == ARGV[i + 1] then
    n = n + redis.call('HDEL', KEYS[1], ARGV[i])
  end
end
return n
"""


def forget(client, key: str, carried: dict[str, str]) -> int:
    """After the commit that carried them: forget the gaps, and keep how far each stream's unread
    gaps reached (`carried_key`), the XDEL evidence later runs must not report again."""
    if not carried:
        return 0
    ends = carried_ends(carried)
    if ends:
        held = carried_ends_of(client, key, ends)
        further = {s: str(e) for s, e in ends.items() if s not in held or e > held[s]}
        if further:  # only ever moves forward (a late writer at worst reports a gap again)
            client.hset(carried_key(key), mapping=further)
    return int(client.eval(_FORGET, 1, key, *[x for item in carried.items() for x in item]))


def carried_ends(carried: dict[str, str]) -> dict[str, StreamId]:
    """Per stream, the furthest end of the unread gaps among `carried` (field -> JSON)."""
    ends: dict[str, StreamId] = {}
    for value in carried.values():
        g = json.loads(value)
        if g["kind"] == "unread":
            end = StreamId.parse(g["to"])
            ends[g["partition"]] = max(ends.get(g["partition"], ZERO), end)
    return ends


def as_ranges(carried: dict[str, str]) -> list[dict]:
    """The recorded gaps as the run summary and the commit metadata list them, in a stable order."""
    gaps = [json.loads(v) for v in carried.values()]
    return sorted(gaps, key=lambda g: (g["partition"], StreamId.parse(g["from"]), g["kind"]))


def describe_gap(g: dict) -> str:
    """One recorded gap, for an error message."""
    n = g["missing"]
    many = "an unknown number of entries" if n is None else "1 entry" if n == 1 else f"{n} entries"
    how = "removed before the group read them" if g["kind"] == "unread" else "deleted while pending"
    return f"stream {g['partition']} ids {g['from']} to {g['to']} ({many}, {how})"


def count(gaps: list[dict]) -> int:
    """The summary's `gaps`: entries known to be missing, and one for each range of unknown size, so
    that a run with any gap never shows 0."""
    return sum(1 if g["missing"] is None else g["missing"] for g in gaps)
