"""How often do racing writers of one Delta log version both win? (bench/log_store/README.md)

A correctness measurement, not a speed one. In one Spark session, WRITERS threads write version i
of a log directory together (overwrite=false, the way Delta commits), round after round, through
a log store named by class: Delta's default for file: paths (HDFSLogStore: check that the file is
absent, then rename over it) and deltadrain's (LocalLinkLogStore: hard link). A round that more
than one writer "won" is a commit lost without an error. The stores alternate, RUNS times each.
tests/integration/test_log_store.py runs the same race against deltadrain's store.

    .venv/bin/python bench/log_store/log_store_race.py WORKDIR ROUNDS WRITERS RUNS > out.json
"""

from __future__ import annotations

import functools
import json
import shutil
import sys
import threading
import time
from pathlib import Path

from py4j.protocol import Py4JJavaError

from deltadrain.runtime.jars import LOG_STORE_CLASS
from deltadrain.runtime.session import get_spark

DELTA_DEFAULT = "io.delta.storage.HDFSLogStore"


def write(spark, store, path: Path, line: str, overwrite: bool) -> None:
    lines = spark._jvm.java.util.ArrayList()
    lines.add(line)
    store.write(spark._jvm.org.apache.hadoop.fs.Path(f"file:{path}"), lines.iterator(), overwrite,
                spark._jsc.hadoopConfiguration())


def new_store(spark, name: str):
    """A log store instantiated as Delta does: by class name, with the session's Hadoop conf."""
    return functools.reduce(getattr, name.split("."), spark._jvm)(spark._jsc.hadoopConfiguration())


def race(spark, name: str, directory: Path, rounds: int, writers: int) -> dict[int, list[str]]:
    """`writers` threads write version i (overwrite=false) together, round after round; returns each
    round's winners. Any error other than "the file exists" fails the race."""
    store = new_store(spark, name)
    directory.mkdir(parents=True)
    won: dict[int, list[str]] = {i: [] for i in range(rounds)}
    errors: list[str] = []
    start = threading.Barrier(writers)

    def writer(who: str) -> None:
        for i in range(rounds):
            start.wait()
            try:
                write(spark, store, directory / f"{i:020d}.json", f'{{"writer":"{who}"}}', False)
                won[i].append(who)
            except Py4JJavaError as exc:
                if "java.nio.file.FileAlreadyExistsException" not in str(exc.java_exception):
                    errors.append(str(exc.java_exception))

    threads = [threading.Thread(target=writer, args=(f"w{n}",)) for n in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"{name}: {errors[:3]}")
    return won


def main(workdir: str, rounds: int, writers: int, runs: int) -> None:
    spark = get_spark("log-store-race", master=f"local[{writers}]")
    root = Path(workdir)
    shutil.rmtree(root, ignore_errors=True)
    results = []
    for run in range(runs):
        for name in (DELTA_DEFAULT, LOG_STORE_CLASS):
            began = time.monotonic()
            won = race(spark, name, root / f"{run}-{name.rsplit('.', 1)[1]}", rounds, writers)
            results.append({"store": name, "run": run + 1, "rounds": rounds, "writers": writers,
                            "rounds_won_twice_or_more": sum(len(w) > 1 for w in won.values()),
                            "rounds_won_by_none": sum(not w for w in won.values()),
                            "seconds": round(time.monotonic() - began, 1)})
            print(json.dumps(results[-1]), file=sys.stderr)
    json.dump({"command": " ".join(sys.argv), "results": results}, sys.stdout, indent=2)
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
