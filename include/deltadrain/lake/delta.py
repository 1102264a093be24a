"""Delta helpers: create tables, read the pipeline's txn version and commit metadata (from the log,
with delta-rs: no JVM call), classify errors."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import TypeVar

T = TypeVar("T")

CONFLICTS = ("ConcurrentTransactionException", "ConcurrentAppendException", "ConcurrentDeleteReadException",
             "ConcurrentDeleteDeleteException", "MetadataChangedException", "ProtocolChangedException",
             "ConcurrentWriteException", "DELTA_CONCURRENT", "DELTA_METADATA_CHANGED", "DELTA_PROTOCOL_CHANGED")
# How a broken CHECK or NOT NULL shows: the exception's class in a local driver, its error class (the
# class's name does not travel) through Spark Connect.
REFUSALS = ("DeltaInvariantViolationException", "DELTA_VIOLATE_CONSTRAINT_WITH_VALUES",
            "DELTA_NOT_NULL_CONSTRAINT_VIOLATED", "DELTA_NOT_NULL_NESTED_FIELD")


def is_conflict(exc: BaseException) -> bool:
    """A commit lost a race with another writer (Delta optimistic concurrency)."""
    text = f"{type(exc).__name__} {exc}"
    return any(name in text for name in CONFLICTS)


def conflict_line(exc: BaseException) -> str:
    """One line that names a lost commit race: the line of its text that names the conflict, not the
    "An error occurred while calling o80.sql" that py4j puts first in a local driver."""
    lines = f"{type(exc).__name__}: {exc}".splitlines()
    named = next((line for line in lines if any(name in line for name in CONFLICTS)), lines[0])
    return named.strip()[:300]


def refused_rows(exc: BaseException) -> str | None:
    """The table's own reason when a write broke one of its constraints (a CHECK or NOT NULL the
    operator added): no retry of the same rows can commit. None for any other error."""
    text = str(exc)
    if not any(name in f"{type(exc).__name__} {text}" for name in REFUSALS):
        return None
    start = max(text.find("[DELTA_"), 0)  # from Delta's error class on, past py4j's "calling o101" line
    return (text[start:].splitlines() or [""])[0].strip()[:500]


def row_constraints(spark, path: str) -> list[tuple[str, str]]:
    """(name, SQL condition every row must meet) per constraint the table holds rows to: its CHECK
    constraints and its top-level NOT NULL columns, named as Delta's refusal names them. Delta
    refuses a row whose CHECK is NULL as well as false."""
    detail = spark.sql(f"DESCRIBE DETAIL {table_ref(path)}").first()
    prefix = "delta.constraints."
    checks = [(f"CHECK constraint {key[len(prefix):]} ({cond})", cond)
              for key, cond in sorted((detail.properties or {}).items()) if key.startswith(prefix)]
    schema = spark.read.format("delta").load(path).schema
    not_null = [(f"NOT NULL constraint on column {f.name}", f"`{f.name}` IS NOT NULL")
                for f in schema.fields if not f.nullable]
    return checks + not_null


# Hadoop's words for a file whose side checksum (.NAME.crc) does not match it, and the file it names.
_CHECKSUM = re.compile(r"ChecksumException: Checksum error: (?:file:)?(?P<path>\S*/_delta_log/(?P<name>\d{20}\.json))")


def damaged_log(exc: BaseException) -> str | None:
    """What to do about a Delta commit file that fails Hadoop's checksum, or None for other errors.

    Before deltadrain's log store, two writers racing for one version could leave one's commit
    beside Hadoop's checksum of the other's, and every read of the table then fails (docs/operations.md)."""
    match = _CHECKSUM.search(str(exc))
    if match is None:
        return None
    path, name = match["path"], match["name"]
    crc = f"{path[: -len(name)]}.{name}.crc"
    return (f"the Delta table's commit {path} does not match Hadoop's checksum of it, {crc}. Two writers "
            f"racing for that version before deltadrain's log store leave exactly this: delete {crc} "
            f"(Hadoop's file, not Delta's {name[:-5]}.crc) and the table reads again; the commit that lost "
            f"the race is gone, and for a target table a backfill over its time heals the gap (docs/operations.md, "
            f"log store). If no such race can have happened, the disk damaged the commit: restore it instead")


def is_table(spark, path: str) -> bool:
    """Whether `path` holds a Delta table, read from its log (the session is not asked: kept for callers
    that hold one)."""
    return exists(path)


def sql_literal(value) -> str:
    """`value` as a Spark SQL literal, for the few places a value must stand in SQL text: Delta's MERGE
    does not take parameter markers, and its file skipping needs literals. Strings are escaped for
    Spark's parser (backslash escapes on), so no value can end the literal."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, datetime):
        if value.tzinfo is not None:
            value = value.astimezone(UTC).replace(tzinfo=None)
        return f"TIMESTAMP '{value.isoformat(sep=' ')}'"  # the sessions run in UTC (spark.DEFAULT_CONF)
    if isinstance(value, str):
        out = []
        for ch in value:
            if ch in "\\'":
                out.append("\\" + ch)
            elif ord(ch) < 0x20 or ord(ch) == 0x7F:
                out.append(f"\\u{ord(ch):04x}")
            else:
                out.append(ch)
        return "'" + "".join(out) + "'"
    raise TypeError(f"no SQL literal for {type(value).__name__}")


def sql_name(name: str) -> str:
    """A column name quoted for SQL text."""
    return "`" + name.replace("`", "``") + "`"


def table_ref(path: str) -> str:
    """A path-based Delta table reference in SQL text."""
    return "delta.`" + path.replace("`", "``") + "`"


def merge_into(spark, path: str, source, on: str, clauses: str, alias: str = "t", evolve: bool = False) -> None:
    """MERGE `source` (a DataFrame, as `s`) into the Delta table at `path` (as `alias`) ON `on` with the
    WHEN `clauses`, in SQL: the same statement in a local driver and through Spark Connect, where Delta's
    Python merge builder needs a server plug-in. The source is a temp view of this session only, named
    for this call. `evolve`: WITH SCHEMA EVOLUTION, for this statement only: the source's columns the
    table lacks are added, and a column Delta's type widening allows is widened."""
    import uuid

    view = f"_deltadrain_source_{uuid.uuid4().hex}"
    source.createOrReplaceTempView(view)
    try:
        evolution = " WITH SCHEMA EVOLUTION" if evolve else ""
        spark.sql(f"MERGE{evolution} INTO {table_ref(path)} {alias} USING {view} s ON {on} {clauses}")
    finally:
        spark.catalog.dropTempView(view)


CREATE_ATTEMPTS = 5


def ensure_table(spark, path: str, schema, partition_by: Sequence[str] = (), cluster_by: Sequence[str] = (),
                 properties: dict[str, str] | None = None) -> None:
    """Create the table if it is missing; two creators racing is fine (the loser takes the winner's).

    Existence is read from the log itself (`exists`), never from this session's cached view of the
    path. While another process creates the table, its `_delta_log` directory exists before its
    first commit does; Delta's CREATE TABLE takes such a directory for a table and fails with
    DELTA_TABLE_NOT_FOUND, and so it would forever after a creator that died there. So a plain
    table is created by writing no rows in "error if exists" mode, which goes by the commits; the
    CREATE TABLE is used only for what a write cannot declare (clustering, properties), and waits for
    a creator under way."""
    for attempt in range(CREATE_ATTEMPTS):
        if exists(path):
            return
        try:
            if cluster_by or properties:
                spark.sql(create_table_sql(path, schema, partition_by, cluster_by, properties))
            else:
                create_plain(spark, path, schema, partition_by)
            return
        except Exception:
            # Lost a creation race (DELTA_PATH_EXISTS, a conflict on version 0): the winner's table
            # is there. Or a creation is under way: its first commit lands soon. Else, raised.
            if exists(path):
                return
            if attempt == CREATE_ATTEMPTS - 1:
                raise
            time.sleep(0.5 * (attempt + 1))


def create_plain(spark, path: str, schema, partition_by: Sequence[str] = ()) -> None:
    """Create an empty table in "error if exists" mode: with delta-rs (no Spark job), else with Spark.
    Either way every column is nullable, as a Spark DataFrame write declares them, so the table is the
    same whichever made it."""
    try:
        import pyarrow as pa
        from deltalake import write_deltalake
        from pyspark.sql.pandas.types import to_arrow_schema

        from deltadrain.lake.objectstore import table_options

        arrow = pa.schema([nullable(f) for f in to_arrow_schema(schema)])
        write_deltalake(str(path), arrow.empty_table(), mode="error", partition_by=list(partition_by) or None,
                        storage_options=table_options(path))
        return
    except Exception:
        if exists(path):
            raise  # another creator won: ensure_table takes its table
    (spark.createDataFrame([], schema).write.format("delta").mode("error").partitionBy(*partition_by).save(path))


def nullable(field):
    """An Arrow field, and every field nested in it, nullable."""
    import pyarrow as pa

    t = field.type
    if pa.types.is_struct(t):
        t = pa.struct([nullable(t.field(i)) for i in range(t.num_fields)])
    elif pa.types.is_list(t) or pa.types.is_large_list(t):
        item = nullable(t.value_field)
        t = pa.list_(item) if pa.types.is_list(t) else pa.large_list(item)
    elif pa.types.is_map(t):
        t = pa.map_(t.key_type, nullable(t.item_field).type)
    return field.with_type(t).with_nullable(True)


def column_ddl(schema) -> str:
    """`schema`'s columns as CREATE TABLE declares them: quoted names, Spark's type strings, NOT NULL."""
    return ", ".join(f"{sql_name(f.name)} {f.dataType.simpleString()}{'' if f.nullable else ' NOT NULL'}"
                     for f in schema.fields)


def create_table_sql(path: str, schema, partition_by=(), cluster_by=(), properties: dict[str, str] | None = None) -> str:
    """CREATE TABLE IF NOT EXISTS for a path-based Delta table, as SQL (a local driver and Spark Connect alike)."""
    def names(columns) -> str:
        return ", ".join(map(sql_name, columns))

    text = f"CREATE TABLE IF NOT EXISTS {table_ref(path)} ({column_ddl(schema)}) USING delta"
    if partition_by:
        text += f" PARTITIONED BY ({names(partition_by)})"
    if cluster_by:
        text += f" CLUSTER BY ({names(cluster_by)})"
    if properties:
        text += " TBLPROPERTIES (" + ", ".join(f"{sql_literal(k)} = {sql_literal(v)}" for k, v in properties.items()) + ")"
    return text


def add_missing_columns(spark, path: str, schema) -> None:
    """Add to the table at `path` the columns of `schema` it lacks (nullable, at the end): a table an
    older deltadrain made gains the column a newer one writes, once and explicitly, not by appends
    with mergeSchema, which would let any later drift through. Racing adders are fine."""
    from pyspark.errors import AnalysisException

    def missing() -> list:
        have = set(spark.read.format("delta").load(path).columns)
        return [f for f in schema.fields if f.name not in have]

    wanted = missing()
    if not wanted:
        return
    from pyspark.sql.types import StructField, StructType

    columns = column_ddl(StructType([StructField(f.name, f.dataType, True) for f in wanted]))
    try:
        retry_conflicts(lambda: spark.sql(f"ALTER TABLE {table_ref(path)} ADD COLUMNS ({columns})"))
    except AnalysisException:
        if missing():  # else another writer added them first
            raise


def _log(path: str):
    """The table's latest snapshot, read from its log by delta-rs in this process (no JVM, no Spark
    job), or None when no commit is there yet. Opened afresh on every call: a writer in another
    process may have committed since."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    from deltadrain.lake.objectstore import table_options

    try:
        return DeltaTable(str(path), storage_options=table_options(path))
    except TableNotFoundError:
        return None


def exists(path: str) -> bool:
    """Whether a table is at `path` now, read from its log (a session's cached view may be stale):
    a commit there, without loading the table's state (the commit checks this on every try)."""
    from deltalake import DeltaTable

    from deltadrain.lake.objectstore import table_options

    return DeltaTable.is_deltatable(str(path), storage_options=table_options(path))


def read_arrow(path: str, columns: list[str], where=None):
    """The rows of the table at `path` as a pyarrow Table of `columns`, read by delta-rs in this process (no
    Spark job), restricted by the pyarrow expression `where` (delta-rs skips the files whose statistics it
    excludes); None without a table."""
    log = _log(path)
    if log is None:
        return None
    return log.to_pyarrow_dataset().to_table(columns=columns, filter=where)


def append_arrow(path: str, table, create=None) -> None:
    """Append a pyarrow Table to the table at `path` with delta-rs, cast to the table's own schema (Spark's
    writes leave every column nullable). A blind append: it never conflicts with another writer. Without a
    table, `create` (a pyarrow schema) is the schema the append creates it with, every column nullable as
    Spark's creation leaves them; two creators racing: the loser's commit fails and its retry appends."""
    import pyarrow as pa
    from deltalake import write_deltalake

    from deltadrain.lake.objectstore import table_options

    log = _log(path)  # opened with the store's options, which the write reuses
    if log is not None:
        schema = pa.schema(log.schema().to_arrow())
        write_deltalake(log, table.select(schema.names).cast(schema), mode="append")
        return
    if create is None:
        raise FileNotFoundError(f"no Delta table at {path}")
    schema = pa.schema([nullable(f) for f in create])
    rows = table.select(schema.names).cast(schema)
    retry_conflicts(lambda: append_arrow(path, rows) if exists(path) else
                    write_deltalake(path, rows, mode="append", storage_options=table_options(path)),
                    extra=("CommitFailedError",))


def append_rows(path: str, schema, rows: list[tuple]) -> None:
    """Append a few rows built on the driver (`schema`: a Spark StructType) with delta-rs: no Spark job,
    and the first append creates the table. Raises what delta-rs raises (a table with a column the rows
    lack, or a feature delta-rs cannot write): the caller then appends through Spark."""
    import pyarrow as pa
    from deltalake import write_deltalake
    from pyspark.sql.pandas.types import to_arrow_schema

    from deltadrain.lake.objectstore import table_options

    arrow_schema = to_arrow_schema(schema)
    table = pa.Table.from_pylist([dict(zip(arrow_schema.names, row, strict=True)) for row in rows], schema=arrow_schema)
    # delta-rs retries a blind append itself; CommitFailedError is left when another writer created
    # the table first (its commit did not land, so trying again appends exactly once). On S3 a commit
    # is put only if absent, as the Spark log store does (table_options).
    options = table_options(path)
    retry_conflicts(lambda: write_deltalake(path, table, mode="append", storage_options=options),
                    extra=("CommitFailedError",))


def inserted_rows(metrics: dict) -> int:
    """Rows a batch commit inserted: a MERGE's numTargetRowsInserted, or numOutputRows of the append
    that created the table with its first batch."""
    return int(metrics.get("numTargetRowsInserted", metrics.get("numOutputRows", 0)))


def changed_rows(metrics: dict) -> int:
    """Rows an upsert MERGE inserted, updated or deleted, or numOutputRows of the append that created the
    table with its first batch."""
    if "numOutputRows" in metrics and not any(k.startswith("numTargetRows") for k in metrics):
        return int(metrics["numOutputRows"])
    return sum(int(metrics.get(f"numTargetRows{what}", 0)) for what in ("Inserted", "Updated", "Deleted"))


def file_count(path: str) -> int | None:
    """How many data files the table's latest snapshot has (None without a table)."""
    log = _log(path)
    return len(log.file_uris()) if log is not None else None


def table_version(path: str) -> int | None:
    """The latest table version."""
    log = _log(path)
    return log.version() if log is not None else None


def table_id(path: str) -> str | None:
    """The table's Delta id (its metaData id): a table deleted and created again at the same path has
    another one, so records kept about the old table's batches are not taken for the new one's."""
    log = _log(path)
    return log.metadata().id if log is not None else None


def snapshot_txn(path: str, app_id: str) -> tuple[int | None, int | None]:
    """(txn version of `app_id`, table version) from the latest snapshot.

    SetTransaction actions are kept in Delta checkpoints, so this survives log cleanup.
    """
    log = _log(path)
    if log is None:
        return None, None
    return log.transaction_version(app_id), log.version()


def of_table(copies, table: str | None):
    """The quarantine rows (`copies`) moved out of the target table whose Delta id is `table`, and
    those from before rows named their table (null): not the rows of another table of the same
    name, deleted since (its batches and positions may come again in the new one)."""
    from pyspark.sql import functions as F

    if table is None or "_dq_table_id" not in copies.columns:
        return copies
    return copies.where(F.col("_dq_table_id").isNull() | (F.col("_dq_table_id") == F.lit(table)))


def recent_commits(path: str, limit: int = 100, since: datetime | None = None) -> list[dict]:
    """The last commits' version, operation, metrics and parsed userMetadata (newest first); with
    `since`, only those made at or after it (the answer stops at the first older one).

    Read from the newest commit files by delta-rs: the drain reads them twice per run, and Delta's
    DeltaTable.history() plans and runs a Spark job for it. commitInfo lives only in commit files,
    which log cleanup may remove; the answer stops at the first one missing, and callers must cope
    with an empty answer.
    """
    log = _log(path)
    if log is None:
        return []
    out = []
    expected = log.version()
    for info in log.history(limit):
        if info.get("version") != expected:  # a commit file cleaned up: no older commitInfo is read
            break
        expected -= 1
        commit = commit_info(info)
        if since is not None and commit["timestamp"] is not None and commit["timestamp"] < since:
            break
        out.append({"version": info["version"], **commit})
    return out


def commit_info(info: dict) -> dict:
    """A commit's commitInfo -> its operation, metrics, userMetadata (parsed; None when it is not JSON)
    and time (the in-commit timestamp when the table keeps them)."""
    try:
        meta = json.loads(info["userMetadata"]) if info.get("userMetadata") else None
    except ValueError:
        meta = None
    millis = info.get("inCommitTimestamp") or info.get("timestamp")
    return {"operation": info.get("operation"), "metrics": info.get("operationMetrics") or {}, "meta": meta,
            "timestamp": datetime.fromtimestamp(millis / 1000, UTC) if millis is not None else None}


def retry_conflicts(action: Callable[[], T], attempts: int = 5, pause: float = 0.5, extra: tuple[str, ...] = ()) -> T:
    """Run a Delta write, retrying when it lost a race (for idempotent writes only). `extra`: more
    error names that mean a lost race for this write."""
    for attempt in range(attempts):
        try:
            return action()
        except Exception as exc:
            lost = is_conflict(exc) or any(name in f"{type(exc).__name__} {exc}" for name in extra)
            if not lost or attempt == attempts - 1:
                raise
            time.sleep(pause * (attempt + 1))
    raise AssertionError("unreachable")
