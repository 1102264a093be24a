"""The embedded Spark standalone cluster: a master and one worker, started from the Spark that pyspark
ships (`spark-class ... Master` / `... Worker`), on 127.0.0.1, with a shared secret
(spark.authenticate). A drain with `spark.master` (DELTADRAIN_SPARK_MASTER) set to it runs its tasks in
executor processes the worker starts: nothing may depend on the driver's disk (docs/object-store.md).

The service's process is a small supervisor (`main`) that starts both and ends when either ends, so
that `services down` stops the process group: master, worker and the executors the worker started.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from deltadrain.config import DeltadrainConfig
from deltadrain.config.embedded import (
    ports,
    spark_cluster_home,
    spark_cluster_secret_file,
    spark_cluster_url,
    write_private,
)
from deltadrain.dev.services.process import Service, port_open
from deltadrain.paths import PROJECT_ROOT

MASTER = "org.apache.spark.deploy.master.Master"
WORKER = "org.apache.spark.deploy.worker.Worker"
# What the one worker offers: an executor with a core and the default executor memory, and room for one more.
WORKER_CORES, WORKER_MEMORY = "2", "2g"
# An application that sets no spark.cores.max gets one core: the Connect server, living on, would
# otherwise hold both, and a spark-submit task's application would wait for a core forever.
DEFAULT_CORES = "1"


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


# The worker deletes the work directory (executor logs, anything an application fetched) of each
# stopped application once nothing in it changed for a day; it looks every hour. Spark's default is off.
CLEANUP = {"spark.worker.cleanup.enabled": "true", "spark.worker.cleanup.interval": "3600",
           "spark.worker.cleanup.appDataTtl": "86400"}


def properties(secret: str, ui_port: int) -> str:
    # spark.authenticate: the master, the worker and every application must present the secret. The
    # master's REST submission server would be one more port open to any local user: off.
    return (f"spark.authenticate=true\nspark.authenticate.secret={secret}\nspark.master.rest.enabled=false\n"
            f"spark.master.ui.port={ui_port}\nspark.worker.ui.port=0\nspark.ui.reverseProxy=false\n"
            f"spark.deploy.defaultCores={DEFAULT_CORES}\n" + "".join(f"{key}={value}\n" for key, value in CLEANUP.items()))


def alive_workers(ui_port: int) -> int:
    """How many workers the master counts as alive (its web UI's /json)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json", timeout=3) as answer:
        return int(json.load(answer).get("aliveworkers", 0))


def spark_cluster_service(cfg: DeltadrainConfig) -> Service:
    p = ports(cfg)
    home = spark_cluster_home()
    props = home / "spark.properties"

    def prepare() -> None:
        home.mkdir(parents=True, exist_ok=True)
        write_private(spark_cluster_secret_file(), secrets.token_urlsafe(32))
        props.unlink(missing_ok=True)  # made anew, owner-only, on each start (the ports may change)
        write_private(props, properties(spark_cluster_secret_file().read_text().strip(), p.spark_cluster_ui))

    def command() -> list[str]:
        from deltadrain.runtime.session import check_java

        check_java()
        return [sys.executable, "-m", "deltadrain.dev.services.spark_cluster", str(props), str(p.spark_cluster),
                str(p.spark_cluster_ui), str(home / "work")]

    def healthy() -> bool:
        return port_open(p.spark_cluster) and port_open(p.spark_cluster_ui) and alive_workers(p.spark_cluster_ui) >= 1

    # Executors run deltadrain's Python (a drain's staging tasks): this venv's, importing the project.
    path = os.pathsep.join([str(PROJECT_ROOT), str(PROJECT_ROOT / "include"),
                            *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {"SPARK_HOME": str(spark_home()), "SPARK_LOCAL_IP": "127.0.0.1", "PYTHONPATH": path,
           "PYSPARK_PYTHON": sys.executable, "SPARK_CONNECT_MODE_ENABLED": None}
    return Service("spark_cluster", home, [p.spark_cluster, p.spark_cluster_ui], command, healthy, env=env, prepare=prepare, start_timeout=120,
                   stop_timeout=30, describe=lambda: f"{spark_cluster_url(cfg)} (1 worker, web UI http://127.0.0.1:{p.spark_cluster_ui})")


def main(argv: list[str]) -> int:
    """Start the master, then the worker; return when either ends (stopping the other)."""
    from deltadrain.runtime.java import java_binary

    props, port, ui_port, work = argv
    os.environ.setdefault("JAVA_HOME", str(Path(java_binary()).resolve().parents[1]))
    spark_class = str(spark_home() / "bin" / "spark-class")
    master = subprocess.Popen([spark_class, MASTER, "--host", "127.0.0.1", "--port", port, "--webui-port", ui_port,
                               "--properties-file", props])
    deadline = time.monotonic() + 90
    while not port_open(int(port)) and master.poll() is None and time.monotonic() < deadline:
        time.sleep(0.3)
    worker = subprocess.Popen([spark_class, WORKER, "--host", "127.0.0.1", "--cores", WORKER_CORES, "--memory",
                               WORKER_MEMORY, "--work-dir", work, "--properties-file", props,
                               f"spark://127.0.0.1:{port}"])
    def stop(*_) -> None:
        master.terminate()
        worker.terminate()
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    while master.poll() is None and worker.poll() is None:
        time.sleep(0.5)
    for proc in (master, worker):
        if proc.poll() is None:
            proc.terminate()
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
