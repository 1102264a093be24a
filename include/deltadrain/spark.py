"""The project's Spark session: Delta and the Kafka source from the jar cache, nothing resolved online."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from deltadrain.jars import LOG_STORE_CLASS, classpath
from deltadrain.java import check_java, java_binary  # noqa: F401 (spark.java_binary: the JDK a driver starts)

DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    # Delta's own store for file: paths can let two writers both commit one version (check, then a
    # rename that replaces); ours publishes a commit with a hard link, refused if the version exists.
    "spark.delta.logStore.file.impl": LOG_STORE_CLASS,
}

LOG4J = Path(__file__).parent / "resources" / "log4j2.properties"

# Small-machine defaults: a drain batch is thousands to a few million rows, not a cluster job.
DEFAULT_CONF = {
    "spark.sql.shuffle.partitions": "4",
    # Delta rebuilds a table's file list (its state) with this many tasks on every new snapshot, i.e.
    # before every MERGE. At Delta's default of 50, a one-row MERGE costs ~3.5 s on 2 cores; at 4, ~1 s
    # (docs/benchmarks.md).
    "spark.databricks.delta.snapshotPartitions": "4",
    # VACUUM lists a table's files in this many tasks (Spark's default: 10 000, whatever the table's
    # size): about a minute for a six-file table on 2 cores; at 4, ~5 s (docs/benchmarks.md, "VACUUM").
    # Raise these three on a cluster with large tables.
    "spark.sql.sources.parallelPartitionDiscovery.parallelism": "4",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.driver.memory": os.environ.get("DELTADRAIN_DRIVER_MEMORY", "2g"),
    # The JVM must not resolve anything at run time.
    "spark.jars.ivy": "/nonexistent-deltadrain-does-not-use-ivy",
    "spark.databricks.delta.schema.autoMerge.enabled": "false",
    "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{LOG4J}",
}


def spark_conf(extra: dict[str, str] | None = None, object_store=None, *,
               with_login: bool = True) -> dict[str, str]:
    """The full conf of a deltadrain session; spark-submit in the DAGs passes the same. With
    `object_store` (objectstore.S3Settings), the session also reaches s3a:// paths: hadoop-aws and
    deltadrain's S3 log store from the s3a jar kind, and the store's endpoint (and, unless
    with_login is false, its login: never on a command line)."""
    from deltadrain.jvm_archive import java_options

    jars = classpath("spark") + (classpath("s3a") if object_store is not None else [])
    conf = {**DEFAULT_CONF, **DELTA_CONF, "spark.jars": ",".join(str(j) for j in jars),
            # Python workers must run this interpreter (its venv has deltadrain), not `python3` on PATH.
            "spark.pyspark.python": sys.executable, "spark.pyspark.driver.python": sys.executable}
    # The class-data archive `make install` built, if any: the driver JVM starts ~4 s sooner.
    conf["spark.driver.extraJavaOptions"] += f" {java_options()}"
    # Extra HotSpot options for every driver (the test suite's: C1 only, for its short-lived JVMs).
    if more := os.environ.get("DELTADRAIN_DRIVER_JAVA_OPTIONS", "").strip():
        conf["spark.driver.extraJavaOptions"] += f" {more}"
    if object_store is not None:
        from deltadrain.objectstore import spark_conf as s3a_conf

        conf.update(s3a_conf(object_store, with_login=with_login))
    conf.update(extra or {})
    return conf


def get_spark(app_name: str = "deltadrain", master: str | None = None, extra: dict[str, str] | None = None,
              object_store=None):
    """A Delta-enabled SparkSession (reused if one is already running in this process). With
    `object_store` (objectstore.S3Settings) it reaches s3a:// paths too; that takes a new JVM, as the
    hadoop-aws jars join the class path only when it starts."""
    from pyspark.sql import SparkSession

    conf = spark_conf(extra, object_store)  # raises the jar-cache error before a JVM starts
    check_java()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name).master(
        master or os.environ.get("DELTADRAIN_SPARK_MASTER", "local[*]"))
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def spark_submit_command(script: str, args: list[str], master: str | None = None,
                         extra: dict[str, str] | None = None) -> list[str]:
    """The spark-submit command line for a deltadrain job, with the same conf as get_spark()
    (the jar cache, Delta, the venv's Python). Airflow's SparkSubmitOperator passes the same conf."""
    import pyspark

    submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    cmd = [str(submit), "--master", master or os.environ.get("DELTADRAIN_SPARK_MASTER", "local[*]"),
           "--name", f"deltadrain-{Path(script).stem}"]
    for key, value in spark_conf(extra).items():
        cmd += ["--conf", f"{key}={value}"]
    return [*cmd, script, *args]
