"""Stage: the tasks that claim and decode a batch write its rows to Parquet, and report what they wrote.

One Spark job per batch does the source's work (XAUTOCLAIM/XREADGROUP, a Kafka offset range, a
history read), the decoding and the writing; a small Valkey claim runs the same body in the drain's
own process instead (`stage_here`). Each task writes its rows with pyarrow (no row
conversion and Parquet encoding in the JVM) and returns one small report per source partition:
counts, the oldest source time, the highest position, the id range and 64-bit hashes of the ids.
From those the driver knows the run summary, the positions and `BatchStats` without another pass
over the rows, and the later steps read the staged files, never the source again (a claim must
run exactly once).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from deltadrain.formats.changes import CHANGE, DELETE, ORDER, TRUNCATE
from deltadrain.positions import StreamId


@dataclass(frozen=True)
class BatchStats:
    """What `Drain.publish` must know about a batch before its MERGE. The staging reports give it
    under the identity transform; otherwise the transform pass (`Drain._rows`) counts the
    transformed rows."""

    good: int  # rows to offer the MERGE
    distinct: int  # distinct ids among them (a lower bound when counted by hash: see `unique`)
    lo: str | None  # their lowest and highest id
    hi: str | None
    bad: int | None  # rows for the DLQ; None when not counted yet
    # Upsert mode, counted by the staging: (deletes, truncates, changes without an order value) among the rows
    changes: tuple[int, int, int] | None = None

    @classmethod
    def of(cls, row) -> BatchStats:
        """From a Spark aggregate row (`drain.batch_stats_columns`)."""
        bad = None if row._dd_bad is None else int(row._dd_bad)
        return cls(int(row._dd_good or 0), int(row._dd_distinct or 0), row._dd_lo, row._dd_hi, bad)

    @property
    def id_range(self) -> tuple[str, str] | None:
        return (self.lo, self.hi) if self.lo is not None and self.hi is not None else None

    @property
    def unique(self) -> bool:
        """No id twice: the MERGE needs no in-batch dedup (a shuffle and sort). Distinct hashes mean
        distinct ids; a hash collision only costs a dedup that was not needed."""
        return self.distinct == self.good


def id_hashes(ids) -> bytes:
    """Stable 64-bit hashes of an Arrow array of ids (the same in every Python worker, unlike
    Python's own salted hash)."""
    import numpy as np
    import pandas as pd

    if len(ids) == 0:
        return b""
    return pd.util.hash_array(ids.to_numpy(zero_copy_only=False)).astype(np.uint64).tobytes()


@dataclass
class Tally:
    """One source partition's rows in one task (or, summed, in the whole batch)."""

    rows: int = 0
    reclaimed: int = 0  # Valkey: taken over with XAUTOCLAIM
    again: int = 0  # delivered or read before (attempts > 1)
    gaps: int = 0  # markers of entries deleted before they were read
    bad: int = 0  # rows for the DLQ
    good: int = 0
    oldest: datetime | None = None  # of the good rows
    pos: StreamId | None = None  # highest position, gap markers included
    id_lo: str | None = None
    id_hi: str | None = None
    hashes: list = field(default_factory=list)  # bytes of uint64 hashes of the good rows' ids
    # Upsert mode's good rows (deltadrain.run.apply_upsert.Survey): deletes, truncates, changes without an order value
    deletes: int = 0
    truncates: int = 0
    unordered: int = 0

    def add(self, other: Tally) -> None:
        self.rows += other.rows
        self.reclaimed += other.reclaimed
        self.again += other.again
        self.gaps += other.gaps
        self.bad += other.bad
        self.good += other.good
        self.oldest = _least(self.oldest, other.oldest)
        self.pos = _greatest(self.pos, other.pos)
        self.id_lo = _least(self.id_lo, other.id_lo)
        self.id_hi = _greatest(self.id_hi, other.id_hi)
        self.hashes += other.hashes
        self.deletes += other.deletes
        self.truncates += other.truncates
        self.unordered += other.unordered


def _as_datetime(scalar) -> datetime | None:
    """A timestamp scalar as a datetime. Outside Python's years 1 to 9999 (an explicit stream id, a
    Kafka CreateTime set in microseconds): past them datetime.max, before them None (no window). Either
    way the MERGE's window starts no later than the true oldest time, which only widens it."""
    try:
        return scalar.as_py()
    except (OverflowError, ValueError):
        return datetime.max.replace(tzinfo=UTC) if scalar.value > 0 else None


def _least(a, b):
    return b if a is None else a if b is None else min(a, b)


def _greatest(a, b):
    return b if a is None else a if b is None else max(a, b)


def tally(batch, id_field: str) -> Iterator[tuple[str, Tally]]:
    """(partition, Tally) for each source partition in one record batch of the claim schema."""
    import pyarrow.compute as pc

    parts = batch.column("_dd_partition")
    values = pc.unique(parts).to_pylist()
    for value in values:
        sub = batch if len(values) == 1 else batch.filter(pc.equal(parts, value))
        error = sub.column("_dd_error_type")
        good = pc.is_null(error)
        gaps = pc.fill_null(pc.equal(error, "gap"), False).true_count
        ids = pc.drop_null(pc.filter(sub.column(id_field), good))
        his = sub.column("_dd_pos_hi")
        top = pc.max(his).as_py()
        t = Tally(rows=sub.num_rows, reclaimed=pc.fill_null(sub.column("_dd_reclaimed"), False).true_count,
                  again=pc.fill_null(pc.greater(sub.column("_dd_attempts"), 1), False).true_count, gaps=gaps,
                  good=good.true_count, bad=sub.num_rows - good.true_count - gaps,
                  oldest=_as_datetime(pc.min(pc.filter(sub.column("_dd_source_ts"), good))),
                  pos=StreamId(top, pc.max(pc.filter(sub.column("_dd_pos_lo"), pc.equal(his, top))).as_py()),
                  hashes=[id_hashes(ids)])
        if len(ids):
            bounds = pc.min_max(ids).as_py()
            t.id_lo, t.id_hi = bounds["min"], bounds["max"]
        if CHANGE in sub.schema.names:
            change = pc.filter(sub.column(CHANGE), good)
            t.deletes = pc.equal(change, DELETE).true_count
            t.truncates = pc.equal(change, TRUNCATE).true_count
            t.unordered = pc.and_(pc.is_null(pc.filter(sub.column(ORDER), good)),
                                  pc.not_equal(change, TRUNCATE)).true_count
        yield value, t


class StagingFile:
    """Executor side: one task's staging file, a context manager. `write` the claim record batches
    inside it; after a clean exit its report rows (`report_arrow_schema`, one per source partition)
    are in `report`. The file is renamed into place only when complete: a failed task attempt's file
    is never named in a report, so never read.

    With `store` (objectstore.S3Settings) the directory is an s3a:// URL and the file is written there
    through pyarrow: an object appears whole when its upload completes, and needs no rename (which S3
    does not have)."""

    def __init__(self, directory: str, arrow_schema, id_field: str, store=None):
        self.directory, self.arrow_schema, self.id_field, self.store = directory, arrow_schema, id_field, store
        self.tallies: dict[str, Tally] = {}
        self.path: str | None = None
        self._writer: Any = None  # a pyarrow ParquetWriter once the first batch came

    def write(self, batch) -> None:
        import pyarrow.parquet as pq

        if batch.num_rows == 0:
            return
        if self._writer is None and self.store is not None:
            from deltadrain.lake.objectstore import LakeUrl, pyarrow_filesystem

            self.path = f"{self.directory}/part-{uuid.uuid4().hex}.parquet"
            self._writer = pq.ParquetWriter(LakeUrl(self.path).fs_path(), self.arrow_schema,
                                            filesystem=pyarrow_filesystem(self.store))
        elif self._writer is None:
            os.makedirs(self.directory, exist_ok=True)
            self.path = os.path.join(self.directory, f"part-{uuid.uuid4().hex}.parquet")
            self._writer = pq.ParquetWriter(self.path + ".tmp", self.arrow_schema)
        self._writer.write_batch(batch)
        for part, t in tally(batch, self.id_field):
            self.tallies.setdefault(part, Tally()).add(t)

    def __enter__(self) -> StagingFile:
        return self

    def __exit__(self, kind, value, traceback) -> None:
        """Close the writer; put the file in place only when no error left the block."""
        if self._writer is None:
            return
        self._writer.close()
        self._writer = None
        if kind is None and self.store is None and self.path is not None:  # the path came with the writer
            os.replace(self.path + ".tmp", self.path)

    @property
    def report(self) -> list[dict]:
        return report_rows(self.path, self.tallies) if self.path is not None else []


def write_and_report(batches: Iterable, directory: str, arrow_schema, id_field: str, store=None) -> Iterator:
    """Executor side: write the claim record batches to one staging file (`StagingFile`) in
    `directory` (on the object store `store`, if given) and yield its report."""
    import pyarrow as pa

    with StagingFile(directory, arrow_schema, id_field, store) as staging:
        for batch in batches:
            staging.write(batch)
    report = staging.report
    if report:
        yield pa.RecordBatch.from_pylist(report, schema=report_arrow_schema())


def open_staged(path: str):
    """A staged file (a report's `file`), for pyarrow to read in the driver: local, or on the object store."""
    import pyarrow.parquet as pq

    from deltadrain.lake.objectstore import LakeUrl, is_s3_url, pyarrow_filesystem, store_settings

    if not is_s3_url(path):
        return pq.ParquetFile(path)
    return pq.ParquetFile(LakeUrl(path).fs_path(), filesystem=pyarrow_filesystem(store_settings(path)))


def report_rows(path: str, tallies: dict[str, Tally]) -> list[dict]:
    """The report (`report_arrow_schema`) of one staged file: a row per source partition."""
    return [{"file": path, "partition": part, "rows": t.rows, "reclaimed": t.reclaimed, "again": t.again,
             "gaps": t.gaps, "bad": t.bad, "good": t.good, "oldest": t.oldest,
             "pos_hi": t.pos.ms if t.pos else None, "pos_lo": t.pos.seq if t.pos else None,
             "id_lo": t.id_lo, "id_hi": t.id_hi, "id_hashes": b"".join(t.hashes), "deletes": t.deletes,
             "truncates": t.truncates, "unordered": t.unordered} for part, t in tallies.items()]


def report_arrow_schema():
    """What a task reports per source partition (Spark's schema for it is derived from this one)."""
    import pyarrow as pa

    return pa.schema([("file", pa.string()), ("partition", pa.string()), ("rows", pa.int64()),
                      ("reclaimed", pa.int64()), ("again", pa.int64()), ("gaps", pa.int64()), ("bad", pa.int64()),
                      ("good", pa.int64()), ("oldest", pa.timestamp("us", tz="UTC")), ("pos_hi", pa.int64()),
                      ("pos_lo", pa.int64()), ("id_lo", pa.string()), ("id_hi", pa.string()),
                      ("id_hashes", pa.binary()), ("deletes", pa.int64()), ("truncates", pa.int64()),
                      ("unordered", pa.int64())])


@dataclass
class Staged:
    """A staged batch: its files, what each source partition holds, and the batch's totals."""

    files: list[str]
    partitions: dict[str, Tally]
    total: Tally
    schema: object = None  # the Spark schema the rows were staged with (claim schema)
    here: bool = False  # staged by this process (`stage_batches`): its files are readable here

    @classmethod
    def of(cls, reports: Iterable) -> Staged:
        """Sum the task reports (Spark rows, or anything with the report's fields as attributes)."""
        files: set[str] = set()
        partitions: dict[str, Tally] = {}
        for r in reports:
            files.add(r.file)
            pos = StreamId(r.pos_hi, r.pos_lo) if r.pos_hi is not None else None
            t = Tally(rows=r.rows, reclaimed=r.reclaimed, again=r.again, gaps=r.gaps, bad=r.bad, good=r.good,
                      oldest=r.oldest, pos=pos, id_lo=r.id_lo, id_hi=r.id_hi, hashes=[bytes(r.id_hashes or b"")],
                      deletes=r.deletes, truncates=r.truncates, unordered=r.unordered)
            partitions.setdefault(r.partition, Tally()).add(t)
        return cls.summed(files, partitions)

    @classmethod
    def combine(cls, parts: list[Staged]) -> Staged:
        """Several staged shares of one batch (of one schema) as one."""
        files: set[str] = set()
        partitions: dict[str, Tally] = {}
        for part in parts:
            files.update(part.files)
            for name, t in part.partitions.items():
                partitions.setdefault(name, Tally()).add(t)
        staged = cls.summed(files, partitions)
        staged.schema = parts[0].schema if parts else None
        staged.here = bool(parts) and all(part.here for part in parts)
        return staged

    @classmethod
    def summed(cls, files: set[str], partitions: dict[str, Tally]) -> Staged:
        total = Tally()
        for t in partitions.values():
            total.add(t)
        return cls(sorted(files), partitions, total)

    @property
    def positions(self) -> dict[str, str]:
        """Per partition, the highest position staged."""
        return {part: str(t.pos) for part, t in self.partitions.items() if t.pos is not None}

    def stats(self) -> BatchStats:
        import numpy as np

        hashes = np.frombuffer(b"".join(self.total.hashes), dtype=np.uint64)
        t = self.total
        return BatchStats(t.good, int(np.unique(hashes).size), t.id_lo, t.id_hi, t.bad,
                          changes=(t.deletes, t.truncates, t.unordered))

    def rows(self, spark):
        """The staged rows as a DataFrame of the schema they were staged with."""
        if not self.files:
            return spark.createDataFrame([], self.schema)
        return spark.read.schema(self.schema).parquet(*self.files)

    def table(self):
        """The staged rows read by pyarrow in this process (no Spark job), in the Arrow types of the schema they
        were staged with. For a batch staged `here` only: a Spark task's file may be on an executor's disk."""
        import pyarrow as pa
        from pyspark.sql.pandas.types import to_arrow_schema

        assert self.here, "a batch staged by Spark tasks is read by Spark"
        schema = to_arrow_schema(self.schema)
        if not self.files:
            return schema.empty_table()
        return pa.concat_tables([open_staged(f).read().select(schema.names).cast(schema) for f in self.files])


def task_rows(spark, rows: list[tuple], schema):
    """`rows` (of StructType `schema`) as a DataFrame of one row per partition, so that each is a Spark
    task of its own and all run at once. Built from literals, not an RDD: a Spark Connect client has
    no SparkContext."""
    from pyspark.sql import functions as F

    if not rows:
        return spark.createDataFrame([], schema)
    structs = [F.struct(*[F.lit(value).cast(f.dataType).alias(f.name) for value, f in zip(row, schema.fields,
                                                                                         strict=True)])
               for row in rows]
    # spark.range splits n ids over n partitions one each.
    return (spark.range(0, len(rows), 1, len(rows))
            .select(F.element_at(F.array(*structs), (F.col("id") + 1).cast("int")).alias("task")).select("task.*"))


def stage(tasks, produce, schema, id_field: str, directory: str) -> Staged:
    """Run `produce` (input record batches -> claim record batches; a mapInArrow body) over the
    `tasks` DataFrame in one Spark job whose tasks stage their rows in `directory`. An s3a:// directory
    is written with the login the driver found (objectstore.settings_for): it travels to the tasks with
    this function, as a source's connection does, never on a command line."""
    from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

    from deltadrain.lake.objectstore import settings_for

    arrow_schema = to_arrow_schema(schema)
    store = settings_for(directory)

    def body(batches):
        yield from write_and_report(produce(batches, arrow_schema), directory, arrow_schema, id_field, store)

    staged = Staged.of(tasks.mapInArrow(body, from_arrow_schema(report_arrow_schema())).collect())
    staged.schema = schema
    return staged


def stage_here(tasks: list[dict], produce, schema, id_field: str, directory: str, threads: int = 1) -> Staged:
    """`stage`'s job run in this process instead of Spark's: the same body over the same task rows. For a
    small batch a Spark job's fixed cost is most of the claim: on a Connect server each session starts a
    Python worker daemon of its own and imports the claim's modules in it (bench/claim_here/README.md).
    Here nothing can run the claim a second time either: there is no job to recompute. With `threads` > 1
    the tasks run on that many threads, each task staging a file of its own as a Spark task does; the
    server's reads, the JSON decode and the Parquet writes release the GIL."""
    import pyarrow as pa

    if threads <= 1 or len(tasks) <= 1:
        return stage_batches(iter([pa.RecordBatch.from_pylist(tasks)] if tasks else []), produce, schema, id_field,
                             directory)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(min(threads, len(tasks)), thread_name_prefix="deltadrain-claim") as pool:
        parts = list(pool.map(lambda task: stage_batches(iter([pa.RecordBatch.from_pylist([task])]), produce,
                                                         schema, id_field, directory), tasks))
    return Staged.combine(parts)


def stage_batches(batches: Iterable, produce, schema, id_field: str, directory: str) -> Staged:
    """`produce` over input record batches read in this process (a Kafka range's records, the task
    rows of `stage_here`), staged in one file of `directory` as a Spark task stages its share."""
    from types import SimpleNamespace

    from pyspark.sql.pandas.types import to_arrow_schema

    from deltadrain.lake.objectstore import settings_for

    arrow_schema = to_arrow_schema(schema)
    reports = [SimpleNamespace(**row)
               for out in write_and_report(produce(batches, arrow_schema), directory, arrow_schema, id_field,
                                           settings_for(directory))
               for row in out.to_pylist()]
    staged = Staged.of(reports)
    staged.schema, staged.here = schema, True
    return staged
