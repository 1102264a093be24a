"""The Python worker daemon of deltadrain's own Spark sessions (local, spark-submit, a cluster's executors):
pyspark's daemon, after importing the modules deltadrain's tasks run (`python_daemon.warm`), so that each
worker it forks has them. Named by their `spark.python.daemon.module`. Unlike a Connect server's
(`python_daemon`), it lives as long as its session, as pyspark's does.
"""

from __future__ import annotations


def main() -> None:
    from pyspark import daemon

    from deltadrain.runtime.python_daemon import warm

    warm()
    daemon.manager()


if __name__ == "__main__":
    main()
