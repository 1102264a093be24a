"""spark-submit entry point of one drain run (what the Airflow ingest DAG submits).

Thin on purpose: everything is in deltadrain.drain. Prints the run summary as the last line of
stdout (JSON) for the operator to read and push as XCom; exits non-zero on failure.
"""

import argparse
import sys

from deltadrain.config import load_config
from deltadrain.drain import drain
from deltadrain.errors import DeltadrainError


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("pipeline")
    parser.add_argument("--config")
    parser.add_argument("--run-id")
    args = parser.parse_args()
    from pyspark.sql import SparkSession

    try:
        cfg = load_config(args.config)
        pipeline = cfg.pipeline(args.pipeline)
        spark = SparkSession.builder.getOrCreate()  # configured by spark-submit with the cached jars
        summary = drain(cfg, pipeline, spark=spark, run_id=args.run_id)
    except DeltadrainError as exc:
        print(f"deltadrain: error: {exc}", file=sys.stderr)
        return 1
    print(summary.line(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
