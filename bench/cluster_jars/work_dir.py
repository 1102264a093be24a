"""One application on the embedded Spark cluster with the s3a jars in its conf: how long its first jobs
take (the executor's start, its jar fetch, a Delta write) and how large its work directory gets.

`shipped`: the jars go through spark.jars, as every driver did before; `on_workers`: the executors take
them from the worker's jar cache (spark.jars_on_workers). Needs `services up --only spark_cluster`.

Usage: python bench/cluster_jars/work_dir.py shipped|on_workers SCRATCH_DIR
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid


def main(mode: str, scratch: str) -> None:
    from pyspark.sql import SparkSession

    from deltadrain.config import load_config
    from deltadrain.config.embedded import spark_cluster_home, spark_cluster_url
    from deltadrain.lake.objectstore import S3Settings
    from deltadrain.runtime.session import cluster_conf, jars_on_workers, spark_conf

    master = spark_cluster_url(load_config())
    # An unreachable store: only the jars and confs of a lake on S3 matter here, nothing is sent to it.
    conf = spark_conf({"spark.executor.memory": "512m", "spark.cores.max": "1"},
                      S3Settings("key", "secret", "http://127.0.0.1:1"), with_login=False) | cluster_conf(master)
    if mode == "on_workers":
        conf = jars_on_workers(conf, master)
    builder = SparkSession.builder.appName(f"work-dir-{mode}").master(master)
    for key, value in conf.items():
        builder = builder.config(key, value)
    began = time.monotonic()
    spark = builder.getOrCreate()
    started = time.monotonic()
    spark.range(1000).selectExpr("sum(id)").collect()
    spark.range(10).write.format("delta").save(os.path.join(scratch, uuid.uuid4().hex))  # Delta on the executor
    done = time.monotonic()
    work = spark_cluster_home() / "work" / spark.sparkContext.applicationId
    size = subprocess.run(["du", "-sb", str(work)], capture_output=True, text=True, check=True).stdout.split()[0]
    print(f"{mode}: session {started - began:.1f} s, first jobs {done - started:.1f} s, work directory {size} bytes "
          f"({work.name}), load {os.getloadavg()[0]:.1f}", flush=True)
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:3])
