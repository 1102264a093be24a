"""How long a new Spark Connect server takes to warm up: the drain's commit (`commit.commit_batch`, the
insert-only MERGE on the id within the batch's id range, with the batch number as txnAppId/txnVersion)
of staged full-size batches, one after another, each in a session of its own as drain runs open them,
on one server started for the run (bench/server_warmth/README.md).

Per commit it records the wall time and the server JVM's CPU: all of it, its JIT compiler threads' and
its garbage collector threads' (each thread's own counts, under /proc/PID/task). Nothing but the staging
and the commits runs on the server.

    PYTHONPATH=$PWD/include DELTADRAIN_HOME=/tmp/ddwarm .venv/bin/python bench/server_warmth/server_warmth.py \\
        WORKDIR COMMITS ROWS PORT > out.json
"""

import contextlib
import json
import shutil
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "stable_code"))
from stable_code import Server

from deltadrain.dev.bench import own_cpu_seconds, target_shaped_rows
from deltadrain.lake.checkpoint import commit_metadata
from deltadrain.run.commit import NewTable, commit_batch
from deltadrain.runtime.session import connect_session

# Summaries over these spans of commits (1-based, inclusive); a span past the run's end is left out.
SPANS = ((2, 10), (11, 20), (21, 40), (41, 60), (61, 80))


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of the JVM's live JIT compiler and garbage collector threads."""
    out = {"jit": 0.0, "gc": 0.0}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            name = (task / "comm").read_text()
            kind = "jit" if "Compiler" in name else "gc" if "GC" in name or "G1" in name else None
            if kind:
                out[kind] += own_cpu_seconds((task / "stat").read_text().rsplit(") ", 1)[1].split())
    return out


def main(workdir: str, commits: int, rows: int, port: int) -> dict:
    work = Path(workdir)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    server = Server("warmth", port, work)
    server.wait_up()
    table = str(work / "target")
    out = {"command": " ".join(["bench/server_warmth/server_warmth.py", *sys.argv[1:]]), "rows": rows,
           "commits": []}
    try:
        for batch in range(commits):
            session = connect_session(server.url)
            stage = work / f"stage{batch % 2}"
            target_shaped_rows(session, stage, batch, rows)
            source = session.read.parquet(str(stage))
            first = batch * rows
            ids = (f"evt-7-{first:09d}", f"evt-7-{first + rows - 1:09d}")  # target_shaped_rows's ids
            run_id = uuid.uuid4().hex
            meta = commit_metadata("bench", batch + 1, run_id, {"p": str(batch)})
            (cpu0, _), threads0, started = server.cpu(), thread_cpu(server.proc.pid), time.perf_counter()
            result = commit_batch(session, table, pipeline="bench", expected_batch=batch, run_id=run_id,
                                  rows=source, id_field="event_id", window_start=None, metadata=meta, id_range=ids,
                                  create=None if batch else NewTable())
            seconds = time.perf_counter() - started
            (cpu1, _), threads1 = server.cpu(), thread_cpu(server.proc.pid)
            session.stop()
            if result.outcome != "committed":
                raise RuntimeError(f"batch {batch + 1}: {result}")
            row = {"batch": batch + 1, "commit_s": round(seconds, 3), "server_cpu_s": round(cpu1 - cpu0, 2),
                   **{f"{k}_cpu_s": round(threads1[k] - threads0[k], 2) for k in ("jit", "gc")}}
            out["commits"].append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
        check = connect_session(server.url)
        back = check.read.format("delta").load(table)
        got = back.count(), back.select("event_id").distinct().count()
        out["read_back"] = {"rows": got[0], "distinct": got[1], "expected": commits * rows}
        if got != (commits * rows, commits * rows):
            raise RuntimeError(f"read back {got}, expected {commits * rows}")
    finally:
        server.stop()
    out["spans"] = []
    for lo, hi in SPANS:
        if hi > commits:
            continue
        span = [c for c in out["commits"] if lo <= c["batch"] <= hi]
        out["spans"].append({"commits": f"{lo}-{hi}",
                             **{f"{k}_median": statistics.median(c[k] for c in span)
                                for k in ("commit_s", "server_cpu_s", "jit_cpu_s")}})
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])), indent=1))
