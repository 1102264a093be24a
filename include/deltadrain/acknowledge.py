"""Acknowledge (after the commit) or release (after a lost race) the claimed entries, in Spark tasks.

Only entries of a committed batch are acknowledged (invariants 4 and 5). A release hands the
entries back for immediate re-claiming: XCLAIM ... IDLE <min_idle_ms> JUSTID makes them look idle
long enough for the next drain's XAUTOCLAIM, without counting a delivery.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterable, Iterator

from deltadrain import failpoints
from deltadrain.claim import ClaimContext, _client, failure_field

CHUNK = 1_000


def _by_stream(rows: Iterable) -> dict[str, list]:
    grouped: dict[str, list] = defaultdict(list)
    for row in rows:
        grouped[row[0]].append(row)
    return grouped


def _ack_task(rows: Iterator, ctx: ClaimContext, driver_pid: int) -> Iterator[int]:
    client = _client(ctx)
    done = 0
    for stream, items in _by_stream(rows).items():
        for start in range(0, len(items), CHUNK):
            chunk = items[start:start + CHUNK]
            pipe = client.pipeline(transaction=False)
            pipe.xack(stream, ctx.group, *[r[1] for r in chunk])
            retried = [failure_field(stream, r[1]) for r in chunk if r[2] > 1]
            if retried:
                pipe.hdel(ctx.failures_key, *retried)
            done += pipe.execute()[0]
            if failpoints.armed("during_ack"):  # the whole job dies here: driver, then this task
                failpoints.hit("during_ack", driver_pid)
                failpoints.hit("during_ack")
    client.close()
    yield done


def _release_task(rows: Iterator, ctx: ClaimContext) -> Iterator[int]:
    client = _client(ctx)
    done = 0
    for stream, items in _by_stream(rows).items():
        for start in range(0, len(items), CHUNK):
            ids = [r[1] for r in items[start:start + CHUNK]]
            done += len(client.xclaim(stream, ctx.group, ctx.consumer, 0, ids, idle=max(ctx.min_idle_ms, 1),
                                      justid=True))
    client.close()
    yield done


def _in_tasks(df, task) -> int:
    """Run `task` over the (partition, position, attempts) rows of `df` in Spark tasks; rows cross
    to Python column-wise (Arrow), not pickled one by one. Returns the sum of what the tasks count."""
    import pyarrow as pa
    from pyspark.sql import functions as F

    def body(batches):
        def rows():
            for batch in batches:
                yield from zip(*(batch.column(i).to_pylist() for i in range(3)), strict=True)

        for done in task(rows()):
            yield pa.RecordBatch.from_pydict({"done": pa.array([done], pa.int64())})

    out = df.select("_dd_partition", "_dd_position", "_dd_attempts").mapInArrow(body, "done long")
    return int(out.agg(F.sum("done")).first()[0] or 0)


def acknowledge(df, ctx: ClaimContext) -> int:
    """XACK every entry in `df` (columns _dd_partition, _dd_position, _dd_attempts)."""
    pid = os.getpid()
    return _in_tasks(df, lambda rows: _ack_task(rows, ctx, pid))


def release(df, ctx: ClaimContext) -> int:
    return _in_tasks(df, lambda rows: _release_task(rows, ctx))
