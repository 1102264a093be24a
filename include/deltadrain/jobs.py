"""What every spark-submit entry point (spark_jobs/) shares: the session, the summary line, the error line.

The Airflow operators read `deltadrain-summary: {json}` as the task's XCom and
`deltadrain: error: ...` as the task's failure message (deltadrain.orchestration.operators).
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable

from deltadrain.errors import DeltadrainError, error_line
from deltadrain.lake import damaged_log

SUMMARY_PREFIX = "deltadrain-summary: "
ERROR_PREFIX = "deltadrain: error: "


def run_job(body: Callable[[object], object]) -> int:
    """Run `body(spark)` and print its result's summary line; exit code 1 with the error line on failure."""
    from pyspark.sql import SparkSession

    from deltadrain.logs import configure

    configure()
    try:
        spark = SparkSession.builder.getOrCreate()  # configured by spark-submit with the cached jars
        result = body(spark)
    except DeltadrainError as exc:
        print(f"{ERROR_PREFIX}{' '.join(str(exc).split())}", flush=True)
        return 1
    except Exception as exc:
        traceback.print_exc()  # the whole of it in the task log; the failure message is its own line
        print(f"{ERROR_PREFIX}{damaged_log(exc) or error_line(exc)}", flush=True)
        return 1
    print(f"{SUMMARY_PREFIX}{result.line()}", flush=True)
    return 0


def exit_with(code: int) -> None:
    sys.stdout.flush()
    sys.exit(code)
