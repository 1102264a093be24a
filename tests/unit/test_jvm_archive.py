"""The class-data archive's decisions: which archive a JDK and jar set get, and when a driver uses one."""

from __future__ import annotations

from deltadrain.config import load_config
from deltadrain.dev import archive_training
from deltadrain.runtime import archive as jvm_archive

JDK = [("/jdk/release", 1000, 1), ("/jdk/lib/server/libjvm.so", 22_000_000, 2)]
JARS = [("/jars/spark-core.jar", 15_000_000, 3), ("/cache/delta-spark.jar", 6_000_000, 4)]


def test_the_fingerprint_follows_every_file_an_archive_depends_on_not_their_order():
    base = jvm_archive.fingerprint(JDK, JARS)
    assert jvm_archive.fingerprint(list(reversed(JDK)), list(reversed(JARS))) == base
    changed = [
        (JDK, [*JARS, ("/cache/extra.jar", 10, 5)]),  # a jar more
        (JDK, JARS[:1]),  # a jar less
        (JDK, [JARS[0], ("/cache/delta-spark.jar", 6_000_001, 4)]),  # rebuilt: another size
        (JDK, [JARS[0], ("/cache/delta-spark.jar", 6_000_000, 9)]),  # or another mtime
        ([JDK[0], ("/jdk/lib/server/libjvm.so", 22_000_000, 7)], JARS),  # a JDK update
    ]
    prints = {jvm_archive.fingerprint(jdk, jars) for jdk, jars in changed}
    assert len(prints) == len(changed) and base not in prints


def test_the_archive_belongs_to_the_jdk_spark_starts(tmp_path, monkeypatch):
    """$JAVA_HOME's JDK when it has a java (as spark.java_binary decides), none without one."""
    java = tmp_path / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text("#!/bin/sh\n")
    java.chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    assert jvm_archive.java_home() == (tmp_path / "jdk").resolve()
    java.unlink()
    assert jvm_archive.java_home() is None and jvm_archive.archive_path() is None


def test_a_driver_maps_the_archive_only_when_one_was_built_for_its_jdk_and_jars(tmp_path, monkeypatch):
    path = tmp_path / "drain-abc.jsa"
    monkeypatch.setattr(jvm_archive, "archive_path", lambda: path)
    assert jvm_archive.java_options() == jvm_archive.JVM_LOGGING
    path.write_bytes(b"archive")
    assert jvm_archive.java_options() == f"{jvm_archive.JVM_LOGGING} -XX:SharedArchiveFile={path}"
    monkeypatch.setattr(jvm_archive, "archive_path", lambda: None)  # no JDK found
    assert jvm_archive.java_options() == jvm_archive.JVM_LOGGING


def test_the_session_conf_keeps_its_log4j_option_and_adds_the_archives(tmp_path, monkeypatch):
    from deltadrain.runtime import session as spark

    path = tmp_path / "drain-abc.jsa"
    path.write_bytes(b"archive")
    monkeypatch.setattr(jvm_archive, "archive_path", lambda: path)
    opts = spark.spark_conf()["spark.driver.extraJavaOptions"].split()
    assert opts[0] == f"-Dlog4j2.configurationFile=file:{spark.LOG4J}"
    assert f"-XX:SharedArchiveFile={path}" in opts and "-Xlog:all=warning:stderr" in opts
    # The JVM's own warnings must not reach stdout, where a run prints its JSON summary.
    assert opts.index("-Xlog:disable") < opts.index("-Xlog:all=warning:stderr")


def test_extra_driver_options_from_the_environment_come_last_and_an_empty_value_adds_none(monkeypatch):
    from deltadrain.runtime import session as spark

    monkeypatch.setenv("DELTADRAIN_DRIVER_JAVA_OPTIONS", "")
    plain = spark.spark_conf()["spark.driver.extraJavaOptions"]
    assert "TieredStopAtLevel" not in plain
    monkeypatch.setenv("DELTADRAIN_DRIVER_JAVA_OPTIONS", " -XX:TieredStopAtLevel=1 -XX:+UseSerialGC ")
    assert spark.spark_conf()["spark.driver.extraJavaOptions"] == \
        f"{plain} -XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
    # spark-submit (the DAGs' jobs) gets the same options.
    cmd = spark.spark_submit_command("job.py", [])
    assert f"spark.driver.extraJavaOptions={plain} -XX:TieredStopAtLevel=1 -XX:+UseSerialGC" in cmd


def test_the_training_drain_uses_a_private_pipeline_and_lake(tmp_path):
    cfg = load_config(archive_training._training_config(tmp_path))
    (pipeline,) = cfg.pipelines
    assert pipeline.source.kind == "valkey" and pipeline.source.url is None  # the private Valkey
    assert all(s.startswith("jvm_archive:") for s in pipeline.source.streams)
    assert pipeline.batch_cap == archive_training.TRAINING_BATCH and not pipeline.quality.expectations
    assert cfg.lake_dir() == tmp_path / "lake"
