"""Acknowledge (after the commit) or release (after a lost race) the claimed entries.

Only entries of a committed batch are acknowledged (invariants 4 and 5). A release hands the
entries back for immediate re-claiming: XCLAIM ... IDLE <min_idle_ms> JUSTID to the consumer
`deltadrain-released` makes them look idle long enough for the next drain's XAUTOCLAIM, without
counting a delivery. It moves only the entries
this run's consumer still holds (`claim_held`): by the time a run loses its race, the reaper may
have handed some of its entries to another live run, and taking them back would expose them to a
third run's claim (one more delivery each, toward max_retries and the DLQ).

Both run in the driver over the staged claim files, reading only the partition, position and
attempts columns, ACK_CHUNK rows at a time: the driver's memory stays bounded by the chunk, not the
batch. As a Spark job this took about 1 s per warm 200 000-entry batch (up to 3 s), from the driver
about 0.5 s (docs/benchmarks.md, "Valkey drain throughput").
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator

from deltadrain import failpoints
from deltadrain.sources.valkey.claim import RELEASED, ClaimContext, _client, alone_field, failure_field
from deltadrain.sources.valkey.client import as_text

ACK_CHUNK = 2_000  # entries per XACK / XCLAIM call
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


def staged_entries(files: Iterable[str], keep: frozenset = frozenset()) -> Iterator[tuple[str, list]]:
    """(stream, [(position, attempts)]) chunks of the staged rows, at most ACK_CHUNK entries each,
    leaving out the (stream, position) pairs in `keep` (culprits left pending for another attempt)."""
    from deltadrain.stage import open_staged

    for path in files:
        for batch in open_staged(path).iter_batches(batch_size=ACK_CHUNK, columns=COLUMNS):
            grouped: dict[str, list] = defaultdict(list)
            for stream, position, attempts in zip(*(batch.column(c).to_pylist() for c in COLUMNS), strict=True):
                if (stream, position) not in keep:
                    grouped[stream].append((position, attempts))
            yield from grouped.items()


def acknowledge(files: Iterable[str], ctx: ClaimContext, keep: frozenset = frozenset()) -> int:
    """XACK every staged entry but those in `keep`; forget the recorded failures of retried ones."""
    client = _client(ctx)
    done = 0
    try:
        for stream, entries in staged_entries(files, keep):
            pipe = client.pipeline(transaction=False)
            pipe.xack(stream, ctx.group, *[position for position, _ in entries])
            # Redelivered entries may have a recorded failure or count alone; so may a gap marker
            # (attempts 0: an entry deleted while pending, met by a run that read it alone).
            retried = [f(stream, position) for position, attempts in entries if attempts != 1
                       for f in (failure_field, alone_field)]
            if retried:
                pipe.hdel(ctx.failures_key, *retried)
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
        for stream, entries in staged_entries(files):
            done += len(claim_held(client, stream, ctx.group, ctx.consumer, RELEASED, 0,
                                   max(ctx.min_idle_ms, 1), [position for position, _ in entries]))
    finally:
        client.close()
    return done
