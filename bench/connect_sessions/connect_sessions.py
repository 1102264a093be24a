"""A drain's commit in a new Spark Connect session against one in a session that has committed before,
on a server started by Spark's own entry point (per-session artifact isolation on) and on one started
by deltadrain's (jvm/connect: isolation off), side by side (bench/connect_sessions/README.md).

Both servers run at once, each with a Delta table of its own; only one works at a time. Each batch is
ROWS target-shaped rows (`deltadrain.dev.bench.target_shaped_rows`), staged by a helper session first, so
that the commit (`commit.commit_batch`: the insert-only MERGE on the id within the batch's id range,
with a Delta app transaction) is the first query of its session, as a drain's is: its claim runs in
the client. A round commits on each server in turn (which goes first alternates): a batch in a new
session, then a batch in that same session, then a one-row batch in another new session.

    DELTADRAIN_HOME=/tmp/ddcs .venv/bin/python bench/connect_sessions/connect_sessions.py \\
        WORKDIR [ROUNDS [ROWS [PORT]]] > RESULT.json

The servers listen on PORT and PORT + 1 (default 27950) and are stopped at the end; their logs go to
WORKDIR.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

from deltadrain.dev.bench import target_shaped_rows
from deltadrain.lake.checkpoint import commit_metadata
from deltadrain.run.commit import NewTable, commit_batch
from deltadrain.runtime.jars import CONNECT_SERVER_CLASS
from deltadrain.runtime.session import connect_server_command, connect_session, server_unreachable

SPARKS_OWN = "org.apache.spark.sql.connect.service.SparkConnectServer"
SERVERS = {"spark_entry_point": SPARKS_OWN, "deltadrain_entry_point": CONNECT_SERVER_CLASS}


def start(name: str, main_class: str, port: int, work: Path) -> subprocess.Popen:
    cmd = connect_server_command(port)
    cmd[cmd.index("--class") + 1] = main_class  # Spark's own class needs no application jar, and ignores it
    with open(work / f"{name}.log", "w") as log:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def wait_up(url: str, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while server_unreachable(url) is not None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"no Connect server at {url} after {seconds} s")
        time.sleep(0.5)


class Side:
    def __init__(self, name: str, url: str, work: Path, rows: int):
        self.name, self.url, self.rows = name, url, rows
        self.table, self.stage = work / name / "target", work / name / "stage"
        self.batch = 0

    def staged(self, rows: int) -> tuple[str, str]:
        """Stage the next batch with a session of its own (closed before the commit's session opens)."""
        helper = connect_session(self.url)
        try:
            target_shaped_rows(helper, self.stage, 1000 + self.batch, rows)
            first = (1000 + self.batch) * rows
            return f"evt-7-{first:09d}", f"evt-7-{first + rows - 1:09d}"
        finally:
            helper.stop()

    def commit(self, session, rows: int) -> float:
        ids = self.staged(rows)
        source = session.read.parquet(str(self.stage))
        run_id = uuid.uuid4().hex
        meta = commit_metadata("bench", self.batch + 1, run_id, {"p": str(self.batch)})
        started = time.perf_counter()
        result = commit_batch(session, str(self.table), pipeline="bench", expected_batch=self.batch, run_id=run_id,
                              rows=source, id_field="event_id", window_start=None, metadata=meta, id_range=ids,
                              create=NewTable())
        seconds = time.perf_counter() - started
        if result.inserted != rows:
            raise RuntimeError(f"{self.name}: batch {self.batch + 1} inserted {result.inserted} of {rows} rows")
        self.batch += 1
        return seconds


def main(work: Path, rounds: int, rows: int, port: int) -> dict:
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    procs, sides = {}, {}
    try:
        for i, (name, main_class) in enumerate(SERVERS.items()):
            procs[name] = start(name, main_class, port + i, work)
            sides[name] = Side(name, f"sc://127.0.0.1:{port + i}", work, rows)
        for side in sides.values():
            wait_up(side.url)
            session = connect_session(side.url)
            for _ in range(3):  # creates the table, then warms the server up
                side.commit(session, rows)
            session.stop()
        times = {name: {"new_session": [], "same_session": [], "new_session_one_row": []} for name in sides}
        for r in range(rounds):
            order = list(sides) if r % 2 == 0 else list(reversed(sides))
            for name in order:
                side, out = sides[name], times[name]
                session = connect_session(side.url)
                out["new_session"].append(round(side.commit(session, rows), 3))
                out["same_session"].append(round(side.commit(session, rows), 3))
                session.stop()
                session = connect_session(side.url)
                out["new_session_one_row"].append(round(side.commit(session, 1), 3))
                session.stop()
            print(f"round {r}: {json.dumps(times)}", file=sys.stderr, flush=True)
        medians = {name: {kind: statistics.median(xs) for kind, xs in out.items()} for name, out in times.items()}
        for side in sides.values():  # every batch once
            check = connect_session(side.url)
            read = check.read.format("delta").load(str(side.table))
            total, distinct = read.count(), read.select("event_id").distinct().count()
            check.stop()
            if total != distinct or total != 3 * rows + rounds * (2 * rows + 1):
                raise RuntimeError(f"{side.name}: {total} rows, {distinct} ids")
        return {"command": " ".join(["bench/connect_sessions/connect_sessions.py", *sys.argv[1:]]),
                "rows": rows, "rounds": rounds, "servers": SERVERS, "times": times, "medians": medians,
                "load_avg": os.getloadavg()}
    finally:
        for proc in procs.values():
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)


if __name__ == "__main__":
    args = sys.argv[1:]
    report = main(Path(args[0]), int(args[1]) if len(args) > 1 else 6, int(args[2]) if len(args) > 2 else 200_000,
                  int(args[3]) if len(args) > 3 else 27950)
    print(json.dumps(report, indent=2))
