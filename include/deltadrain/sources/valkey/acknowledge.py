"""Acknowledge (after the commit) or release (after a lost race) the claimed entries.

Only entries of a committed batch are acknowledged (invariants 4 and 5). A release hands the
entries back for immediate re-claiming: XCLAIM ... IDLE <min_idle_ms> JUSTID to the consumer
`deltadrain-released` makes them look idle long enough for the next drain's XAUTOCLAIM, without
counting a delivery. It moves only the entries
this run's consumer still holds (`claim_held`): by the time a run loses its race, the reaper may
have handed some of its entries to another live run, and taking them back would expose them to a
third run's claim (one more delivery each, toward max_retries and the DLQ).

Both run in the driver over the staged claim files, reading only the partition, position and
attempts columns, READ_ROWS rows at a time and holding at most ACK_IDS positions per stream: the
driver's memory stays bounded by those, not by the batch. Each XACK is a write the embedded Valkey
syncs to its AOF before it answers, so a batch goes in few large XACKs rather than many small ones
(bench/ack_chunks/README.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from deltadrain import failpoints
from deltadrain.sources.valkey.claim import RELEASED, ClaimContext, _client, alone_field, failure_field
from deltadrain.sources.valkey.client import as_text

# Positions per XACK (or release script): each is a write the embedded Valkey syncs to its AOF.
ACK_IDS = 5_000
READ_ROWS = 20_000  # staged rows read at a time
COLUMNS = ["_dd_partition", "_dd_position", "_dd_attempts"]

# XCLAIM alone takes an entry from whoever holds it, and silently drops one that was deleted from
# the stream from the pending list. In one script (atomic, no other command in between), move only
# the ids that ARGV[2] still holds and that the stream still has; a deleted one stays pending, for
# the next XAUTOCLAIM to report as a gap.
# KEYS[1] stream; ARGV: group, holder, new owner, min idle ms, idle ms to set, ids...
_CLAIM_HELD = """
local moved = {}
for i = 6, #ARGV do
  local id = ARGV[i]
  local held = redis.call('XPENDING', KEYS[1], ARGV[1], id, id, 1, ARGV[2])
  if #held == 1 and #redis.call('XRANGE', KEYS[1], id, id) == 1 then
    local got = redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[3], ARGV[4], id, 'IDLE', ARGV[5], 'JUSTID')
    if #got == 1 then
      moved[#moved + 1] = got[1]
    end
  end
end
return moved
"""


def claim_held(client, stream: str, group: str, holder: str, to: str, min_idle_ms: int, idle_ms: int,
               ids: list[str]) -> list[str]:
    """XCLAIM ... JUSTID of those `ids` that `holder` still holds and the stream still has: the ids moved."""
    if not ids:
        return []
    moved = client.eval(_CLAIM_HELD, 1, stream, group, holder, to, min_idle_ms, idle_ms, *ids)
    return [as_text(i) for i in moved]


def staged_entries(files: Iterable[str], keep: frozenset = frozenset()) -> Iterator[tuple[str, list, list]]:
    """(stream, positions, again) pieces of the staged rows, each of one stream and at most ACK_IDS
    positions, leaving out the (stream, position) pairs in `keep` (culprits left pending for another
    attempt). `again`: those of the positions delivered or read before (attempts other than 1), whose
    recorded failures go. The files are read READ_ROWS rows at a time and split by stream column-wise;
    only the positions become Python strings, at most ACK_IDS of them per stream at a time."""
    import pyarrow.compute as pc

    from deltadrain.run.stage import open_staged

    held: dict[str, list] = {}
    again: set[tuple[str, str]] = set()
    for path in files:
        for batch in open_staged(path).iter_batches(batch_size=READ_ROWS, columns=COLUMNS):
            streams = batch.column("_dd_partition")
            names = pc.unique(streams).to_pylist()
            for stream in names:
                part = batch if len(names) == 1 else batch.filter(pc.equal(streams, stream))
                positions = part.column("_dd_position")
                retried = positions.filter(pc.not_equal(pc.fill_null(part.column("_dd_attempts"), 0), 1))
                again.update((stream, p) for p in retried.to_pylist())
                mine = held.setdefault(stream, [])
                mine += [p for p in positions.to_pylist() if (stream, p) not in keep] if keep else positions.to_pylist()
                while len(mine) >= ACK_IDS:
                    piece = mine[:ACK_IDS]
                    del mine[:ACK_IDS]
                    yield stream, piece, [p for p in piece if (stream, p) in again]
    for stream, positions in held.items():
        if positions:
            yield stream, positions, [p for p in positions if (stream, p) in again]


def acknowledge(files: Iterable[str], ctx: ClaimContext, keep: frozenset = frozenset()) -> int:
    """XACK every staged entry but those in `keep`; forget the recorded failures of retried ones."""
    client = _client(ctx)
    done = 0
    try:
        for stream, positions, again in staged_entries(files, keep):
            pipe = client.pipeline(transaction=False)
            pipe.xack(stream, ctx.group, *positions)
            # Redelivered entries may have a recorded failure or count alone; so may a gap marker
            # (attempts 0: an entry deleted while pending, met by a run that read it alone).
            if again:
                pipe.hdel(ctx.failures_key, *[f(stream, p) for p in again for f in (failure_field, alone_field)])
            done += pipe.execute()[0]
            failpoints.hit("during_ack")  # some chunks acknowledged, the others not
    finally:
        client.close()
    return done


def release(files: Iterable[str], ctx: ClaimContext) -> int:
    """Make the staged entries this run's consumer still holds reclaimable at once; leave the rest.
    They go to the consumer RELEASED: a run that stopped without dying handed them back, so the next
    run reclaims them whole instead of splitting them as a dead run's (valkey.crashes)."""
    client = _client(ctx)
    done = 0
    try:
        for stream, positions, _ in staged_entries(files):
            done += len(claim_held(client, stream, ctx.group, ctx.consumer, RELEASED, 0,
                                   max(ctx.min_idle_ms, 1), positions))
    finally:
        client.close()
    return done
