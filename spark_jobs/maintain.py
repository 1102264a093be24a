"""spark-submit entry point of table maintenance (what the Airflow maintenance DAG submits).

Thin on purpose: everything is in deltadrain.maintain. One pipeline's tables, or with --shared the
metrics and quality results tables; prints what it did, then the summary line for XCom.
"""

import argparse

from deltadrain.jobs import exit_with, run_job


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    scope = parser.add_mutually_exclusive_group(required=True)
    scope.add_argument("pipeline", nargs="?")
    scope.add_argument("--shared", action="store_true")
    parser.add_argument("--config")
    parser.add_argument("--run-id")
    args = parser.parse_args()

    def body(spark):
        from deltadrain.config import load_config
        from deltadrain.maintain import describe, maintain

        cfg = load_config(args.config)
        summary = maintain(cfg, spark, cfg.pipeline(args.pipeline) if args.pipeline else None)
        print("\n".join(describe(summary.as_dict())), flush=True)
        return summary

    return run_job(body)


if __name__ == "__main__":
    exit_with(main())
