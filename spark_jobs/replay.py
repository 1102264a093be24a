"""spark-submit entry point: a replay of dead letters or a reprocess (what the replay DAG submits).

Thin on purpose: the job's arguments and body are deltadrain.jobs, which an Airflow task also runs
through Spark Connect. Prints `deltadrain-summary: {json}` on success and `deltadrain: error: ...`
with exit code 1 on failure.
"""

import sys

from deltadrain.jobs import main

if __name__ == "__main__":
    sys.exit(main("replay"))
