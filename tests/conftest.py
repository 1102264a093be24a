"""Session fixtures: real embedded Valkey, Kafka and Spark Connect server, a real Spark session, an
isolated state home.

Every test session, and every pytest-xdist worker of one (`make test` runs three), gets its own
DELTADRAIN_HOME, free ports and Airflow DB, so a developer's running demo services are never touched
and two sessions or workers never collide.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# py4j logs "closing connection" after pytest closed its capture streams.
logging.getLogger("py4j").setLevel(logging.WARNING)


# Ports below the kernel's ephemeral range (32768 and up by default), so that none the kernel hands out at
# random (a Spark driver's listeners, an outgoing connection) can be one of them: a session reserves its
# services' ports at its start, and they lie unbound for minutes between the tests that start those services.
# Each pytest-xdist worker draws from a block of its own; draws differ per process.
PORT_BASE, PORT_BLOCK, PORT_BLOCKS = 20000, 1000, 12
_DRAW = random.Random()
_GIVEN: set[int] = set()


def free_port() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    block = int(worker.removeprefix("gw")) + 1 if worker.startswith("gw") else 0
    start = PORT_BASE + PORT_BLOCK * (block % PORT_BLOCKS)
    for _ in range(500):
        port = start + _DRAW.randrange(PORT_BLOCK)
        if port in _GIVEN:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _GIVEN.add(port)
        return port
    raise RuntimeError(f"no free port in 127.0.0.1:{start}-{start + PORT_BLOCK - 1}")


# `make test` (and so CI) sets this: the whole suite must run. A test skipped (a missing service or
# binary), an xfail, or one deselected (-m, -k, or the same through PYTEST_ADDOPTS) fails the
# session, so a green run never hides tests that did not run.
REQUIRE_ALL = "DELTADRAIN_REQUIRE_ALL_TESTS"
GIVEN = "DELTADRAIN_TEST_GIVEN_AIRFLOW_SETTINGS"


def not_run(stats: dict) -> dict[str, int]:
    return {kind: len(stats.get(kind, [])) for kind in ("skipped", "xfailed", "xpassed", "deselected")
            if stats.get(kind)}


def pytest_sessionfinish(session, exitstatus):
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if os.environ.get(REQUIRE_ALL) != "1" or reporter is None or exitstatus != 0:
        return
    if missing := not_run(reporter.stats):
        reporter.ensure_newline()
        reporter.write_line(f"deltadrain: {REQUIRE_ALL}=1 and not every test ran: {missing}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# Files whose tests take minutes each, with their seconds on a quiet 2-core machine (docs/testing.md, "Where
# the time goes"): each worker's share of the collection starts with some of them (tests/support/ordering.py).
# One left where the alphabet puts it starts late and holds the run open alone.
LONG_FILES = {"integration/test_airflow_e2e.py": 480, "integration/test_s3_cluster.py": 440,
              "integration/test_avro_payloads.py": 190, "integration/test_cdc.py": 170,
              "integration/test_view.py": 160}


def pytest_collection_modifyitems(config, items):
    from tests.support.ordering import long_first

    # pytest-xdist sets the count in each worker; every worker must compute the same order.
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    items[:] = long_first(items, lambda item: item.path.relative_to(ROOT / "tests").as_posix(), LONG_FILES,
                          workers)


# Every driver the suite starts collects with the throughput collector: G1's concurrent marking and write
# barriers cost more CPU than they buy on heaps this small (bench/suite_jvms/README.md, "Garbage collector").
TEST_GC = os.environ.get("DELTADRAIN_TEST_GC", "-XX:+UseParallelGC")
# The long-lived drivers (the session's Spark JVM, the worker's Connect server) give a method to C2 only once it
# is about three times as hot as HotSpot's default asks: Spark generates new classes for many queries, and C2
# compiled much of that code for the few times it ran (bench/suite_jvms/README.md, "C2 thresholds").
TEST_JIT = os.environ.get("DELTADRAIN_TEST_JIT", "-XX:Tier4InvocationThreshold=15000 -XX:Tier4MinInvocationThreshold=1800 "
                          "-XX:Tier4CompileThreshold=45000 -XX:Tier4BackEdgeThreshold=120000")
LONG_LIVED_JVM = f"{TEST_GC} {TEST_JIT}".strip()


def pytest_configure(config):
    # Set before anything reads them; subprocesses (CLI, spark-submit, Airflow) inherit them.
    home = Path(tempfile.mkdtemp(prefix="deltadrain-test-"))
    os.environ["DELTADRAIN_HOME"] = str(home)
    os.environ.setdefault("DELTADRAIN_CONFIG", str(ROOT / "config" / "pipelines.yaml"))
    for name in ("VALKEY", "VALKEY_TLS", "KAFKA", "KAFKA_CONTROLLER", "KAFKA_SASL", "AIRFLOW", "SPARK_CONNECT", "S3",
                 "REGISTRY", "POSTGRES", "DEBEZIUM"):
        os.environ[f"DELTADRAIN_{name}_PORT"] = str(free_port())
    os.environ.setdefault("DELTADRAIN_DRIVER_MEMORY", "1g")
    # The suite starts a driver JVM per CLI drain, spark-submit and DAG run, each living seconds: C1
    # only spends ~30% less CPU on them, and the suite is CPU-bound on two cores
    # (bench/suite_jvms/README.md).
    # The session's own Spark JVM and the worker's Connect server keep the default JIT (their fixtures).
    os.environ.setdefault("DELTADRAIN_DRIVER_JAVA_OPTIONS", f"-XX:TieredStopAtLevel=1 {TEST_GC}")
    # Airflow reads its settings when first imported: point it at this session's own home and DB
    # (the same environment the embedded `airflow standalone` gets).
    from deltadrain.config import load_config
    from deltadrain.config.embedded import airflow_env

    # Settings the developer gave are kept. Those this hook set in the process that started pytest-xdist's
    # workers are set again in each worker: a worker has a home, ports and Airflow DB of its own.
    given = os.environ.setdefault(GIVEN, ",".join(k for k in os.environ if k.startswith("AIRFLOW")))
    # A worker inherits what the hook set in that process: dropped, or airflow_env would take those for a
    # developer's own and keep them (the connections to that process's Spark Connect and S3 ports).
    for key in [k for k in os.environ if k.startswith("AIRFLOW") and k not in given.split(",")]:
        del os.environ[key]
    for key, value in airflow_env(load_config()).items():
        # The DB stays the default under AIRFLOW_HOME, so that subprocesses with another home get theirs.
        if key.startswith("AIRFLOW") and key != "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN" and key not in given.split(","):
            os.environ[key] = value


@pytest.fixture(scope="session")
def cfg():
    from deltadrain.config import load_config

    return load_config()


def _service(cfg, name):
    from deltadrain.dev import services

    services.up(cfg, [name])
    yield services.FACTORIES[name](cfg)
    services.down(cfg, [name])


@pytest.fixture(scope="session")
def valkey_server(cfg):
    yield from _service(cfg, "valkey")


@pytest.fixture(scope="session")
def valkey_tls_server(cfg, valkey_server):
    """The embedded Valkey's TLS port: stunnel in front of the session's Valkey."""
    yield from _service(cfg, "valkey_tls")


@pytest.fixture(scope="session")
def kafka_broker(cfg):
    yield from _service(cfg, "kafka")


def start_connect_server(cfg) -> list[dict]:
    """The worker's Spark Connect server as `services up` starts it (its rows), with both compilers (it lives
    the whole session, like the `spark` fixture's JVM: LONG_LIVED_JVM) and the demo's driver memory: every DAG test of the
    worker runs on it. Without the warm-up: the worker's first batches pay once what it would cost at start,
    and test_services_up_status_down_through_the_cli runs it."""
    from deltadrain.dev import services

    with pytest.MonkeyPatch.context() as env:
        env.setenv("DELTADRAIN_DRIVER_JAVA_OPTIONS", LONG_LIVED_JVM)
        env.setenv("DELTADRAIN_DRIVER_MEMORY", "2g")
        return services.up(cfg, ["spark_connect"], warm=False)


@pytest.fixture(scope="session")
def _connect_server_of_session(cfg):
    from deltadrain.dev import services

    start_connect_server(cfg)
    yield services.FACTORIES["spark_connect"](cfg)
    services.down(cfg, ["spark_connect"])


@pytest.fixture
def spark_connect_server(cfg, _connect_server_of_session):
    """The session's embedded Spark Connect server, running when the test starts. A server found gone
    (a test killed it, or it died) is started again, with a warning that carries its log's last lines:
    one death shows where it happened instead of failing every test after it."""
    import warnings

    from deltadrain.dev import services
    from deltadrain.dev.services.process import port_open

    svc = _connect_server_of_session
    if not port_open(svc.ports[0]):
        tail = svc.log_file.read_text(errors="replace").splitlines()[-15:] if svc.log_file.exists() else []
        warnings.warn("the session's Spark Connect server was gone before this test; started again. Its log "
                      "ended:\n" + "\n".join(tail), stacklevel=1)
        services.down(cfg, ["spark_connect"])  # what is left of it (its Python workers)
        start_connect_server(cfg)
    return svc


@pytest.fixture(scope="session")
def s3_server(cfg):
    """The embedded S3 server (S3Proxy on files under this session's home), with its login."""
    yield from _service(cfg, "s3")


@pytest.fixture(scope="session")
def registry_server(cfg):
    """The embedded schema registry (Apicurio Registry from the jar cache, schemas under this session's home)."""
    yield from _service(cfg, "registry")


@pytest.fixture(scope="session")
def postgres_server(cfg):
    """The embedded PostgreSQL (Debian's server, wal_level=logical, data under this session's home)."""
    yield from _service(cfg, "postgres")


@pytest.fixture(scope="session")
def debezium_connector(cfg, kafka_broker, postgres_server):
    """Debezium's Postgres connector on Kafka Connect: every table of the session's PostgreSQL, its
    changes into the session's broker (topics cdc.<schema>.<table>)."""
    yield from _service(cfg, "debezium")


@pytest.fixture(scope="session")
def spark():
    from deltadrain.runtime.session import get_spark

    # This JVM lives the whole session and runs its heaviest work (compaction, batch after batch): it
    # keeps both compilers (LONG_LIVED_JVM). C1 only is for the short-lived drivers the tests spawn.
    with pytest.MonkeyPatch.context() as env:
        env.setenv("DELTADRAIN_DRIVER_JAVA_OPTIONS", LONG_LIVED_JVM)
        session = get_spark("deltadrain-tests")
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def airflow_db():
    """A migrated metadata DB (SQLite under this session's home) for dag.test() runs."""
    import subprocess
    import sys

    airflow = str(Path(sys.executable).parent / "airflow")
    done = subprocess.run([airflow, "db", "migrate"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    yield os.environ["AIRFLOW_HOME"]
