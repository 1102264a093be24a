"""spark-submit entry point of a replay (what the Airflow replay DAG submits).

The request arrives as one JSON argument and is validated again here (deltadrain.replay); its
values are bound as Column literals, never spliced into SQL.
"""

import argparse
import json

from deltadrain.jobs import exit_with, run_job


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--request", required=True, help="the replay request as JSON")
    parser.add_argument("--config")
    parser.add_argument("--run-id")
    args = parser.parse_args()

    def body(spark):
        from deltadrain.config import load_config
        from deltadrain.replay import parse_request, replay

        cfg = load_config(args.config)
        return replay(cfg, spark, parse_request(cfg, json.loads(args.request)), run_id=args.run_id)

    return run_job(body)


if __name__ == "__main__":
    exit_with(main())
