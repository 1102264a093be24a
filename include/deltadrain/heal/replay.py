"""Replay: send dead letters back to the source (DEAD -> PENDING), or re-run published messages
through the current transform (PUBLISHED -> PENDING -> PUBLISHED).

Every filter is a typed value validated here and bound as a Column literal, never spliced into
SQL or a shell string. Replaying the same entries twice never duplicates a row:
- `dlq`: the original bytes are appended to their source partition first, and the DLQ rows are
  marked REPLAYED (with the run id) after; a crash in between only re-appends, and the drain's
  MERGE on the message id absorbs the copy;
- `reprocess`: the retained history of the selected positions is re-read and MERGEd onto the
  existing rows by message id (an update, never an insert of a second row).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from deltadrain.config import DeltadrainConfig, PipelineConfig
from deltadrain.errors import ReplayError
from deltadrain.lake.deadletter import DEAD, REPLAYED, SAME_PLACE
from deltadrain.lake.delta import is_table, merge_into, retry_conflicts, sql_literal
from deltadrain.lake.scratch import remove_staging, staging_dir
from deltadrain.positions import StreamId
from deltadrain.sources import NamesPartitions, source_of

LONG_MAX = 2**63 - 1  # the position columns are longs
MAX_LIMIT = 100_000  # entries are handled on the driver; bigger replays run in several goes
PREVIEW = 20


class ReplayRequest(BaseModel):
    """What the replay DAG's trigger form, the CLI and the view send. Validated before anything runs."""

    model_config = ConfigDict(extra="forbid")

    pipeline: str
    mode: Literal["dlq", "reprocess"] = "dlq"
    message_ids: list[str] = Field([], max_length=MAX_LIMIT)
    error_contains: str | None = None
    since: datetime | None = None  # dlq: last failure time; reprocess: source (append) time
    until: datetime | None = None
    partition: str | None = None
    position_from: str | None = None
    position_to: str | None = None
    limit: int = Field(1000, ge=1, le=MAX_LIMIT)
    dry_run: bool = True
    # Who asked: the replay DAG sets it to the Airflow user who triggered the run (the view triggers
    # with the caller's own token); recorded in the replay's Delta commits.
    requested_by: str | None = Field(None, max_length=256)

    @field_validator("error_contains", "partition", "position_from", "position_to", mode="before")
    @classmethod
    def _blank_is_none(cls, v):
        return None if isinstance(v, str) and not v.strip() else v

    @field_validator("since", "until", mode="before")
    @classmethod
    def _blank_time(cls, v):
        return None if isinstance(v, str) and not v.strip() else v

    @field_validator("since", "until")
    @classmethod
    def _utc(cls, v):
        return v if v is None or v.tzinfo else v.replace(tzinfo=UTC)

    @field_validator("position_from", "position_to")
    @classmethod
    def _position(cls, v):
        if v is not None and not re.fullmatch(r"[0-9]+(-[0-9]+)?", v):
            raise ValueError(f"'{v}' is not a position: an offset (42) or a stream id (1700000000000-0)")
        if v is not None and max(StreamId.parse(v)) > LONG_MAX:  # a Kafka offset "42" parses as (42, 0)
            raise ValueError(f"{v} is beyond the largest position a table holds (both parts at most {LONG_MAX})")
        return v

    def upper_bound(self) -> StreamId | None:
        """`position_to` as the last position it takes: a stream id without its sequence covers that
        whole millisecond, as XRANGE reads an end bound."""
        if not self.position_to:
            return None
        p = StreamId.parse(self.position_to)
        return p if "-" in self.position_to else StreamId(p.ms, LONG_MAX)

    @model_validator(mode="after")
    def _ranges(self):
        if self.since and self.until and not self.since < self.until:
            raise ValueError(f"time range is inverted or empty: since {self.since.isoformat()} is not before "
                             f"until {self.until.isoformat()}")
        if self.position_from and self.position_to and StreamId.parse(self.position_from) > self.upper_bound():
            raise ValueError(f"position range is inverted: {self.position_from} > {self.position_to}")
        if self.mode == "reprocess" and self.error_contains:
            raise ValueError("error_contains filters dead letters; it does not apply to mode 'reprocess'")
        return self


def parse_request(cfg: DeltadrainConfig, params: dict) -> ReplayRequest:
    """Params (from a trigger form or JSON) -> a request, with one readable error listing every problem."""
    try:
        request = ReplayRequest.model_validate(params)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(x) for x in e['loc']) or 'params'}: "
                             f"{e['msg'].removeprefix('Value error, ')}" for e in exc.errors())
        raise ReplayError(f"invalid replay parameters: {problems}") from None
    names = [p.name for p in cfg.pipelines]
    if request.pipeline not in names:
        raise ReplayError(f"invalid replay parameters: pipeline '{request.pipeline}' is not configured "
                          f"(configured: {', '.join(names)})")
    pipeline = cfg.pipeline(request.pipeline)
    positions = {name: value for name in ("position_from", "position_to")
                 if (value := getattr(request, name)) is not None}
    problem = source_of(pipeline).replay_problem(pipeline, request.partition, positions)
    if problem:
        raise ReplayError(f"invalid replay parameters: {problem}")
    return request


@dataclass
class ReplayResult:
    pipeline: str
    run_id: str
    mode: str
    dry_run: bool
    selected: int = 0
    replayed: int = 0
    skipped: list = field(default_factory=list)  # [{partition, position, reason}]
    preview: list = field(default_factory=list)
    written: int = 0  # reprocess: rows updated
    # reprocess: the drained batches whose rows it updated, for the replay DAG's quality task to
    # check again (deltadrain.quality.owed.batches_to_check); rows a backfill wrote (batch 0) are not in one.
    batches: list | None = None
    seconds: float = 0.0

    def line(self) -> str:
        return json.dumps(asdict(self), default=str)


def _filtered(df, request: ReplayRequest, *, id_col: str, time_col: str, partition_col: str, hi: str, lo: str):
    """The request's filters on `df`, each bound as a Column literal."""
    from pyspark.sql import functions as F

    if request.message_ids:
        df = df.where(F.col(id_col).isin([F.lit(m) for m in request.message_ids]))
    if request.since:
        df = df.where(F.col(time_col) >= F.lit(request.since))
    if request.until:
        df = df.where(F.col(time_col) < F.lit(request.until))
    if request.partition:
        df = df.where(F.col(partition_col) == F.lit(request.partition))
    pos = F.struct(F.col(hi), F.col(lo))
    if request.position_from:
        p = StreamId.parse(request.position_from)
        df = df.where(pos >= F.struct(F.lit(p.ms).cast("long"), F.lit(p.seq).cast("long")))
    if (upper := request.upper_bound()) is not None:
        df = df.where(pos <= F.struct(F.lit(upper.ms).cast("long"), F.lit(upper.seq).cast("long")))
    return df


def select_dead_letters(spark, path: str, request: ReplayRequest):
    """DEAD entries matching the request, oldest position first, at most `limit`."""
    from pyspark.sql import functions as F

    df = spark.read.format("delta").load(path).where(
        (F.col("pipeline") == F.lit(request.pipeline)) & (F.col("state") == F.lit(DEAD)))
    if request.error_contains:
        df = df.where(F.col("error").contains(F.lit(request.error_contains)))
    df = _filtered(df, request, id_col="message_id", time_col="last_failure_at", partition_col="partition",
                   hi="pos_hi", lo="pos_lo")
    return df.orderBy("partition", "pos_hi", "pos_lo").limit(request.limit)










REPLAY_METADATA = "spark.databricks.delta.commitInfo.userMetadata"


def mark_replayed(spark, path: str, pipeline: str, keys: list[tuple[str, str]], run_id: str,
                  requested_by: str | None = None) -> None:
    """The DLQ's entries at `keys` REPLAYED by `run_id`, in a commit whose userMetadata names the run
    and who asked for it (a key of its own: no batch commit's)."""
    from pyspark.sql import functions as F

    done = spark.createDataFrame(keys, "partition string, position string").withColumn(
        "pipeline", F.lit(pipeline))
    spark.conf.set(REPLAY_METADATA, json.dumps({"deltadrain_replay": 1, "pipeline": pipeline, "run_id": run_id,
                                                "requested_by": requested_by}, sort_keys=True))
    try:
        retry_conflicts(lambda: merge_into(
            spark, path, done, SAME_PLACE,
            f"WHEN MATCHED AND d.state = {sql_literal(DEAD)} THEN UPDATE SET state = {sql_literal(REPLAYED)}, "
            f"replayed_at = current_timestamp(), replay_run_id = {sql_literal(run_id)}", alias="d"))
    finally:
        spark.conf.unset(REPLAY_METADATA)


def replay_dead_letters(cfg, pipeline: PipelineConfig, spark, request: ReplayRequest, result: ReplayResult,
                        progress=None):
    path = str(cfg.dlq_path(pipeline))
    if not is_table(spark, path):
        return
    rows = [r.asDict() for r in select_dead_letters(spark, path, request).collect()]
    result.selected = len(rows)
    if progress is not None:
        progress("select")
    result.preview = [{"partition": r["partition"], "position": r["position"], "message_id": r["message_id"],
                       "error": (r["error"] or "")[:200]} for r in rows[:PREVIEW]]
    entries = []
    source = source_of(pipeline)
    drained = source.partition_names(pipeline) if isinstance(source, NamesPartitions) else None
    for r in rows:
        if drained is not None and r["partition"] not in drained:
            result.skipped.append({"partition": r["partition"], "position": r["position"],
                                   "reason": "the stream is no longer one of the pipeline's streams: no drain reads it"})
        elif r["original"] is None:
            result.skipped.append({"partition": r["partition"], "position": r["position"],
                                   "reason": "no original bytes to send back (the entry held none, e.g. a Kafka "
                                             "tombstone, or was deleted before it was read)"})
        else:
            entries.append({**r, "original": bytes(r["original"])})
    # A dead letter whose own message (same partition and position) the target holds is in already:
    # a run killed between its refused dead letters and its commit, then drained again after the
    # constraint changed. Sent back, its copy would be a second row once past the dedup window; it is
    # marked REPLAYED instead, so that it neither stays DEAD nor takes a place in every later replay.
    # A copy a crashed replay sent is at another position: that dead letter is sent again, as before.
    landed = published_places(spark, str(cfg.target_path(pipeline)),
                              [(e["partition"], e["position"], e["pos_hi"]) for e in entries])
    for e in [e for e in entries if (e["partition"], e["position"]) in landed]:
        result.skipped.append({"partition": e["partition"], "position": e["position"],
                               "reason": "the target holds this message at its own place already: marked "
                                         "REPLAYED without sending it"})
    entries = [e for e in entries if (e["partition"], e["position"]) not in landed]
    if landed and not request.dry_run:
        mark_replayed(spark, path, pipeline.name, sorted(landed), result.run_id, request.requested_by)
    if request.dry_run or not entries:
        return
    # Source first, DLQ state after: a crash in between re-sends on the next replay (the MERGE on the
    # message id absorbs it) instead of marking entries REPLAYED that never went back.
    source.send_back(cfg, pipeline, entries)
    mark_replayed(spark, path, pipeline.name, [(e["partition"], e["position"]) for e in entries], result.run_id,
                  request.requested_by)
    result.replayed = len(entries)


def published_places(spark, target: str, places: list[tuple[str, str, int]]) -> set[tuple[str, str]]:
    """Which (partition, position) of `places` (with their `pos_hi`, as dead letters keep it) the
    target holds a row from. The scan is narrowed to their partitions and the range of their
    `_dd_pos_hi`, which file statistics can skip on."""
    from pyspark.sql import functions as F

    if not places or not is_table(spark, target):
        return set()
    his = [hi for _, _, hi in places]
    wanted = spark.createDataFrame(sorted({(part, pos) for part, pos, _ in places}),
                                   "_dd_partition string, _dd_position string")
    rows = (spark.read.format("delta").load(target)
            .where(F.col("_dd_partition").isin(sorted({part for part, _, _ in places}))
                   & F.col("_dd_pos_hi").between(min(his), max(his)))
            .select("_dd_partition", "_dd_position").join(F.broadcast(wanted), ["_dd_partition", "_dd_position"])
            .distinct().collect())
    return {(r._dd_partition, r._dd_position) for r in rows}


def select_published(spark, path: str, pipeline: PipelineConfig, request: ReplayRequest):
    from pyspark.sql import functions as F

    df = spark.read.format("delta").load(path)
    id_col = f"`{pipeline.payload_schema.id_field}`"
    df = _filtered(df, request, id_col=id_col, time_col="_dd_source_ts", partition_col="_dd_partition",
                   hi="_dd_pos_hi", lo="_dd_pos_lo")
    return (df.select(F.col(id_col).alias("message_id"), "_dd_partition", "_dd_position", "_dd_pos_hi", "_dd_pos_lo",
                      "_dd_batch")
            .orderBy("_dd_partition", "_dd_pos_hi", "_dd_pos_lo").limit(request.limit))


def reprocess(cfg, pipeline: PipelineConfig, spark, request: ReplayRequest, result: ReplayResult,
              progress=None) -> None:
    """Re-read the selected published messages from the source's retained history and update their
    rows through the current transform. Messages the source no longer holds are reported."""
    from deltadrain.heal.backfill import merge_without_checkpoint, prepare_rows, with_table_columns

    if pipeline.upsert:
        raise ReplayError(f"pipeline '{pipeline.name}' is an upsert target (target.mode upsert): a reprocess rewrites "
                          "rows through the pipeline's current transform, and an upsert target has none (its rows are "
                          "the events as they came); heal it with a backfill, or replay dead letters (mode dlq)")
    pipeline = with_table_columns(cfg, pipeline)
    target = str(cfg.target_path(pipeline))
    if not is_table(spark, target):
        return
    picked = [r.asDict() for r in select_published(spark, target, pipeline, request).collect()]
    result.selected = len(picked)
    if progress is not None:
        progress("select")
    result.preview = [{"partition": r["_dd_partition"], "position": r["_dd_position"],
                       "message_id": r["message_id"]} for r in picked[:PREVIEW]]
    if request.dry_run or not picked:
        return
    scratch = staging_dir(result.run_id, cfg.lake_dir())
    try:
        history = source_of(pipeline).read_places(spark, cfg, pipeline,
                                                    [(r["_dd_partition"], r["_dd_position"]) for r in picked], scratch)
        found = {(r._dd_partition, r._dd_position) for r in history.select("_dd_partition", "_dd_position").collect()}
        result.skipped += [{"partition": r["_dd_partition"], "position": r["_dd_position"],
                            "reason": "no longer retained by the source"}
                           for r in picked if (r["_dd_partition"], r["_dd_position"]) not in found]
        rows, bad, failing = prepare_rows(spark, pipeline, history, result.run_id, scratch)
        result.skipped += [{"partition": r._dd_partition, "position": r._dd_position,
                            "reason": f"does not decode any more: {r._dd_error}"}
                           for r in bad.select("_dd_partition", "_dd_position", "_dd_error").collect()]
        result.skipped += [{"partition": p, "position": pos, "reason": f"transform failed: {e}"}
                           for p, pos, e in failing]
        result.skipped += filtered_now(found, result.skipped, rows)
        # Everything but the batch number: the row stays part of the batch that first published it.
        columns = [c for c in rows.columns if c != "_dd_batch"]
        meta = {"deltadrain": 1, "pipeline": pipeline.name, "kind": "reprocess", "run_id": result.run_id,
                "requested_by": request.requested_by}
        metrics, refused = merge_without_checkpoint(spark, target, rows, pipeline, meta, window_start=None,
                                                    update_matched=columns)
        result.skipped += [{"partition": p, "position": pos, "reason": f"the target table refused its row: {e}"}
                           for p, pos, e in refused]
        result.written = metrics.get("numTargetRowsUpdated", 0)
        result.replayed = result.written
        result.batches = rewritten_batches(picked, result.skipped) if result.written else []
        rows.unpersist()
    finally:
        remove_staging(scratch)


def filtered_now(found: set[tuple[str, str]], skipped: list[dict], rows) -> list[dict]:
    """The re-read messages the current transform keeps no row for (it filters them out now): the
    update-only MERGE leaves their published rows as they were, so they are reported, not rewritten."""
    kept = {(r._dd_partition, r._dd_position) for r in rows.select("_dd_partition", "_dd_position").collect()}
    left_out = {(s["partition"], s["position"]) for s in skipped}
    return [{"partition": part, "position": pos,
             "reason": "the transform keeps no row for it now (it filters it out): its published row is unchanged"}
            for part, pos in sorted(found - left_out - kept)]


def rewritten_batches(picked: list[dict], skipped: list[dict]) -> list[int]:
    """The drained batches (>= 1) holding the picked rows a reprocess did not skip: the rows it
    rewrote through the current transform, whose new values no check has judged yet."""
    left_out = {(s["partition"], s["position"]) for s in skipped}
    return sorted({int(r["_dd_batch"]) for r in picked
                   if r.get("_dd_batch") and (r["_dd_partition"], r["_dd_position"]) not in left_out})


STEPS = ("select", "replay")


def replay(cfg: DeltadrainConfig, spark, request: ReplayRequest, run_id: str | None = None,
           progress=None) -> ReplayResult:
    """`progress(step)` is called as each of STEPS is done (the CLI's progress bar)."""
    from deltadrain.run.summary import new_run_id

    pipeline = cfg.pipeline(request.pipeline)
    result = ReplayResult(pipeline.name, run_id or new_run_id(), request.mode, request.dry_run)
    began = time.monotonic()
    try:
        if request.mode == "dlq":
            replay_dead_letters(cfg, pipeline, spark, request, result, progress)
        else:
            reprocess(cfg, pipeline, spark, request, result, progress)
        if progress is not None:
            progress("replay")
    finally:
        result.seconds = round(time.monotonic() - began, 3)
    return result
