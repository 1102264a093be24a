"""The command line's arguments: every command's flags, checked as argparse reads them."""

from __future__ import annotations

import argparse

from deltadrain.paths import check_run_id


def _add_remote(p) -> None:
    where = p.add_mutually_exclusive_group()
    where.add_argument("--remote", nargs="?", const="config", metavar="URL",
                       help="run on this Spark Connect server (sc://host:port; alone: the one the config names, the "
                            "embedded one by default), and fail when it does not answer (default: on that server when "
                            "it is up, else in a local driver)")
    where.add_argument("--local", action="store_true",
                       help="run in a local Spark driver of this process's own, even when a Spark Connect server is up")


def _at_least(low: int):
    """An argparse type: an integer >= low (a bad value exits 2 with one line, not a traceback)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is less than {low}")
        return value
    return parse


def _ratio(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{value} is not within 0..1")
    return value


def _run_id(text: str) -> str:
    try:
        return check_run_id(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="deltadrain", description=__doc__)
    parser.add_argument("--config", help="pipeline config YAML (default: $DELTADRAIN_CONFIG or config/pipelines.yaml)")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("services", help="start, stop or check the embedded Valkey, Kafka, PostgreSQL, Debezium, "
                                       "S3 server, schema registry, Spark Connect server and Airflow")
    p.add_argument("action", choices=["up", "down", "status"])
    p.add_argument("--only", help="subset of valkey,valkey_tls,valkey_cluster,kafka,postgres,debezium,s3,registry,"
                                  "spark_cluster,spark_connect,airflow (default: all but postgres, debezium, s3 unless data_dir"
                                  " is s3a://, registry unless a pipeline's schema.registry.url is the embedded one's; down: all)")
    p.add_argument("--no-warm-up", action="store_true",
                   help="up: leave a Spark Connect server it starts cold (its first batches then pay what the "
                        "warm-up would have cost at start)")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("pools", help="create or update the Airflow pool of every pipeline (after adding one); "
                                     "the Airflow that AIRFLOW_HOME names, else the embedded one")
    p.add_argument("--json", action="store_true")
    p.add_argument("--prune", action="store_true",
                   help="also delete the pools deltadrain made for pipelines no longer in the config")

    p = sub.add_parser("produce", help="write deterministic sample events to a pipeline's source")
    p.add_argument("pipeline")
    p.add_argument("--count", type=_at_least(1), required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--start", type=_at_least(0), default=0, help="index of the first event (continue a sequence)")
    p.add_argument("--malformed-ratio", type=_ratio, default=0.0)
    p.add_argument("--poison-ratio", type=_ratio, default=0.0)
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None)

    p = sub.add_parser("drain", help="run one exactly-once drain batch of a pipeline (or more: --max-batches)")
    p.add_argument("pipeline")
    p.add_argument("--run-id", type=_run_id, help="identifies this run in commits, claims and logs (default: generated)")
    p.add_argument("--max-batches", type=_at_least(1), default=1,
                   help="go on with another batch while the last one was full, up to N batches and the "
                        "pipeline's airflow.max_drain_time (default 1); prints one summary of them all")
    p.add_argument("--accept-gaps", action="store_true",
                   help="go on past the gaps (entries the source deleted before a commit held them) that stop "
                        "the pipeline under on_gap: fail; this run's commit records them")
    _add_remote(p)

    p = sub.add_parser("reap", help="take over stuck claims and remove dead consumers")
    p.add_argument("pipeline", nargs="?", help="default: every Valkey pipeline")

    p = sub.add_parser("status", help="lifecycle counts of a pipeline")
    p.add_argument("pipeline")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("quality", help="run the pipeline's data-quality suite on a batch or the whole table")
    p.add_argument("pipeline")
    scope = p.add_mutually_exclusive_group(required=True)
    scope.add_argument("--batch", type=_at_least(1), help="check the rows this batch wrote")
    scope.add_argument("--table", action="store_true", help="check the whole target table")
    scope.add_argument("--owed", action="store_true",
                       help="check the committed batches that have no result yet (at most 20; what the "
                            "ingest DAG's quality task does before its own batches)")
    p.add_argument("--settle", type=_at_least(0), default=0, metavar="SECONDS",
                   help="with --owed: leave out the batches committed less than SECONDS ago (their ingest run's "
                        "quality task checks them; the daily DAG leaves an hour)")
    p.add_argument("--json", action="store_true")
    _add_remote(p)

    p = sub.add_parser("metrics", help="the last drain runs of a pipeline from the metrics table, and a chart")
    p.add_argument("pipeline")
    p.add_argument("--last", type=_at_least(1), default=10)
    p.add_argument("--chart", help="also write a throughput/backlog chart here (.html or .svg)")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("maintain", help="compact the small files of the pipelines' Delta tables (OPTIMIZE) and "
                                        "delete the replaced ones (VACUUM), as the maintenance DAG does")
    p.add_argument("pipeline", nargs="*", help="default: every pipeline, and the shared tables")
    p.add_argument("--shared", action="store_true", help="also (or with no pipeline, only) the metrics and "
                                                          "quality results tables")
    p.add_argument("--json", action="store_true")
    _add_remote(p)

    p = sub.add_parser("dlq", help="inspect a pipeline's dead-letter table")
    p.add_argument("action", choices=["list"])
    p.add_argument("pipeline")
    p.add_argument("--error", help="only entries whose error contains this text")
    p.add_argument("--since", help="ISO time: last failure at or after")
    p.add_argument("--until", help="ISO time: last failure before")
    p.add_argument("--state", default="DEAD", choices=["DEAD", "REPLAYED", "all"])
    p.add_argument("--limit", type=_at_least(1), default=50)
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("backfill", help="heal [start, end) of a pipeline's table from the source's retained history")
    p.add_argument("pipeline")
    p.add_argument("--start", required=True, help="ISO time with a zone (inclusive)")
    p.add_argument("--end", required=True, help="ISO time with a zone (exclusive)")
    p.add_argument("--json", action="store_true")
    _add_remote(p)

    p = sub.add_parser("replay", help="send dead letters back to the source, or reprocess published messages")
    p.add_argument("pipeline")
    p.add_argument("--mode", choices=["dlq", "reprocess"], default="dlq")
    p.add_argument("--message-id", action="append", help="only this message id (repeatable)")
    p.add_argument("--error", help="dlq mode: only entries whose error contains this text")
    p.add_argument("--since", help="ISO time (dlq: last failure; reprocess: append time), inclusive")
    p.add_argument("--until", help="ISO time, exclusive")
    p.add_argument("--partition", help="a stream key or a Kafka partition number")
    p.add_argument("--position-from", help="stream id (ms-seq) or Kafka offset, inclusive")
    p.add_argument("--position-to", help="stream id (ms-seq) or Kafka offset, inclusive")
    p.add_argument("--limit", type=int, default=1000)
    p.add_argument("--apply", action="store_true", help="replay for real (default: a dry run that only shows)")
    p.add_argument("--json", action="store_true")
    _add_remote(p)

    p = sub.add_parser("demo", help="start everything, produce sample events, drain them, show where to look")
    p.add_argument("--count", type=_at_least(1), default=5000)
    p.add_argument("--cdc", action="store_true", help="change data capture instead: PostgreSQL changes through "
                   "Debezium and Kafka into upsert targets (default config: config/pipelines.cdc.yaml)")

    p = sub.add_parser("bench", help="measure drain throughput against the raw limits, or for Kafka against "
                                      "Structured Streaming (docs/benchmarks.md)")
    p.add_argument("--source", choices=["valkey", "kafka"], default="valkey")
    p.add_argument("--count", type=_at_least(1), default=2_000_000)
    p.add_argument("--partitions", type=_at_least(1), default=4)
    p.add_argument("--batch", type=_at_least(1), default=200_000, help="batch cap of the drain runs")
    p.add_argument("--workdir", help="where the bench's tables go (default: a new temp dir)")
    p.add_argument("--output", help="also write the JSON report here")
    p.add_argument("--rounds", type=_at_least(1), default=1,
                   help="Kafka: drain the topic this many times with each side, alternating which goes first; "
                        "Valkey with --executor connect: produce and drain the backlog this many times, "
                        "the ratios after the first round on a server that has run full-size batches")
    p.add_argument("--server-warm-up", type=_at_least(0), default=0, metavar="COMMITS",
                   help="Valkey with --executor connect: first commit this many full-size batches on the "
                        "server, as a server that has run for a while has, so the rounds meet its steady state")
    p.add_argument("--lake", choices=["disk", "s3"], default="disk",
                   help="s3: the source's backlog drained into a lake on the local disk and into one on the "
                        "embedded S3 server, side by side")
    p.add_argument("--executor", choices=["local", "connect"], default="local",
                   help="connect, Valkey: the raw read, the drain in a local driver, the drain on the embedded "
                        "Spark Connect server and a single-process delta-rs consumer, on the same backlog; "
                        "connect, Kafka: both sides on the embedded Spark Connect server")

    p = sub.add_parser("jars", help="fetch the JVM artefacts into the jar cache (mvn)")
    p.add_argument("--verbose", action="store_true")
    p.add_argument("--only", help="comma-separated subset of the jar kinds spark,kafka,debezium,s3,s3a,registry (default: all)")
    p = sub.add_parser("jvm-archive", help="build the Spark driver's class-data archive from a small real "
                       "drain, so that drivers start faster (make install runs it)")
    p.add_argument("--force", action="store_true", help="build it again even if it is up to date")
    p.add_argument("--optional", action="store_true", help="exit 0 with a warning when it cannot be built")

    return parser

