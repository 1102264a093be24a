"""The Spark Connect server's warm-up: what `services up` runs on a server it just started, before it
reports it ready.

A new server's JVM has loaded and compiled nothing of Delta's write paths yet: the first batch a
pipeline sends it took 28 s where later ones take 2 to 4 (bench/cold_batch/README.md). The warm-up
sends what a drain's first batches send, on a scratch target and DLQ under the state home: the target
created by its first batch's write, then MERGEd into by the drain's own commit (`commit_batch`), with
the stats pass over each batch, and dead letters MERGEd into a DLQ-shaped table (`write_dead_letters`)
— each batch from a session of its own, as drain runs open them. Then the tables are removed.

It runs as a child process: a Connect session makes its process a Connect client for good (pyspark's
rule), and `services up` runs inside processes (the tests, a bench) that start local drivers too.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["ROUNDS", "ROWS", "warm_up"]

# Batches after the one that creates the tables, and rows per batch: each path a drain's first batches
# take (the creating write, the MERGE, the DLQ's creation and MERGE) runs once before a pipeline's
# does; more rounds cost as much again each at start (bench/cold_batch/README.md).
ROUNDS = 1
ROWS = 5000
# One row in this many is a dead letter (the demo's 2% malformed).
DEAD_EVERY = 50


def warm_up(url: str, directory: Path, rounds: int = ROUNDS, rows: int = ROWS, timeout: float = 600) -> dict:
    """Warm the server at `url` in a child process; its scratch tables under `directory` are removed after.
    {"seconds", "rounds", "rows", "round_s"}; a failure is {"error": ...}: the server is up all the same."""
    started = time.monotonic()
    cmd = [sys.executable, "-m", "deltadrain.dev.services.warm_up", url, str(directory), str(rounds), str(rows)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"did not finish within {timeout:.0f} s", "seconds": round(time.monotonic() - started, 1)}
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"error": _error_line(done.stderr), "seconds": round(time.monotonic() - started, 1)}
    return {**json.loads(lines[-1]), "seconds": round(time.monotonic() - started, 1)}


def _error_line(stderr: str) -> str:
    """The child's exception as one line: the Python traceback's last line, not the JVM's stack after it."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    raised = [line for line in lines if re.match(r"[\w.]+(Error|Exception): ", line)]
    return (raised[0] if raised else (lines or ["no output"])[-1])[:300]


def _rows(spark, batch: int, rows: int):
    """Claimed-and-transformed rows of batch `batch`, shaped like the sample pipeline's target rows (the
    event's fields and deltadrain's columns); ids never repeat across batches."""
    first = batch * rows
    return spark.range(first, first + rows, numPartitions=2).selectExpr(
        "format_string('warm-%09d', id) AS event_id", "format_string('cust-%05d', pmod(id, 997)) AS customer",
        "CAST(pmod(id, 50000) / 100.0 AS DOUBLE) AS amount", "pmod(id, 9) + 1 AS quantity",
        "element_at(array('new', 'paid', 'shipped', 'cancelled'), CAST(pmod(id, 4) AS INT) + 1) AS status",
        "timestamp_millis(1790000000000 + id) AS event_time",
        "'warm-up:{' || CAST(id % 4 AS STRING) || '}' AS _dd_partition",
        "format_string('%d-0', 1790000000000 + id) AS _dd_position", "1790000000000 + id AS _dd_pos_hi",
        "0L AS _dd_pos_lo", "timestamp_millis(1790000000000 + id) AS _dd_source_ts", "1 AS _dd_attempts",
        f"{batch + 1}L AS _dd_batch", f"'warm-up-{batch + 1}' AS _dd_run_id", "current_timestamp() AS _dd_ingested_at")


def _dead_letters(rows, batch: int):
    """Every DEAD_EVERY-th row as a dead letter in the DLQ's columns."""
    from deltadrain.lake.deadletter import DEAD, dlq_struct

    names = [f.name for f in dlq_struct().fields]
    return rows.where(f"pmod(_dd_pos_hi, {DEAD_EVERY}) = 0").selectExpr(
        "'warm-up' AS pipeline", "_dd_partition AS partition", "_dd_position AS position", "_dd_pos_hi AS pos_hi",
        "_dd_pos_lo AS pos_lo", "event_id AS message_id", "CAST(customer AS BINARY) AS original",
        "'invalid JSON: Expecting value' AS error", "'malformed' AS error_type", "1 AS attempts",
        "current_timestamp() AS first_failure_at", "current_timestamp() AS last_failure_at", f"'{DEAD}' AS state",
        f"{batch + 1}L AS batch", f"'warm-up-{batch + 1}' AS run_id", "CAST(NULL AS TIMESTAMP) AS replayed_at",
        "CAST(NULL AS STRING) AS replay_run_id").select(*names)


def _round(url: str, directory: Path, batch: int, rows: int) -> float:
    from deltadrain.lake.checkpoint import commit_metadata
    from deltadrain.lake.deadletter import write_dead_letters
    from deltadrain.run.commit import NewTable, commit_batch
    from deltadrain.run.rows import batch_stats_columns
    from deltadrain.runtime.session import connect_session

    started = time.monotonic()
    spark = connect_session(url, purpose="deltadrain services up: the server's warm-up")
    try:
        staged = directory / "stage"
        _rows(spark, batch, rows).write.mode("overwrite").parquet(str(staged))
        claimed = spark.read.parquet(str(staged))
        stats = claimed.agg(*batch_stats_columns("event_id")).first()
        write_dead_letters(spark, str(directory / "dlq"), _dead_letters(claimed, batch))
        result = commit_batch(spark, str(directory / "target"), pipeline="warm-up", expected_batch=batch,
                              run_id=f"warm-up-{batch + 1}", rows=claimed, id_field="event_id", window_start=None,
                              metadata=commit_metadata("warm-up", batch + 1, f"warm-up-{batch + 1}", {}),
                              id_range=(stats["_dd_lo"], stats["_dd_hi"]), create=NewTable() if batch == 0 else None)
        if result.outcome.value != "committed":
            raise RuntimeError(f"warm-up batch {batch + 1}: {result}")
    finally:
        spark.stop()
    return round(time.monotonic() - started, 2)


def main(argv: list[str]) -> int:
    url, directory, rounds, rows = argv[0], Path(argv[1]), int(argv[2]), int(argv[3])
    shutil.rmtree(directory, ignore_errors=True)
    times = [_round(url, directory, batch, rows) for batch in range(rounds + 1)]
    print(json.dumps({"rounds": rounds + 1, "rows": rows, "round_s": times}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
