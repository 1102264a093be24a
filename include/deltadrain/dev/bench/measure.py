"""What a benchmark reads of its processes: CPU seconds by role, peak and resident memory, the JVM's
live heap (from /proc and the JVM itself)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from deltadrain.dev.services.process import all_pids, proc_stat


def _status_kib(pid: int, field: str) -> int:
    """A field of /proc/PID/status in KiB (VmHWM: peak resident, VmRSS: resident); 0 once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
    except FileNotFoundError:
        pass
    return 0


def _peak_rss_kib(pid: int) -> int:
    return _status_kib(pid, "VmHWM")


def _rss_kib(pid: int) -> int:
    return _status_kib(pid, "VmRSS")


def reset_peak_rss() -> None:
    """Start this process's peak resident (VmHWM) over from its current resident, so that the next
    `_peak_rss_kib` reading is the peak of what runs in between (Linux's clear_refs, value 5)."""
    Path("/proc/self/clear_refs").write_text("5")


HZ = os.sysconf("SC_CLK_TCK")


def own_cpu_seconds(stat: list[str]) -> float:
    """utime + stime of a `proc_stat` row (fields 11 and 12 after the command name)."""
    return (int(stat[11]) + int(stat[12])) / HZ


ROLES = ("driver_python", "driver_jvm", "python_workers", "source_server")


def _processes() -> dict[int, tuple[int, int, float, float, bytes]]:
    """pid -> (parent, process group, own CPU seconds, reaped children's CPU seconds, argv[0])."""
    out = {}
    for pid in all_pids():
        stat = proc_stat(pid)
        try:
            argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
        except (FileNotFoundError, ProcessLookupError):
            stat = None
        if stat is None:  # gone meanwhile
            continue
        # After the command name: state, ppid, pgrp, ... utime (11), stime, cutime, cstime (14).
        out[pid] = (int(stat[1]), int(stat[2]), own_cpu_seconds(stat), (int(stat[13]) + int(stat[14])) / HZ, argv0)
    return out


def _jvm_pids(parent: int, procs: dict | None = None) -> list[int]:
    """The Spark JVMs a driver process started (spark-submit execs java in place)."""
    procs = _processes() if procs is None else procs
    return [pid for pid, (ppid, *_, argv0) in procs.items() if ppid == parent and argv0.endswith(b"java")]


def memory_report() -> dict:
    me = os.getpid()
    jvm = _jvm_pids(me)
    return {"driver_python_peak_mib": round(_peak_rss_kib(me) / 1024, 1),
            "driver_jvm_peak_mib": round(sum(_peak_rss_kib(p) for p in jvm) / 1024, 1)}


def cpu_by_role(server_group: int | None = None, spark=None) -> dict[str, float]:
    """CPU seconds used so far by the processes a drain runs on, by role: this driver process, its
    Spark JVM (driver and, in local mode, the executors), the JVM's Python workers (counting those
    that have exited: their parents reaped them), and the source's server (its process group). Also
    `machine_busy`: all cores' non-idle seconds, and with `spark`, `driver_jvm_jit`: the seconds
    HotSpot's compiler threads spent compiling (part of the JVM's CPU). Differences of two readings
    say where a phase's CPU went. Linux only (/proc)."""
    procs = _processes()
    children: dict[int, list[int]] = {}
    for pid, (parent, *_rest) in procs.items():
        children.setdefault(parent, []).append(pid)
    me = os.getpid()
    jvms = _jvm_pids(me, procs)
    workers, stack = 0.0, [c for j in jvms for c in children.get(j, [])]
    while stack:  # the pyspark daemon, its forked workers and anything they started
        pid = stack.pop()
        workers += procs[pid][2] + procs[pid][3]
        stack += children.get(pid, [])
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    jit = {}
    if spark is not None:  # from the JVM itself: compiler threads come and go, /proc forgets the gone ones
        bean = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getCompilationMXBean()
        jit["driver_jvm_jit"] = bean.getTotalCompilationTime() / 1000
    return {**jit, "driver_python": procs[me][2] if me in procs else 0.0,
            "driver_jvm": sum(procs[j][2] for j in jvms),
            "python_workers": workers + sum(procs[j][3] for j in jvms),
            "source_server": sum(own + reaped for _, group, own, reaped, _ in procs.values() if group == server_group)
            if server_group else 0.0,
            "machine_busy": (sum(fields) - fields[3] - fields[4]) / HZ}  # all but idle and iowait


def cpu_report(before: dict, after: dict, messages: int, seconds: float) -> dict:
    """Where a phase's CPU went: core-seconds per 100 000 messages by role, and the cores the whole
    machine kept busy on average (anything else running on it shows there, not under a role)."""
    used = {k: after[k] - before[k] for k in after}
    per = 100_000 / messages if messages else 0.0
    return {"core_seconds_per_100k": {k: round(used[k] * per, 3)
                                      for k in (*ROLES, "connect_server", "driver_jvm_jit", "machine_busy")
                                      if k in used},
            "cores_busy": round(used["machine_busy"] / seconds, 2) if seconds else 0.0}


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds of `root` and every process under it, counting children they reaped: a Spark
    Connect server's JVM and its Python workers."""
    procs = _processes()
    children: dict[int, list[int]] = {}
    for pid, (parent, *_rest) in procs.items():
        children.setdefault(parent, []).append(pid)
    total, stack = 0.0, [root] if root in procs else []
    while stack:
        pid = stack.pop()
        total += procs[pid][2] + procs[pid][3]
        stack += children.get(pid, [])
    return total


def jvm_live_heap_mib(spark, settle_rounds: int = 6) -> float:
    """Used heap of the driver JVM right after a full GC: the live set. Its peak RSS only says how far
    the collector let the heap grow, up to spark.driver.memory; this says what the driver holds on to."""
    # One GC is not enough: it clears the weak references through which Spark's ContextCleaner
    # learns that a broadcast or shuffle is gone, and the cleaner frees those blocks only afterwards,
    # on its own thread. So collect until two readings agree.
    jvm = spark.sparkContext._jvm
    bean = jvm.java.lang.management.ManagementFactory.getMemoryMXBean()
    last = None
    for _ in range(settle_rounds):
        jvm.java.lang.System.gc()
        used = bean.getHeapMemoryUsage().getUsed() / 2**20
        if last is not None and abs(used - last) < 1:
            break
        last = used
        time.sleep(0.2)
    return round(used, 1)
