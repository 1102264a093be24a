"""Dead letters: one Delta table per pipeline, written idempotently before the target commit.

The MERGE key is (pipeline, partition, position): a message redelivered after a crash, or claimed
again after a lost race, lands on its existing row instead of adding one (no non-atomic
"copy then delete" dance, which is how DLQs elsewhere duplicate or lose entries).
"""

from __future__ import annotations

from datetime import datetime

from deltadrain.lake.delta import ensure_table, is_table, merge_into, retry_conflicts, sql_literal, table_ref

DLQ_SCHEMA = ("pipeline STRING NOT NULL, partition STRING NOT NULL, position STRING NOT NULL, pos_hi BIGINT, "
              "pos_lo BIGINT, message_id STRING, original BINARY, error STRING, error_type STRING, attempts INT, "
              "first_failure_at TIMESTAMP, last_failure_at TIMESTAMP, state STRING, batch BIGINT, run_id STRING, "
              "replayed_at TIMESTAMP, replay_run_id STRING")
DEAD, REPLAYED = "DEAD", "REPLAYED"
# A dead letter's key, between the DLQ (`d`) and a MERGE's source (`s`).
SAME_PLACE = "d.pipeline = s.pipeline AND d.partition = s.partition AND d.position = s.position"


def dlq_struct():
    from pyspark.sql.types import _parse_datatype_string

    return _parse_datatype_string(DLQ_SCHEMA)


def ensure_dlq(spark, path: str) -> None:
    ensure_table(spark, path, dlq_struct())


def write_dead_letters(spark, path: str, df) -> None:
    """Insert the dead letters in `df` (DLQ_SCHEMA columns) unless they are there already."""
    ensure_dlq(spark, path)
    retry_conflicts(lambda: merge_into(spark, path, df, SAME_PLACE, "WHEN NOT MATCHED THEN INSERT *", alias="d"))


def take_back(spark, path: str, pipeline: str, run_id: str, error_type: str) -> None:
    """Delete the `error_type` dead letters run `run_id` wrote, before a commit that did not happen."""
    if not is_table(spark, path):
        return
    where = (f"pipeline = {sql_literal(pipeline)} AND run_id = {sql_literal(run_id)} "
             f"AND error_type = {sql_literal(error_type)} AND state = {sql_literal(DEAD)}")
    retry_conflicts(lambda: spark.sql(f"DELETE FROM {table_ref(path)} WHERE {where}"))  # noqa: S608 - sql_literal


def list_dead_letters(spark, path: str, *, error_contains: str | None = None, since: datetime | None = None,
                      until: datetime | None = None, state: str | None = DEAD, limit: int = 50) -> list[dict]:
    """Filters are bound as Column values, never spliced into SQL text."""
    from pyspark.sql import functions as F

    if not is_table(spark, path):
        return []
    df = spark.read.format("delta").load(path)
    if state:
        df = df.where(F.col("state") == F.lit(state))
    if error_contains:
        df = df.where(F.col("error").contains(F.lit(error_contains)))
    if since:
        df = df.where(F.col("last_failure_at") >= F.lit(since))
    if until:
        df = df.where(F.col("last_failure_at") < F.lit(until))
    rows = (df.orderBy(F.col("last_failure_at").desc(), F.col("partition"), F.col("pos_hi"), F.col("pos_lo"))
            .limit(limit).collect())
    out = []
    for row in rows:
        item = row.asDict()
        original = item.pop("original")
        item["payload_preview"] = (bytes(original[:120]).decode("utf-8", "replace") if original is not None else None)
        item["payload_bytes"] = len(original) if original is not None else 0
        out.append(item)
    return out
