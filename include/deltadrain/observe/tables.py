"""Read-only, JVM-free reads of deltadrain's Delta tables, for the Airflow view (delta-rs).

The view runs inside Airflow's API server, which must not start a Spark JVM per request. delta-rs
reads the Spark-written tables directly; its pyarrow-dataset path refuses tables with deletion
vectors, so every read here goes through its DataFusion QueryBuilder, which applies them.

Results are cached per table version: a page reload on an idle pipeline only lists the log.
SQL text holds table names and validated pipeline names only (config.NAME); user input is never
spliced into it — selections are matched in Python (see `dead_letter_keys`).
"""

from __future__ import annotations

import json
import threading
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

from deltadrain.config import DeltadrainConfig, PipelineConfig
from deltadrain.lake.checkpoint import Checkpoint, carries_batch
from deltadrain.lake.deadletter import DEAD, REPLAYED
from deltadrain.lake.delta import inserted_rows
from deltadrain.lake.metrics import metrics_path

PREVIEW_BYTES = 120
_cache: dict[tuple, list[dict]] = {}
_cache_lock = threading.Lock()
_CACHE_MAX = 256
HISTORY = 100  # the most commits any read here looks back over (recorded_gaps)
_opened: ContextVar[dict | None] = ContextVar("deltadrain_lakeview_opened", default=None)


@contextmanager
def one_read():
    """Within it, each table is opened once: a page's data reads share one snapshot of it, and the
    log is listed once per table, not once per read (bench/view_reads/view_reads.py). Its history is read once
    too, from a table opened for it (`history`)."""
    token = _opened.set({})
    try:
        yield
    finally:
        _opened.reset(token)


def _once(key, make):
    """make(), or within one_read what it gave there for `key` the first time."""
    opened = _opened.get()
    if opened is None:
        return make()
    if key not in opened:
        opened[key] = make()
    return opened[key]


def _open(path: str):
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    from deltadrain.lake.objectstore import table_options

    try:
        return DeltaTable(path, storage_options=table_options(path))
    except TableNotFoundError:
        return None


def open_table(path: str):
    """The table at `path`, or None when there is none yet (within one_read, as first opened there)."""
    return _once(path, lambda: _open(path))


def history(path: str, limit: int = HISTORY) -> list[dict]:
    """The newest `limit` commits of the table at `path`, newest first ([] when there is none), from a
    table opened just for it: delta-rs lists the commits made after an older snapshot but numbers
    them down from that snapshot's version. Within one_read, read once per table and limit."""
    def read() -> list[dict]:
        table = _open(path)
        return table.history(limit) if table is not None else []

    return _once(("history", path, limit), read)


def query(table, sql: str, name: str = "t") -> list[dict]:
    """Rows of `sql` over `table` (registered as `name`), cached per table version."""
    import pyarrow as pa
    from deltalake import QueryBuilder

    key = (table.table_uri, table.version(), name, sql)
    with _cache_lock:
        if key in _cache:
            return _cache[key]
    rows = pylist(pa.RecordBatchReader.from_stream(QueryBuilder().register(name, table).execute(sql)).read_all())
    with _cache_lock:
        if len(_cache) >= _CACHE_MAX:
            _cache.clear()
        _cache[key] = rows
    return rows


def pylist(rows) -> list[dict]:
    """An Arrow table's rows as dicts, UTC times as aware datetimes. Arrow's own conversion of a time
    with a zone imports pandas (0.3 s or more, a third of a CLI read); these are converted without a
    zone and given UTC here."""
    import pyarrow as pa

    utc = [f.name for f in rows.schema if pa.types.is_timestamp(f.type) and f.type.tz in ("UTC", "+00:00")]
    if not utc:
        return rows.to_pylist()
    plain = rows.cast(pa.schema([f.with_type(pa.timestamp(f.type.unit)) if f.name in utc else f for f in rows.schema]))
    out = plain.to_pylist()
    for row in out:
        for name in utc:
            if row[name] is not None:
                row[name] = row[name].replace(tzinfo=UTC)
    return out


def _sql_literal(name: str) -> str:
    from deltadrain.config import NAME

    if not NAME.match(name):  # pipeline names are validated at load; keep it impossible to splice anything else
        raise ValueError(f"not a pipeline name: {name!r}")
    return f"'{name}'"


def data_files(cfg: DeltadrainConfig, pipeline: PipelineConfig) -> dict[str, int | None]:
    """Data files in the current snapshot of the target and the DLQ (None: no table yet): every batch
    adds some, and the maintenance DAG compacts them."""
    counts: dict[str, int | None] = {}
    for name, path in (("target", cfg.target_path(pipeline)), ("dlq", cfg.dlq_path(pipeline))):
        table = open_table(str(path))
        counts[name] = len(table.file_uris()) if table is not None else None
    return counts


def published_count(cfg: DeltadrainConfig, pipeline: PipelineConfig) -> int:
    table = open_table(str(cfg.target_path(pipeline)))
    return int(query(table, "SELECT count(*) AS n FROM t")[0]["n"]) if table is not None else 0


def dlq_counts(cfg: DeltadrainConfig, pipeline: PipelineConfig) -> dict[str, int]:
    table = open_table(str(cfg.dlq_path(pipeline)))
    counts = {DEAD: 0, REPLAYED: 0}
    if table is not None:
        for r in query(table, "SELECT state, count(*) AS n FROM t GROUP BY state"):
            counts[r["state"]] = int(r["n"])
    return counts


def dead_count_at(cfg: DeltadrainConfig, pipeline: PipelineConfig, at: datetime) -> int:
    """The DEAD dead letters the pipeline's DLQ table held at `at`, from its history: the newest commit
    made by then (0 when the table was made after it). Older than the HISTORY commits read here, delta-rs
    finds the version by time itself."""
    from deltalake import DeltaTable

    path = str(cfg.dlq_path(pipeline))
    commits = history(path)
    if not commits:
        return 0
    at_ms = at.timestamp() * 1000
    made = [c for c in commits if c.get("timestamp", 0) <= at_ms]
    if made:
        table = DeltaTable(path, version=made[0]["version"])
    elif commits[-1].get("version") == 0:
        return 0  # the table's first commit came after `at`
    else:
        table = DeltaTable(path)
        table.load_as_version(at)
    return int(query(table, "SELECT count(*) AS n FROM t WHERE state = 'DEAD'")[0]["n"])


def preview(original: bytes | None) -> str | None:
    """The first bytes of a payload as text (undecodable bytes replaced); escaping is the template's job."""
    if original is None:
        return None
    text = bytes(original[:PREVIEW_BYTES]).decode("utf-8", "replace")
    return text + ("…" if len(original) > PREVIEW_BYTES else "")


def dead_letters(cfg: DeltadrainConfig, pipeline: PipelineConfig, state: str | None = DEAD,
                 limit: int = 100) -> list[dict]:
    """DLQ entries, newest failure first, with a truncated payload preview instead of the bytes."""
    table = open_table(str(cfg.dlq_path(pipeline)))
    if table is None:
        return []
    where = {DEAD: "WHERE state = 'DEAD'", REPLAYED: "WHERE state = 'REPLAYED'", None: ""}[state]
    # Only constants and an int go into the text.
    rows = query(table, "SELECT partition, position, pos_hi, pos_lo, message_id, original, error, error_type, "  # noqa: S608
                        "attempts, first_failure_at, last_failure_at, state, batch, replayed_at, replay_run_id "
                        f"FROM t {where} ORDER BY last_failure_at DESC, partition, pos_hi, pos_lo "
                        f"LIMIT {int(limit)}")
    out = []
    for r in rows:
        item = dict(r)
        original = item.pop("original")
        item["payload_preview"] = preview(original)
        item["payload_bytes"] = len(original) if original is not None else 0
        out.append(item)
    return out


def rows_per_partition(cfg: DeltadrainConfig, pipeline: PipelineConfig) -> dict[str, int]:
    """Target rows per source partition (`_dd_partition`)."""
    table = open_table(str(cfg.target_path(pipeline)))
    if table is None:
        return {}
    rows = query(table, "SELECT _dd_partition AS p, count(*) AS n FROM t GROUP BY _dd_partition")
    return {r["p"]: int(r["n"]) for r in rows}


def dead_per_partition(cfg: DeltadrainConfig, pipeline: PipelineConfig) -> dict[str, int]:
    """The pipeline's DEAD dead letters per source partition."""
    table = open_table(str(cfg.dlq_path(pipeline)))
    if table is None:
        return {}
    # The name is checked against config.NAME by _sql_literal: nothing else can reach the text.
    rows = query(table, "SELECT partition AS p, count(*) AS n FROM t "  # noqa: S608
                        f"WHERE pipeline = {_sql_literal(pipeline.name)} AND state = 'DEAD' GROUP BY partition")
    return {r["p"]: int(r["n"]) for r in rows}


def find_dead_letters(path: str, *, error_contains: str | None = None, since: datetime | None = None,
                      until: datetime | None = None, state: str | None = DEAD, limit: int = 50) -> list[dict]:
    """Entries of the DLQ table at `path`, newest failure first, each with the first 120 bytes of its
    payload as text (`deltadrain dlq list`). The filters are applied to the rows read, never written
    into the query's text; a time without a zone is UTC."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from deltalake import QueryBuilder

    table = open_table(path)
    if table is None:
        return []
    where = {DEAD: "WHERE state = 'DEAD'", REPLAYED: "WHERE state = 'REPLAYED'", None: ""}[state]
    rows = pa.RecordBatchReader.from_stream(QueryBuilder().register("t", table).execute(f"SELECT * FROM t {where}")).read_all()  # noqa: S608
    # delta-rs reads text and bytes as Arrow view types, which Arrow's filters and sorts do not all take.
    views = {pa.string_view(): pa.string(), pa.binary_view(): pa.binary()}
    rows = rows.cast(pa.schema([f.with_type(views.get(f.type, f.type)) for f in rows.schema]))
    keep = None

    def both(mask):
        return mask if keep is None else pc.and_(keep, mask)

    if error_contains:
        keep = both(pc.match_substring(rows["error"], error_contains))
    for bound, compare in ((since, pc.greater_equal), (until, pc.less)):
        if bound is not None:
            at = bound if bound.tzinfo is not None else bound.replace(tzinfo=UTC)
            keep = both(compare(rows["last_failure_at"], pa.scalar(at, rows.schema.field("last_failure_at").type)))
    if keep is not None:
        rows = rows.filter(keep)
    rows = rows.sort_by([("last_failure_at", "descending"), ("partition", "ascending"), ("pos_hi", "ascending"),
                         ("pos_lo", "ascending")]).slice(0, limit)
    out = []
    for item in pylist(rows):
        original = item.pop("original")
        item["payload_preview"] = bytes(original[:PREVIEW_BYTES]).decode("utf-8", "replace") if original is not None else None
        item["payload_bytes"] = len(original) if original is not None else 0
        out.append(item)
    return out


def dead_letter_keys(cfg: DeltadrainConfig, pipeline: PipelineConfig) -> dict[tuple[str, str], str | None]:
    """(partition, position) -> message id of every DEAD entry: what a replay selection is checked against."""
    table = open_table(str(cfg.dlq_path(pipeline)))
    if table is None:
        return {}
    rows = query(table, "SELECT partition, position, message_id FROM t WHERE state = 'DEAD'")
    return {(r["partition"], r["position"]): r["message_id"] for r in rows}


def last_batches(cfg: DeltadrainConfig, pipeline: PipelineConfig, n: int = 10, numbered: bool = False) -> list[dict]:
    """The pipeline's newest runs from the metrics table, newest first (the same rows as metrics.last_runs);
    `numbered`: only runs with a batch number (an idle pipeline records many empty runs)."""
    table = open_table(str(metrics_path(cfg)))
    if table is None:
        return []
    # The name is checked against config.NAME by _sql_literal: nothing else can reach the text.
    numbers = " AND batch IS NOT NULL" if numbered else ""
    rows = query(table, f"SELECT * FROM m WHERE pipeline = {_sql_literal(pipeline.name)}{numbers} "  # noqa: S608
                        f"ORDER BY finished_at DESC LIMIT {int(n)}", name="m")
    out = []
    for r in rows:
        item: dict[str, Any] = {k: v.astimezone(UTC) if isinstance(v, datetime) else v for k, v in r.items()}
        item["timings"] = json.loads(item["timings"]) if item.get("timings") else {}
        out.append(item)
    return out


def batch_checks(cfg: DeltadrainConfig, pipeline: PipelineConfig, batches: list[int]) -> dict[int, dict]:
    """batch -> the newest quality check of that batch of the current target (newest_checks)."""
    from deltadrain.quality.results import results_path

    if not batches:
        return {}
    results, target = open_table(str(results_path(cfg))), open_table(str(cfg.target_path(pipeline)))
    if results is None or target is None:
        return {}
    # Only the validated name and ints go into the text.
    rows = query(results, f"SELECT batch, success, failed, quarantined, policy, checked_at, {_table_id(results)} FROM r "  # noqa: S608
                          f"WHERE pipeline = {_sql_literal(pipeline.name)} AND scope = 'batch' "
                          f"AND batch IN ({', '.join(str(int(b)) for b in sorted(set(batches)))})", name="r")
    return newest_checks(rows, target.metadata().id)


def _table_id(results) -> str:
    """The results' table id column; a results table from before `table_id` gains it only with the
    next check's row, and its rows count for any target table (NULL)."""
    return "table_id" if "table_id" in {f.name for f in results.schema().fields} else "NULL AS table_id"


def owed_from(cfg: DeltadrainConfig, pipeline: PipelineConfig) -> int | None:
    """The lowest batch the quality tasks owe a check (quality.owed.owed_batches): the pipeline's lowest
    checked batch of the current target, or with none yet the oldest batch the ingest DAG drained
    among as many commits as quality.owed.first_scheduled looks over; None: nothing is owed (only the
    daily whole-table check reads them)."""
    from deltadrain.quality.owed import FIRST_SCHEDULED_SCAN, oldest_scheduled
    from deltadrain.quality.results import results_path

    results, target = open_table(str(results_path(cfg))), open_table(str(cfg.target_path(pipeline)))
    if target is None:
        return None
    if results is not None:
        rows = query(results, f"SELECT {_table_id(results)}, min(batch) AS low FROM r "  # noqa: S608 (the validated name only)
                              f"WHERE pipeline = {_sql_literal(pipeline.name)} AND scope = 'batch' "
                              "AND batch IS NOT NULL GROUP BY 1", name="r")
        lows = [int(r["low"]) for r in rows if r["table_id"] in (None, target.metadata().id)]
        if lows:
            return min(lows)
    return oldest_scheduled((meta for _, meta in _batch_commits(cfg, pipeline, FIRST_SCHEDULED_SCAN)), pipeline.name)


def newest_checks(rows: list[dict], table: str) -> dict[int, dict]:
    """Per batch, the newest of the results `rows` of the target whose Delta id is `table` (rows from
    before results named their table count for any), as the page shows it: passed or the expectations
    it failed, and the rows all the batch's checks quarantined (a re-check after a quarantine passes:
    the rows it moved are gone from the target) (pure)."""
    def when(r: dict) -> float:
        return r["checked_at"].timestamp() if r.get("checked_at") else float("-inf")

    newest: dict[int, dict] = {}
    moved: dict[int, int] = {}
    for r in rows:
        b = int(r["batch"])
        if r.get("table_id") not in (None, table):
            continue
        moved[b] = moved.get(b, 0) + int(r["quarantined"] or 0)
        if b not in newest or when(r) > when(newest[b]):
            newest[b] = r
    return {b: {"success": bool(r["success"]), "failed": json.loads(r["failed"] or "[]"), "quarantined": moved[b],
                "policy": r["policy"], "checked_at": r["checked_at"]}
            for b, r in newest.items()}


def committed_runs(cfg: DeltadrainConfig, pipeline: PipelineConfig, search: int = HISTORY) -> set[tuple[int, str]]:
    """(batch, run id) of the batch commits among the target's newest `search` commits (all the history
    the page reads): a run recorded as an error may have committed its batch first (its
    acknowledgement failed, or it was killed after the commit)."""
    return {(meta["batch"], meta.get("run_id")) for _, meta in _batch_commits(cfg, pipeline, search)}


def _batch_commits(cfg: DeltadrainConfig, pipeline: PipelineConfig, search: int):
    """(commit, its deltadrain metadata) of the target's newest `search` commits that carry a batch of `pipeline`."""
    # A shorter search reads the page's own HISTORY (read once per page), a longer one reads its own.
    for commit in history(str(cfg.target_path(pipeline)), max(search, HISTORY))[:search]:
        try:
            meta = json.loads(commit.get("userMetadata") or "null")
        except ValueError:
            meta = None
        if carries_batch(meta, pipeline.name):
            yield commit, meta


def _at(commit: dict) -> datetime | None:
    return datetime.fromtimestamp(commit["timestamp"] / 1000, UTC) if commit.get("timestamp") else None


def last_commit(cfg: DeltadrainConfig, pipeline: PipelineConfig, search: int = 20) -> dict | None:
    """The newest commit of the target that carries this pipeline's batch metadata (the checkpoint's fast path)."""
    for commit, meta in _batch_commits(cfg, pipeline, search):
        return {"batch": meta["batch"], "run_id": meta.get("run_id"), "positions": meta.get("positions") or {},
                "crashes": meta.get("crashes") or {}, "table_version": commit.get("version"), "at": _at(commit),
                "written": inserted_rows(commit.get("operationMetrics") or {})}
    return None


def checkpoint(cfg: DeltadrainConfig, pipeline: PipelineConfig) -> Checkpoint:
    """The checkpoint as the newest batch commit keeps it (batch 0, no positions, when none is found)."""
    last = last_commit(cfg, pipeline)
    if last is None:
        return Checkpoint(0)
    return Checkpoint(last["batch"], last["positions"], last["table_version"], last["run_id"], "commit",
                      {"crashes": last["crashes"]})


def gap_row(gap: dict) -> dict:
    """One gap of a commit's metadata as the page lists it. Valkey's name an id range (`from`/`to`,
    inclusive) and say why; Kafka's an offset range (`start`/`end`, end exclusive)."""
    if "start" in gap:
        return {"partition": str(gap["partition"]), "kind": "retention",
                "range": f"offsets {gap['start']} to {int(gap['end']) - 1}", "missing": gap.get("missing"),
                "reason": "retention deleted these offsets before any run read them"}
    return {"partition": gap["partition"], "kind": gap.get("kind", ""), "range": f"{gap['from']} to {gap['to']}",
            "missing": gap.get("missing"), "reason": gap.get("reason", "")}


def recorded_gaps(cfg: DeltadrainConfig, pipeline: PipelineConfig, search: int = 100) -> list[dict]:
    """Gaps (messages the source lost before a run got them, invariant 1) that the pipeline's newest
    `search` commits recorded, newest first, with the batch and time of the commit that carries each."""
    return [{"batch": meta["batch"], "at": _at(commit), **gap_row(g)}
            for commit, meta in _batch_commits(cfg, pipeline, search) for g in meta.get("gaps") or []]
