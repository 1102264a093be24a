"""History: re-read what a source still retains, without claiming or acknowledging anything.

Backfills (a time interval) and reprocess replays (published positions) read the source's
retained history here. The rows have the claim's shape (deltadrain.sources.valkey.claim), so decoding, the
transform and the MERGE are the drain's own; only the group's state is never touched.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime

from deltadrain.positions import StreamId
from deltadrain.run.stage import stage, task_rows
from deltadrain.sources.valkey.claim import ClaimContext, Entries, decoder_for, reader, record_batch
from deltadrain.sources.valkey.client import as_text

READ_CHUNK = 5_000


@dataclass(frozen=True)
class StreamRange:
    """Entries of `stream` with lo <= id <= hi (integer comparison), or only the given `ids`."""

    stream: str
    lo: str
    hi: str
    ids: tuple[str, ...] = ()


def interval_range(stream: str, start: datetime, end: datetime) -> StreamRange:
    """The stream ids of [start, end): a Valkey id's first half is its append time in ms."""
    lo_ms = int(start.timestamp() * 1000)
    hi_ms = int(end.timestamp() * 1000) - 1
    return StreamRange(stream, f"{lo_ms}-0", f"{hi_ms}-{2**64 - 1}")


def read_range(rng: StreamRange, ctx: ClaimContext) -> Iterator[Entries]:
    """Executor side: the entries in `rng` (claim shape, not claimed), read with XRANGE: the picked
    ids one by one (pipelined), or the whole id range page by page."""
    client = reader(ctx)
    for entries in (_picked(client, rng) if rng.ids else _pages(client, rng)):
        if entries:
            yield Entries.unparsed(rng.stream, entries)
    client.close()


def _picked(client, rng: StreamRange):
    """Scattered published ids (a reprocess) must not cost a scan of everything between them."""
    for start in range(0, len(rng.ids), READ_CHUNK):
        pipe = client.pipeline(transaction=False)
        for entry_id in rng.ids[start:start + READ_CHUNK]:
            pipe.xrange(rng.stream, min=entry_id, max=entry_id, count=1)
        yield [entry for found in pipe.execute() for entry in found]


def _pages(client, rng: StreamRange):
    cursor, hi = rng.lo, StreamId.parse(rng.hi)
    while True:
        entries = client.xrange(rng.stream, min=cursor, max=rng.hi, count=READ_CHUNK)
        yield entries
        if len(entries) < READ_CHUNK or StreamId.parse(entries[-1][0]) >= hi:
            return
        last = StreamId.parse(entries[-1][0])
        cursor = f"{last.ms}-{last.seq + 1}"  # exclusive start without the "(" syntax


def history_gaps(client, ranges: list[StreamRange]) -> list[dict]:
    """Parts of `ranges` the stream may no longer hold (`range_gaps`). Reported, never skipped in silence."""
    gaps = []
    for rng in ranges:
        try:
            info = client.xinfo_stream(rng.stream)
        except Exception as exc:
            if "no such key" in str(exc).lower():
                continue
            raise
        gaps.extend(range_gaps(rng, info))
    return gaps


def range_gaps(rng: StreamRange, info: dict) -> list[dict]:
    """What XINFO STREAM says of `rng`: trimmed (MAXLEN/MINID) before the first retained entry, and
    XDEL-deleted up to the highest deleted id after it. Both can hold at once: trimming does not
    move max-deleted-entry-id, so an XDEL in the retained part is reported beside the trim."""
    removed = int(info.get("entries-added", info["length"])) - int(info["length"])
    if removed <= 0:
        return []
    gaps = []
    lo, hi = StreamId.parse(rng.lo), StreamId.parse(rng.hi)
    if int(info["length"]) == 0:  # trimmed or deleted to empty: no first entry to go by (it reads 0-0)
        last = as_text(info.get("last-generated-id") or "0-0")
        if StreamId.parse(last) >= lo:
            gaps.append({"partition": rng.stream, "from": rng.lo, "to": str(min(StreamId.parse(last), hi)),
                         "reason": f"the stream holds no entries: all {removed} added up to {last} were trimmed "
                                   "or deleted"})
        return gaps
    first = as_text(info.get("recorded-first-entry-id") or "0-0")
    deleted = as_text(info.get("max-deleted-entry-id") or "0-0")
    first_id, deleted_id = StreamId.parse(first), StreamId.parse(deleted)
    if first_id > lo:
        upto = min(StreamId(first_id.ms, first_id.seq - 1) if first_id.seq else StreamId(first_id.ms - 1, 2**64 - 1), hi)
        gaps.append({"partition": rng.stream, "from": rng.lo, "to": str(upto),
                     "reason": f"the stream was trimmed (MAXLEN/MINID): its first retained entry is {first}, "
                               f"{removed} entries were deleted in all"})
    start = max(lo, first_id)
    if deleted_id >= start and start <= hi:
        gaps.append({"partition": rng.stream, "from": rng.lo if start == lo else str(start),
                     "to": str(min(deleted_id, hi)), "reason": f"entries up to {deleted} were deleted from the stream (XDEL)"})
    return gaps


def read_history(spark, ranges: list[StreamRange], ctx: ClaimContext, schema, staged: str):
    """The rows of `ranges`, read by one Spark task per range and staged to Parquet at `staged`. A task
    row names its range by index; the ranges themselves (a reprocess may pick thousands of ids) travel
    with the task's code, not as literals in the plan."""
    from pyspark.sql.types import IntegerType, StructField, StructType

    def produce(batches, arrow_schema):
        decoder = decoder_for(ctx, arrow_schema)
        for batch in batches:
            for task in batch.to_pylist():
                for chunk in read_range(ranges[task["range"]], ctx):
                    yield record_batch(chunk, decoder, arrow_schema)

    task_df = task_rows(spark, [(i,) for i in range(len(ranges))], StructType([StructField("range", IntegerType())]))
    return stage(task_df, produce, schema, ctx.id_field, staged).rows(spark)
