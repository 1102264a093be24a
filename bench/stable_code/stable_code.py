"""What a warm Connect server compiles per batch, with each batch's values compiled into Spark's generated
code and without (bench/stable_code/README.md).

Spark compiles a long or timestamp literal into the Java it generates. Side `literals` drains as deltadrain
did before: the batch number and `current_timestamp()` as literals of the rows' projection, and the
MERGE's window starting exactly `dedup_window` before the batch's oldest message (a new timestamp in the
target's filter and in Delta's file skipping every batch). Side `stable` is the drain as it is
(`drain.target_rows` joins a one-row table of the run's values; `commit.dedup_window_start` moves the
window's start only a few times per window). The bench reproduces the old code by replacing those two
functions on its side, nothing else.

Each side has a Connect server of its own (deltadrain's entry point, listening on PORT and PORT + 1), a
Valkey pipeline of its own on the Valkey of DELTADRAIN_HOME (started if it is not running) and the
pipeline defaults' `dedup_window` (P7D). A round produces MESSAGES entries into each pipeline, then each
side drains them on a new session (`catchup.drain`, BATCH entries a batch), one side after the other,
which goes first alternating. Per side and round: each batch's step timings, the classes Spark compiled
(its CodeGenerator's log lines), and the CPU seconds of the server's JVM and of its JIT compiler threads
(/proc). At the end every target holds each produced id once.

    PYTHONPATH=$PWD/include DELTADRAIN_HOME=/tmp/ddsc DELTADRAIN_VALKEY_PORT=27579 \\
        .venv/bin/python bench/stable_code/stable_code.py WORKDIR [ROUNDS [MESSAGES [BATCH [PORT]]]] > RESULT.json
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from deltadrain.catchup import drain
from deltadrain.config import load_config
from deltadrain.dev import services
from deltadrain.dev.bench import _bench_config, _drop_source, own_cpu_seconds
from deltadrain.dev.produce import produce
from deltadrain.dev.services.process import proc_stat
from deltadrain.lake.checkpoint import META_COLUMNS
from deltadrain.lake.delta import sql_name
from deltadrain.run import drain as drain_module
from deltadrain.runtime.session import (
    CONNECT_LOG4J,
    connect_server_command,
    connect_session,
    server_unreachable,
)

SIDES = ("literals", "stable")
CODEGEN_LOGGER = "org.apache.spark.sql.catalyst.expressions.codegen.CodeGenerator"


STABLE = (drain_module.target_rows, drain_module.dedup_window_start)


def literal_target_rows(good, pipeline, batch: int, run_id: str):
    """`drain.target_rows` before this change: the run's values as literals of the projection."""
    from pyspark.sql import functions as F

    payload = [F.col(sql_name(n)) for n in good.columns if not n.startswith("_dd_")]
    meta = [F.col(name) for name, _ in META_COLUMNS[:6]]
    return good.select(*payload, *meta, F.lit(batch).cast("long").alias("_dd_batch"),
                       F.lit(run_id).alias("_dd_run_id"), F.current_timestamp().alias("_dd_ingested_at"))


def exact_window_start(oldest: datetime, dedup_window):
    return oldest - dedup_window


class Server:
    def __init__(self, name: str, port: int, work: Path):
        self.name, self.url, self.log = name, f"sc://127.0.0.1:{port}", work / f"{name}-server.log"
        log4j = work / "log4j2-codegen.properties"  # the server's own, plus one line per compiled class
        log4j.write_text(CONNECT_LOG4J.read_text() + f"logger.codegen.name = {CODEGEN_LOGGER}\n"
                         "logger.codegen.level = info\n")
        cmd = [c.replace(str(CONNECT_LOG4J), str(log4j)) for c in connect_server_command(port)]
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_up(self, seconds: float = 180) -> None:
        deadline = time.monotonic() + seconds
        while server_unreachable(self.url) is not None:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"no Connect server at {self.url}; see {self.log}")
            time.sleep(0.5)

    def cpu(self) -> tuple[float, float]:
        """(CPU seconds of the whole JVM, of its JIT compiler threads). spark-submit execs the JVM in place,
        so it is this process; its count keeps the seconds of threads that ended (Spark's task threads
        come and go), the compiler threads live on."""
        pid, jit = self.proc.pid, 0.0
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                if "Compiler" in (task / "comm").read_text():  # a thread's own counts are under task/
                    jit += own_cpu_seconds((task / "stat").read_text().rsplit(") ", 1)[1].split())
        return own_cpu_seconds(proc_stat(pid)), jit

    def compiled(self) -> int:
        return sum(1 for line in self.log.read_text(errors="replace").splitlines() if "Code generated in" in line)

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(timeout=60)


def drain_round(cfg, pipeline, server: Server, side: str) -> dict:
    if side == "literals":
        drain_module.target_rows, drain_module.dedup_window_start = literal_target_rows, exact_window_start
    else:
        drain_module.target_rows, drain_module.dedup_window_start = STABLE
    session = connect_session(server.url)
    (cpu, jit), classes, started = server.cpu(), server.compiled(), time.monotonic()
    batches = []
    try:
        while (s := drain(cfg, pipeline, spark=session)).outcome != "empty":
            if s.outcome != "committed":
                raise RuntimeError(f"{side}: {s.line()}")
            batches.append({"claimed": s.claimed, "timings": s.timings})
    finally:
        session.stop()
    cpu_after, jit_after = server.cpu()
    return {"seconds": round(time.monotonic() - started, 2), "batches": batches,
            "classes_compiled": server.compiled() - classes, "server_cpu_s": round(cpu_after - cpu, 2),
            "jit_cpu_s": round(jit_after - jit, 2), "other_cpu_s": round(cpu_after - cpu - (jit_after - jit), 2)}


def summary(rounds: list[dict], side: str, first: int) -> dict:
    kept = rounds[first:]
    commits = [b["timings"]["commit"] for r in kept for b in r[side]["batches"]]
    return {"rounds": f"{first + 1}-{len(rounds)}", "commit_median_s": round(statistics.median(commits), 3),
            "batch_median_s": round(statistics.median(sum(b["timings"].values()) for r in kept
                                                      for b in r[side]["batches"]), 3),
            "classes_compiled": sum(r[side]["classes_compiled"] for r in kept),
            "jit_cpu_s_per_round": round(statistics.mean(r[side]["jit_cpu_s"] for r in kept), 2),
            "other_cpu_s_per_round": round(statistics.mean(r[side]["other_cpu_s"] for r in kept), 2),
            "server_cpu_s_per_round": round(statistics.mean(r[side]["server_cpu_s"] for r in kept), 2)}


def main(work: Path, rounds: int, messages: int, batch: int, port: int) -> dict:
    started = datetime.now(UTC).isoformat()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    servers: dict[str, Server] = {}
    pipelines = {}
    for side in SIDES:
        (work / side).mkdir()
        config, name = _bench_config(work / side, 4, batch, window="P7D")
        cfg = load_config(config)
        pipelines[side] = (cfg, cfg.pipeline(name))
        time.sleep(1.1)  # the bench config names its pipeline by the second
    with services.running(pipelines[SIDES[0]][0], ["valkey"]):
        try:
            for i, side in enumerate(SIDES):
                servers[side] = Server(side, port + i, work)
            for server in servers.values():
                server.wait_up()
            out: list[dict] = []
            for r in range(rounds):
                for side in SIDES:
                    cfg, pipeline = pipelines[side]
                    produce(cfg, pipeline, messages, seed=7, start=r * messages, progress=False)
                order = SIDES if r % 2 == 0 else tuple(reversed(SIDES))
                one = {side: drain_round(*pipelines[side], servers[side], side) for side in order}
                out.append(one)
                print(f"round {r + 1}: " + json.dumps({s: {k: v for k, v in one[s].items() if k != "batches"}
                                                       | {"commits": [b["timings"]["commit"] for b in one[s]["batches"]]}
                                                       for s in SIDES}), file=sys.stderr, flush=True)
            for side in SIDES:  # every produced id once in each target
                cfg, pipeline = pipelines[side]
                check = connect_session(servers[side].url)
                rows = check.read.format("delta").load(str(cfg.target_path(pipeline)))
                total, distinct = rows.count(), rows.select("event_id").distinct().count()
                check.stop()
                if total != distinct or total != rounds * messages:
                    raise RuntimeError(f"{side}: {total} rows, {distinct} ids, {rounds * messages} produced")
        finally:
            for server in servers.values():
                server.stop()
            for cfg, pipeline in pipelines.values():
                _drop_source(cfg, pipeline)
    return {"command": " ".join(["bench/stable_code/stable_code.py", *sys.argv[1:]]), "rounds": rounds,
            "messages_per_round": messages, "batch_cap": batch, "started": started,
            "summary": {side: {"from_round_2": summary(out, side, 1), "second_half": summary(out, side, rounds // 2)}
                        for side in SIDES},
            "detail": out, "load_avg": os.getloadavg()}


if __name__ == "__main__":
    args = sys.argv[1:] + [None] * 5
    print(json.dumps(main(Path(args[0]), int(args[1] or 12), int(args[2] or 400_000), int(args[3] or 200_000),
                          int(args[4] or 27960)), indent=2))
