"""The project's Spark session: Delta and the Kafka source from the jar cache, nothing resolved online."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from deltadrain.errors import PrerequisiteError
from deltadrain.runtime.jars import CONNECT_SERVER_CLASS, LOG_STORE_CLASS, classpath
from deltadrain.runtime.java import check_java, java_binary  # noqa: F401 (spark.java_binary: the JDK a driver starts)

DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    # Delta's own store for file: paths can let two writers both commit one version (check, then a
    # rename that replaces); ours publishes a commit with a hard link, refused if the version exists.
    "spark.delta.logStore.file.impl": LOG_STORE_CLASS,
}

LOG4J = Path(__file__).parents[1] / "resources" / "log4j2.properties"

# Small-machine defaults: a drain batch is thousands to a few million rows, not a cluster job.
DEFAULT_CONF = {
    "spark.sql.shuffle.partitions": "4",
    # Delta rebuilds a table's file list (its state) with this many tasks on every new snapshot, i.e.
    # before every MERGE. At Delta's default of 50, a one-row MERGE costs ~3.6 s on 2 cores; at 2, ~1.3 s
    # (bench/merge_confs/README.md, "Earlier measurements: Delta's snapshot partitions").
    "spark.databricks.delta.snapshotPartitions": "4",
    # VACUUM lists a table's files in this many tasks (Spark's default: 10 000, whatever the table's
    # size): about a minute for a six-file table on 2 cores; at 4, ~5 s (bench/maintenance/README.md).
    # Raise these three on a cluster with large tables.
    "spark.sql.sources.parallelPartitionDiscovery.parallelism": "4",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    # Python workers fork from a daemon that has deltadrain's task modules imported already.
    "spark.python.daemon.module": "deltadrain.runtime.warm_daemon",
    "spark.sql.session.timeZone": "UTC",
    "spark.driver.memory": os.environ.get("DELTADRAIN_DRIVER_MEMORY", "2g"),
    # The JVM must not resolve anything at run time.
    "spark.jars.ivy": "/nonexistent-deltadrain-does-not-use-ivy",
    "spark.databricks.delta.schema.autoMerge.enabled": "false",
    "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{LOG4J}",
}


# The runtime SQL confs of DEFAULT_CONF: a Connect session sets these for itself, so that they hold on a
# server deltadrain did not start too. The rest (extensions, catalog, log store, jars, memory) is fixed
# when a server starts: the embedded server gets all of spark_conf().
SESSION_KEYS = ("spark.sql.shuffle.partitions", "spark.databricks.delta.snapshotPartitions",
                "spark.sql.sources.parallelPartitionDiscovery.parallelism", "spark.sql.session.timeZone",
                "spark.databricks.delta.schema.autoMerge.enabled")

# The embedded server's caps on the status store of past work (`connect_server_conf`).
UI_RETENTION = {"spark.sql.ui.retainedExecutions": "50", "spark.ui.retainedJobs": "100",
                "spark.ui.retainedStages": "100", "spark.ui.retainedTasks": "1000"}

CONNECT_RETRIES = 12  # backoffs of 0.05, 0.2, 0.8, 3.2 s, then 10 s: about 85 s in all
CONNECT_LOG4J = Path(__file__).parents[1] / "resources" / "log4j2-connect.properties"
# spark-submit's word for "the main class is on the class path already".
SPARK_INTERNAL = "spark-internal"


def spark_conf(extra: dict[str, str] | None = None, object_store=None, *,
               with_login: bool = True) -> dict[str, str]:
    """The full conf of a deltadrain session; spark-submit in the DAGs passes the same. With
    `object_store` (objectstore.S3Settings), the session also reaches s3a:// paths: hadoop-aws and
    deltadrain's S3 log store from the s3a jar kind, and the store's endpoint (and, unless
    with_login is false, its login: never on a command line)."""
    from deltadrain.runtime.archive import java_options

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
        from deltadrain.lake.objectstore import spark_conf as s3a_conf

        conf.update(s3a_conf(object_store, with_login=with_login))
    conf.update(extra or {})
    return conf


def get_spark(app_name: str = "deltadrain", master: str | None = None, extra: dict[str, str] | None = None,
              object_store=None, cfg=None):
    """A Delta-enabled SparkSession (reused if one is already running in this process). With
    `object_store` (objectstore.S3Settings), or a `cfg` whose lake is on the object store, it reaches
    s3a:// paths too; that takes a new JVM, as the hadoop-aws jars join the class path only when it starts."""
    from pyspark.sql import SparkSession

    if object_store is None and cfg is not None:
        from deltadrain.lake.objectstore import for_config

        object_store = for_config(cfg)
    conf = spark_conf(extra, object_store)  # raises the jar-cache error before a JVM starts
    check_java()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    master = master or os.environ.get("DELTADRAIN_SPARK_MASTER", "local[*]")
    builder = SparkSession.builder.appName(app_name).master(master)
    conf = jars_on_workers(conf, master) | cluster_conf(master)
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def embedded_cluster(master: str) -> bool:
    from deltadrain.config import load_config
    from deltadrain.config.embedded import spark_cluster_url

    return master.startswith("spark://127.0.0.1:") and master == spark_cluster_url(load_config())


# Where the workers of a cluster of one's own keep the jar cache (`make jars` run on each of them): when
# set, their executors put the jars on their class path from there and no application ships them.
WORKER_JARS_ENV = "DELTADRAIN_WORKER_JARS"


def workers_jar_cache(master: str) -> Path | None:
    """Where `master`'s workers hold the jar cache: the embedded cluster's worker is on this machine and
    reads this one; another cluster's where DELTADRAIN_WORKER_JARS says; None when they do not have it."""
    from deltadrain.paths import jar_cache

    if not master.startswith("spark://"):
        return None
    if where := os.environ.get(WORKER_JARS_ENV, "").strip():
        return Path(where)
    return jar_cache() if embedded_cluster(master) else None


def jars_on_workers(conf: dict[str, str], master: str) -> dict[str, str]:
    """`conf` for a driver on `master`: when its workers hold the jar cache, the executors take the jars
    from their own disk (spark.executor.extraClassPath) and the driver from its class path, instead of
    `spark.jars`. Every jar in spark.jars (even a `local:` one) is copied into each executor's work
    directory, once per application: the s3a jars alone are hundreds of MB (docs/object-store.md)."""
    from deltadrain.paths import jar_cache

    root = workers_jar_cache(master)
    jars = [Path(j) for j in conf.get("spark.jars", "").split(",") if j]
    if root is None or not jars:
        return conf
    here = jar_cache()
    on_worker = [root / j.relative_to(here) if j.is_relative_to(here) else j for j in jars]
    conf = {k: v for k, v in conf.items() if k != "spark.jars"}
    return conf | {"spark.driver.extraClassPath": os.pathsep.join(str(j) for j in jars),
                   "spark.executor.extraClassPath": os.pathsep.join(str(j) for j in on_worker)}


def cluster_conf(master: str) -> dict[str, str]:
    """What a driver needs to join the embedded cluster when `master` is it (its secret), else nothing."""
    if not master.startswith("spark://"):
        return {}
    from deltadrain.config.embedded import spark_cluster_auth_conf

    return spark_cluster_auth_conf(master)


def spark_submit_command(script: str, args: list[str], master: str | None = None,
                         extra: dict[str, str] | None = None) -> list[str]:
    """The spark-submit command line for a deltadrain job, with the same conf as get_spark()
    (the jar cache, Delta, the venv's Python). Airflow's SparkSubmitOperator passes the same conf."""
    import pyspark

    submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    cmd = [str(submit), "--master", master or os.environ.get("DELTADRAIN_SPARK_MASTER", "local[*]"),
           "--name", f"deltadrain-{Path(script).stem}"]
    for key, value in jars_on_workers(spark_conf(extra), cmd[2]).items():
        cmd += ["--conf", f"{key}={value}"]
    return [*cmd, script, *args]


def connect_server_conf(port: int, master: str | None = None, object_store=None) -> dict[str, str]:
    """A Spark Connect server's conf: a local driver's (spark_conf()), gRPC on 127.0.0.1:`port`, and its
    own log4j file, which also logs the server's start. With a local master every socket the driver opens
    is bound to loopback; against a cluster master the executors must reach the driver, so the driver's
    address stays Spark's choice. With `object_store` it reaches s3a:// paths, without the login (which
    goes in a properties file: `connect_server_command`)."""
    master = master or os.environ.get("DELTADRAIN_SPARK_MASTER", "local[*]")
    conf = spark_conf({"spark.app.name": "deltadrain-connect",
                       "spark.connect.grpc.binding.address": "127.0.0.1",
                       "spark.connect.grpc.binding.port": str(port),
                       # A client that died (a task SIGKILLed) leaves its query running until no one has
                       # reattached for this long; then the server interrupts it (a hung transform's
                       # workers are freed). Its session's confs and views go after the idle timeout.
                       "spark.connect.execute.manager.detachedTimeout": "60s",
                       "spark.connect.execute.manager.maintenanceInterval": "10s",
                       "spark.connect.session.manager.defaultSessionTimeout": "15min",
                       # Spark 4.1 keeps a Python worker daemon per Connect session for good
                       # (SPARK-54055); this one exits once idle, so a server that lives on stays flat.
                       "spark.python.daemon.module": "deltadrain.runtime.python_daemon",
                       # Spark keeps what its UI would show of past queries, jobs, stages and tasks (the
                       # UI is off, the store is not) up to 1 000 queries and 100 000 tasks by default:
                       # in a server that lives on, a heap that grows for thousands of batches.
                       **UI_RETENTION},
                      object_store, with_login=False)
    conf["spark.driver.extraJavaOptions"] = conf["spark.driver.extraJavaOptions"].replace(
        f"-Dlog4j2.configurationFile=file:{LOG4J}", f"-Dlog4j2.configurationFile=file:{CONNECT_LOG4J}")
    if master.startswith("local") or embedded_cluster(master):  # the embedded cluster is on 127.0.0.1 too
        conf |= {"spark.driver.bindAddress": "127.0.0.1", "spark.driver.host": "127.0.0.1"}
    return jars_on_workers(conf, master)


def connect_server_command(port: int, master: str | None = None, object_store=None,
                           login_file: Path | None = None) -> list[str]:
    """spark-submit starting Spark's Connect server (its jar ships with pyspark) through deltadrain's entry
    point (jvm/connect: the server without per-session artifact isolation, so that a new session reuses
    the classes Spark generated for the sessions before it), with the jar cache's Delta, log store and
    Kafka source on the class path: nothing is resolved online. With `object_store` also hadoop-aws; the
    login (and the embedded cluster's secret) come in `login_file` (objectstore.private_properties)."""
    import pyspark

    submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    cmd = [str(submit), "--master", master or os.environ.get("DELTADRAIN_SPARK_MASTER", "local[*]"),
           "--class", CONNECT_SERVER_CLASS]
    if login_file is not None:
        cmd += ["--properties-file", str(login_file)]
    for key, value in connect_server_conf(port, master, object_store).items():
        cmd += ["--conf", f"{key}={value}"]
    # No application jar: the entry point is on the class path with the cache's other jars. Spark ships
    # an application jar to every executor, which a cluster whose workers hold the cache must not get.
    return [*cmd, SPARK_INTERNAL]


def session_conf(extra: dict[str, str] | None = None) -> dict[str, str]:
    return {**{key: DEFAULT_CONF[key] for key in SESSION_KEYS}, **(extra or {})}


def _address(url: str) -> tuple[str, int]:
    from urllib.parse import urlparse

    parsed = urlparse(url.replace("sc://", "http://", 1))
    return parsed.hostname or "localhost", parsed.port or 15002


def server_address(url: str) -> str:
    """`host:port` of a Connect URL, as deltadrain's messages name a server."""
    host, port = _address(url)
    return f"{host}:{port}"


def server_unreachable(url: str, conn_id: str | None = None, config: Path | None = None,
                       timeout: float = 5) -> str | None:
    """Why nothing can be sent to the Connect server at `url`, or None when its port answers. Asked before
    a session starts: the client would otherwise retry a refused connection for minutes. `config`: the
    config file the fix's command names."""
    import socket

    from deltadrain.paths import command_line

    host, port = _address(url)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as exc:
        named = f" (Airflow connection '{conn_id}')" if conn_id else ""
        return (f"the Spark Connect server at {host}:{port}{named} does not answer ({exc.strerror or exc}). "
                f"Start it with `{command_line('services up', config)}` (the embedded one), point the connection "
                "at your server, or set `spark.executor: submit` in the config to run each job in a driver of its own")
    return None


# What a Connect client raises when its server is gone or was restarted under it: refused or reset
# connections (gRPC's UNAVAILABLE) once its retries are spent, a session the new server does not hold,
# and, after the client gave its session up on such an error, no session at all.
_SERVER_LOST = ("RETRIES_EXCEEDED", "StatusCode.UNAVAILABLE", "SESSION_CHANGED", "INVALID_HANDLE.SESSION_NOT_FOUND",
                "INVALID_HANDLE.SESSION_CLOSED", "NO_ACTIVE_SESSION")


def connect_lost(exc: BaseException, config: Path | None = None) -> str | None:
    """What to do when a run lost its Spark Connect server, or None for other errors. `config`: the
    config file the commands it names read."""
    from deltadrain.paths import command_line

    text = f"{type(exc).__name__} {exc}"
    if not any(mark in text for mark in _SERVER_LOST):
        return None
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
    return (f"the Spark Connect server went away during the run ({first[:300]}). Nothing after that was "
            "committed or acknowledged; the run's claims wait for the next run, which finishes the work "
            f"once the server is back (`{command_line('services status', config)}`, "
            f"`{command_line('services up', config)}`)")


def close_own_channel_only(session) -> None:
    """Make closing `session`'s client close its own gRPC channel and nothing else.

    pyspark's close also shuts down the release thread pool that every Connect client of the process
    shares, and a session that is garbage-collected closes its client from `__del__`. The collector
    runs wherever an allocation triggers it, also inside that pool's `submit`, which holds the pool's
    lock while it starts a thread: the shutdown then waits for that lock in the same thread, and the
    process hangs, waiting on the server's answer as it seems, with the server idle. The pool stays
    for the process's life instead: idle threads, at most one per core."""
    client = session.client

    def close() -> None:
        client._channel.close()
        client._closed = True

    client.close = close


def connect_session(url: str, extra: dict[str, str] | None = None, *, purpose: str = "deltadrain",
                    conn_id: str | None = None, config: Path | None = None):
    """A new Spark Connect session on the server at `url` (`sc://host:port`), with deltadrain's session
    confs (and `extra`): each call its own session, so confs set on one (a txnAppId) never reach another.
    A server that does not answer is a PrerequisiteError naming the fix.

    pyspark's rule: once a process made a Connect session it is a Connect client (pyspark's functions
    build Connect columns), and get_spark() can no longer start a local driver in it. The mark is
    SPARK_CONNECT_MODE_ENABLED in os.environ: children inherit it, so start one that needs a local
    driver without it."""
    from pyspark.sql import SparkSession

    if why := server_unreachable(url, conn_id, config):
        raise PrerequisiteError(f"{purpose}: {why}")
    from pyspark.sql.connect.client.retries import DefaultPolicy

    builder = SparkSession.builder.remote(url)
    for key, value in session_conf(extra).items():
        builder = builder.config(key, value)
    session = builder.create()
    close_own_channel_only(session)
    # pyspark retries an unreachable server for ten minutes and more. A task waits about a minute and a
    # half, which rides out a server being restarted (`services up` takes under a minute), and then fails
    # with the server's error: its claims wait for the next run.
    session.client.set_retry_policies([DefaultPolicy(max_retries=CONNECT_RETRIES, max_backoff=10_000)])
    return session
