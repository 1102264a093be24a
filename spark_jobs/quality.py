"""spark-submit entry point of one data-quality check (what the Airflow ingest and quality DAGs submit).

Thin on purpose: everything is in the deltadrain.quality package. Prints the Data Docs path (for the task log)
and then the report as `deltadrain-summary: {json}` (for XCom, see deltadrain.jobs). Exits 1 when the data fails under
`on_failure: fail` or the check cannot run, 0 otherwise (a `warn` or `quarantine` failure is data).
"""

import argparse
import json
import sys
from datetime import timedelta

from deltadrain.config import load_config
from deltadrain.errors import DeltadrainError
from deltadrain.jobs import ERROR_PREFIX, SUMMARY_PREFIX
from deltadrain.quality.check import check_batches, check_table
from deltadrain.quality.errors import BatchesFailed, QualityFailed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("pipeline")
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("--batch", type=int, nargs="+", help="one or more batches (a drain task's catch-up)")
    scope.add_argument("--table", action="store_true")
    parser.add_argument("--owed", action="store_true",
                        help="the committed batches that have no result yet (at most 20): alone (the daily DAG), "
                             "or before the --batch ones (the ingest DAG)")
    parser.add_argument("--settle", type=int, default=0, metavar="SECONDS",
                        help="with --owed: leave out the batches committed less than SECONDS ago")
    parser.add_argument("--config")
    parser.add_argument("--run-id")
    args = parser.parse_args()
    if args.owed and args.table:
        parser.error("--owed goes with --batch, or alone")
    if args.settle and not args.owed or args.settle < 0:
        parser.error("--settle takes a number of seconds >= 0, with --owed")
    if not (args.batch or args.table or args.owed):
        parser.error("one of --batch, --table or --owed is required")
    from pyspark.sql import SparkSession

    failed = None
    try:
        cfg = load_config(args.config)
        pipeline = cfg.pipeline(args.pipeline)
        spark = SparkSession.builder.getOrCreate()  # configured by spark-submit with the cached jars
        try:
            if not args.table:
                report = check_batches(cfg, pipeline, spark, args.batch or [], run_id=args.run_id, owed=args.owed,
                                       settle=timedelta(seconds=args.settle))
            else:
                report = check_table(cfg, pipeline, spark, run_id=args.run_id).as_dict()
        except BatchesFailed as exc:
            report, failed = exc.summary, exc
        except QualityFailed as exc:
            report, failed = exc.report.as_dict(), exc
    except DeltadrainError as exc:
        print(f"{ERROR_PREFIX}{exc}", flush=True)
        return 1
    print(f"Data Docs: {report['data_docs']}", flush=True)
    print(SUMMARY_PREFIX + json.dumps(report, default=str), flush=True)
    if failed is not None:
        print(f"{ERROR_PREFIX}{failed}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
