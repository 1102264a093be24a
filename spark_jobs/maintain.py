"""spark-submit entry point: OPTIMIZE and VACUUM of one pipeline's tables, or with --shared of the shared tables (the maintenance DAG).

Thin on purpose: the job's arguments and body are deltadrain.jobs, which an Airflow task also runs
through Spark Connect. Prints `deltadrain-summary: {json}` on success and `deltadrain: error: ...`
with exit code 1 on failure.
"""

import sys

from deltadrain.jobs import main

if __name__ == "__main__":
    sys.exit(main("maintain"))
