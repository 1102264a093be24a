"""The Delta log store every deltadrain session commits with (jvm/logstore), on real Spark and
real Delta tables: racing writers of one version never both win, a replaced file keeps no stale
Hadoop checksum, and Delta's own commits (concurrent ones included) go through it."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from py4j.protocol import Py4JJavaError

from bench.log_store.log_store_race import DELTA_DEFAULT, new_store, race, write
from deltadrain.lake.delta import damaged_log
from deltadrain.runtime.jars import LOG_STORE_CLASS


def hadoop_path(spark, path: Path):
    return spark._jvm.org.apache.hadoop.fs.Path(f"file:{path}")


@pytest.mark.slow
def test_racing_writers_of_one_version_never_both_win(spark, tmp_path):
    assert spark.conf.get("spark.delta.logStore.file.impl") == LOG_STORE_CLASS
    # Delta's default store let 2 of 6 000 such rounds be won twice (bench/log_store/README.md): this race
    # alone would rarely catch a regression; the checksum assertions below and in the Delta test do.
    rounds = 1000
    won = race(spark, LOG_STORE_CLASS, tmp_path / "log", rounds, writers=3)
    assert {i: w for i, w in won.items() if len(w) != 1} == {}
    # Each version holds exactly its one winner's line, and nothing else was left behind.
    for i, (who,) in won.items():
        assert (tmp_path / "log" / f"{i:020d}.json").read_text() == f'{{"writer":"{who}"}}\n'
    assert sorted(p.name for p in (tmp_path / "log").iterdir()) == [f"{i:020d}.json" for i in range(rounds)]


@pytest.mark.slow
def test_a_replaced_file_keeps_no_stale_checksum(spark, tmp_path):
    # _last_checkpoint is rewritten in place (overwrite=true). Written first by Delta's default store,
    # it has a Hadoop .crc; replacing the file without it would fail every later checksummed read.
    last = tmp_path / "_delta_log" / "_last_checkpoint"
    # Like Delta's default store, it creates no _delta_log: a missing one is a removed table.
    with pytest.raises(Py4JJavaError, match="FileNotFoundException"):
        write(spark, new_store(spark, LOG_STORE_CLASS), last, "{}", True)
    assert not last.parent.exists()
    last.parent.mkdir()
    write(spark, new_store(spark, DELTA_DEFAULT), last, '{"version":10,"size":3}', True)
    assert (last.parent / "._last_checkpoint.crc").exists()
    write(spark, new_store(spark, LOG_STORE_CLASS), last, '{"version":20,"size":5}', True)
    assert not (last.parent / "._last_checkpoint.crc").exists()
    read = new_store(spark, LOG_STORE_CLASS).read(hadoop_path(spark, last), spark._jsc.hadoopConfiguration())
    assert read.next() == '{"version":20,"size":5}' and not read.hasNext()
    assert sorted(p.name for p in last.parent.iterdir()) == ["_last_checkpoint"]  # no temp file left


@pytest.mark.slow
def test_concurrent_delta_commits_go_through_it_and_none_is_lost(spark, tmp_path):
    path = str(tmp_path / "t")
    spark.range(0).selectExpr("id", "'seed' AS writer").write.format("delta").save(path)
    appends, rows = 10, 25

    def writer(who: int) -> None:
        for k in range(appends):
            first = (who * appends + k) * rows
            (spark.range(first, first + rows).selectExpr("id", f"'w{who}' AS writer")
             .write.format("delta").mode("append").save(path))

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    back = spark.read.format("delta").load(path)
    assert back.count() == back.select("id").distinct().count() == 3 * appends * rows
    assert sorted(r.version for r in spark.sql(f"DESCRIBE HISTORY delta.`{path}`").collect()) == list(
        range(3 * appends + 1))
    log = Path(path) / "_delta_log"
    # Delta's default store would have left a .json.crc beside every commit.
    assert not [p.name for p in log.iterdir() if p.name.endswith(".json.crc") or p.name.endswith(".tmp")]


@pytest.mark.slow
def test_a_stale_checksum_an_older_race_left_fails_reads_until_it_is_deleted(spark, tmp_path):
    # The repair docs/operations.md gives for a table damaged before this store: the race left one writer's
    # commit beside Hadoop's checksum of the other's, and deleting that checksum makes it readable.
    path = str(tmp_path / "t")
    spark.range(3).write.format("delta").save(path)
    spark.range(3, 5).write.format("delta").mode("append").save(path)
    log = tmp_path / "t" / "_delta_log"
    commit = log / f"{1:020d}.json"
    winner = commit.read_text()
    loser = "\n".join(" " + line for line in winner.splitlines())  # the same actions, other bytes
    commit.unlink()
    write(spark, new_store(spark, DELTA_DEFAULT), commit, loser, False)  # with its Hadoop checksum
    commit.write_text(winner)  # the other writer's rename replaced the file, not the checksum
    stale = log / f".{1:020d}.json.crc"
    assert stale.exists()
    delta_log = spark._jvm.org.apache.spark.sql.delta.DeltaLog
    delta_log.clearCache()
    with pytest.raises(Py4JJavaError, match="ChecksumException") as failure:
        spark.read.format("delta").load(path).count()
    # What the CLI and the Airflow task print for it: the file to delete.
    assert f"delete {stale} (Hadoop's file" in damaged_log(failure.value)
    stale.unlink()
    delta_log.clearCache()
    assert sorted(r.id for r in spark.read.format("delta").load(path).collect()) == [0, 1, 2, 3, 4]
