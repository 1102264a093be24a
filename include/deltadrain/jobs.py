"""The Spark jobs the DAGs run (drain, replay, maintain, quality): their arguments and bodies.

Two ways run the same job with the same arguments. spark-submit starts a driver of its own for
spark_jobs/<job>.py (`main`), which prints one `deltadrain-summary: {json}` line when the job succeeds
and one `deltadrain: error: ...` line when it fails; the Airflow operators read both from its output
(deltadrain.orchestration.operators). Through Spark Connect the Airflow task itself is the client:
it calls `run` on a session of its own and gets the same summary and error as a `JobResult`.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import traceback
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from deltadrain.errors import DeltadrainError, error_line
from deltadrain.lake.delta import damaged_log

SUMMARY_PREFIX = "deltadrain-summary: "
ERROR_PREFIX = "deltadrain: error: "
JOBS = ("drain", "replay", "maintain", "quality")

log = logging.getLogger("deltadrain.jobs")


class BadArguments(DeltadrainError):
    """The job's arguments do not parse (argparse's message)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # raise instead of exiting: a Connect task runs the parser in its own process
        raise BadArguments(f"{self.prog}: {message}")


@dataclass
class JobResult:
    summary: dict | None = None  # the task's XCom
    error: str | None = None  # why the job failed, in one line; with a summary: the data failed (quality)
    notes: list[str] = field(default_factory=list)  # lines for the task log before the summary


def parser(job: str) -> argparse.ArgumentParser:
    p = _Parser(prog=f"deltadrain {job} job")
    if job == "drain":
        p.add_argument("pipeline")
        p.add_argument("--backfill-start", type=datetime.fromisoformat)
        p.add_argument("--backfill-end", type=datetime.fromisoformat)
        p.add_argument("--accept-gaps", action="store_true", help="on_gap: continue for this run")
    elif job == "replay":
        p.add_argument("--request", required=True, help="the replay request as JSON")
    elif job == "maintain":
        scope = p.add_mutually_exclusive_group(required=True)
        scope.add_argument("pipeline", nargs="?")
        scope.add_argument("--shared", action="store_true")
    elif job == "quality":
        p.add_argument("pipeline")
        scope = p.add_mutually_exclusive_group()
        scope.add_argument("--batch", type=int, nargs="+", help="one or more batches (a drain task's catch-up)")
        scope.add_argument("--table", action="store_true")
        p.add_argument("--owed", action="store_true",
                       help="the committed batches that have no result yet (at most 20): alone (the daily DAG), "
                            "or before the --batch ones (the ingest DAG)")
        p.add_argument("--settle", type=int, default=0, metavar="SECONDS",
                       help="with --owed: leave out the batches committed less than SECONDS ago")
    else:
        raise ValueError(f"unknown job {job!r}; expected one of {JOBS}")
    p.add_argument("--config")
    p.add_argument("--run-id")
    return p


def parse(job: str, argv: list[str]) -> argparse.Namespace:
    p = parser(job)
    args = p.parse_args(argv)
    if job == "quality":
        if args.owed and args.table:
            p.error("--owed goes with --batch, or alone")
        if args.settle and not args.owed or args.settle < 0:
            p.error("--settle takes a number of seconds >= 0, with --owed")
        if not (args.batch or args.table or args.owed):
            p.error("one of --batch, --table or --owed is required")
    return args


def _drain(spark, args) -> JobResult:
    from deltadrain.config import load_config

    cfg = load_config(args.config)
    pipeline = cfg.pipeline(args.pipeline)
    if args.accept_gaps:
        pipeline = pipeline.accepting_gaps()
    if args.backfill_start or args.backfill_end:
        from deltadrain.heal.backfill import backfill

        line = backfill(cfg, pipeline, spark, args.backfill_start, args.backfill_end, run_id=args.run_id).line()
    else:
        from deltadrain.catchup import drain_batches

        # One batch, or more while full ones wait (the pipeline's airflow.max_batches_per_run).
        line = drain_batches(cfg, pipeline, spark, run_id=args.run_id).line()
    return JobResult(json.loads(line))


def _replay(spark, args) -> JobResult:
    from deltadrain.config import load_config
    from deltadrain.heal.replay import parse_request, replay

    cfg = load_config(args.config)
    # The request is validated again here: its values are bound as literals, never spliced into SQL.
    result = replay(cfg, spark, parse_request(cfg, json.loads(args.request)), run_id=args.run_id)
    return JobResult(json.loads(result.line()))


def _maintain(spark, args) -> JobResult:
    from deltadrain.config import load_config
    from deltadrain.lake.maintain import describe, maintain

    cfg = load_config(args.config)
    summary = maintain(cfg, spark, cfg.pipeline(args.pipeline) if args.pipeline else None).as_dict()
    return JobResult(json.loads(json.dumps(summary, default=str)), notes=describe(summary))


def _quality(spark, args) -> JobResult:
    from deltadrain.config import load_config
    from deltadrain.quality.check import check_batches, check_table
    from deltadrain.quality.errors import BatchesFailed, QualityFailed

    cfg = load_config(args.config)
    pipeline = cfg.pipeline(args.pipeline)
    failed: Exception | None = None
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
    # Exits 1 when the data fails under `on_failure: fail`; a `warn` or `quarantine` failure is data.
    return JobResult(json.loads(json.dumps(report, default=str)), str(failed) if failed else None,
                     notes=[f"Data Docs: {report['data_docs']}"])


BODIES = {"drain": _drain, "replay": _replay, "maintain": _maintain, "quality": _quality}


def run(job: str, spark, argv: list[str]) -> JobResult:
    """Run `job` with `argv` on `spark`; failures come back as the result's error, never raised."""
    try:
        return BODIES[job](spark, parse(job, argv))
    except DeltadrainError as exc:
        return JobResult(error=" ".join(str(exc).split()))
    except Exception as exc:
        log.error("deltadrain %s job failed:\n%s", job, traceback.format_exc())  # the whole of it in the log
        from deltadrain.formats.registry import failure_line
        from deltadrain.runtime.session import connect_lost

        return JobResult(error=damaged_log(exc) or connect_lost(exc) or failure_line(exc) or error_line(exc))


def main(job: str, argv: list[str] | None = None) -> int:
    """spark-submit's entry (spark_jobs/<job>.py): the result as lines on stdout; exit 1 on an error."""
    from pyspark.sql import SparkSession

    from deltadrain.logs import configure

    configure()
    try:
        spark = SparkSession.builder.getOrCreate()  # configured by spark-submit with the cached jars
    except Exception as exc:
        print(f"{ERROR_PREFIX}{error_line(exc)}", flush=True)
        return 1
    result = run(job, spark, sys.argv[1:] if argv is None else argv)
    for note in result.notes:
        print(note, flush=True)
    if result.summary is not None:
        print(SUMMARY_PREFIX + json.dumps(result.summary, default=str), flush=True)
    if result.error is not None:
        print(f"{ERROR_PREFIX}{result.error}", flush=True)
        return 1
    return 0
