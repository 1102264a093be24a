"""spark-submit entry point of one drain run (what the Airflow ingest DAG submits).

Thin on purpose: the run is deltadrain.catchup (drain runs while full batches wait), or
deltadrain.backfill when the Airflow run is a backfill of an interval. Prints `deltadrain-summary: {json}` on success and
`deltadrain: error: ...` with a non-zero exit on failure (deltadrain.jobs).
"""

import argparse
from datetime import datetime

from deltadrain.jobs import exit_with, run_job


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("pipeline")
    parser.add_argument("--config")
    parser.add_argument("--run-id")
    parser.add_argument("--backfill-start", type=datetime.fromisoformat)
    parser.add_argument("--backfill-end", type=datetime.fromisoformat)
    parser.add_argument("--accept-gaps", action="store_true", help="on_gap: continue for this run")
    args = parser.parse_args()

    def body(spark):
        from deltadrain.config import load_config

        cfg = load_config(args.config)
        pipeline = cfg.pipeline(args.pipeline)
        if args.accept_gaps:
            pipeline = pipeline.accepting_gaps()
        if args.backfill_start or args.backfill_end:
            from deltadrain.backfill import backfill

            return backfill(cfg, pipeline, spark, args.backfill_start, args.backfill_end, run_id=args.run_id)
        from deltadrain.catchup import drain_batches

        # One batch, or more while full ones wait (the pipeline's airflow.max_batches_per_run).
        return drain_batches(cfg, pipeline, spark, run_id=args.run_id)

    return run_job(body)


if __name__ == "__main__":
    exit_with(main())
