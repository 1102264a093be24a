"""The `deltadrain` command: services, pools, produce, drain, status, reap, backfill, replay, quality, metrics,
maintain, dlq, bench, jars, jvm-archive, demo."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from contextlib import contextmanager

from deltadrain.config import load_config
from deltadrain.errors import ConfigError, DeltadrainError
from deltadrain.lake.delta import damaged_log
from deltadrain.paths import check_run_id

COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {}


def command(name: str):
    def register(func):
        COMMANDS[name] = func
        return func

    return register


def _print(rows, as_json: bool) -> None:
    if as_json:
        print(json.dumps(rows, indent=2, default=str))
        return
    for row in rows if isinstance(rows, list) else [rows]:
        print("  ".join(f"{k}={v}" for k, v in row.items() if v is not None))


@contextmanager
def stdout_to_stderr():
    """File descriptor 1 on stderr for the block: a Spark JVM started in it inherits that, so what
    the JVM prints stays out of the command's own output."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _pipeline(args):
    """(config, the pipeline named on the command line) for the commands that read tables with delta-rs."""
    cfg = load_config(args.config)
    return cfg, cfg.pipeline(args.pipeline)


def _note(text: str) -> str:
    """A note (a state, not a failure) as a status line: grey on a terminal."""
    line = f"  note: {text}"
    return f"\033[90m{line}\033[0m" if sys.stdout.isatty() and not os.environ.get("NO_COLOR") else line


def _count(value) -> str:
    return "?" if value is None else str(value)


def _session(args, cfg, purpose: str):
    """The command's Spark session: with --remote, a session on a Spark Connect server (alone: the
    embedded one), as a DAG task's is; otherwise a local driver of this process's own."""
    if getattr(args, "remote", None):
        from deltadrain.config.embedded import spark_connect_url
        from deltadrain.runtime.session import connect_session

        url = spark_connect_url(cfg) if args.remote == "embedded" else args.remote
        return connect_session(url, purpose=f"deltadrain {purpose}")
    from deltadrain.runtime.session import get_spark

    return get_spark(f"deltadrain-{purpose.replace(' ', '-')}")


def _pipeline_session(args, purpose: str):
    """(config, the pipeline named on the command line, a Spark session) for the commands that read tables."""
    cfg = load_config(args.config)
    pipeline = cfg.pipeline(args.pipeline)
    return cfg, pipeline, _session(args, cfg, f"{purpose} of '{pipeline.name}'")


@command("services")
def _services(args) -> int:
    from deltadrain.dev import services

    cfg = load_config(args.config)
    only = args.only.split(",") if args.only else None
    action = {"up": services.up, "down": services.down, "status": services.status}[args.action]
    rows = action(cfg, only)
    _print(rows, args.json)
    if args.action == "up" and not args.json and "airflow" in services.select(only, cfg):
        from deltadrain.config.embedded import airflow_login, airflow_password_file, ports

        user, password = airflow_login()
        print(f"Airflow UI: http://127.0.0.1:{ports(cfg).airflow}  login: {user}  "
              f"(password in {airflow_password_file()})")
    if args.action == "status":
        return 0 if all(r["state"] == "running" for r in rows) else 3
    return 0


@command("pools")
def _pools(args) -> int:
    from deltadrain.orchestration import pools

    cfg, env = load_config(args.config), pools.pools_env()
    rows: list[dict] = [{"pool": n, "slots": 1} for n in pools.ensure_airflow_pools(cfg, env)]
    if args.prune:
        rows += [{"pool": n, "deleted": True} for n in pools.prune_airflow_pools(cfg, env)]
    _print(rows, args.json)
    return 0


@command("produce")
def _produce(args) -> int:
    from deltadrain.dev.produce import produce

    cfg = load_config(args.config)
    result = produce(cfg, cfg.pipeline(args.pipeline), args.count, seed=args.seed,
                     malformed_ratio=args.malformed_ratio, poison_ratio=args.poison_ratio, start=args.start,
                     progress=None if args.progress is None else args.progress)
    print(json.dumps(result.summary()))
    return 0


@command("drain")
def _drain(args) -> int:
    from deltadrain.catchup import drain

    cfg = load_config(args.config)
    pipeline = cfg.pipeline(args.pipeline)
    if args.accept_gaps:
        pipeline = pipeline.accepting_gaps()
    # Without --remote the drain makes its own local driver.
    spark = _session(args, cfg, f"drain of '{pipeline.name}'") if args.remote else None
    if args.max_batches == 1:
        print(drain(cfg, pipeline, spark=spark, run_id=args.run_id).line())
        return 0
    from deltadrain.catchup import drain_batches

    print(drain_batches(cfg, pipeline, spark, run_id=args.run_id, max_batches=args.max_batches).line())
    return 0


@command("reap")
def _reap(args) -> int:
    from deltadrain.sources import source_of

    cfg = load_config(args.config)
    names = [args.pipeline] if args.pipeline else [p.name for p in cfg.pipelines if source_of(p).holds_claims]
    for name in names:
        pipeline = cfg.pipeline(name)
        print(json.dumps(source_of(pipeline).reap(cfg, pipeline)))
    return 0


@command("status")
def _status(args) -> int:
    from deltadrain.observe.status import pipeline_status
    from deltadrain.sources import source_of

    cfg, pipeline = _pipeline(args)
    st = pipeline_status(cfg, pipeline)
    source = source_of(pipeline)
    if args.json:
        print(json.dumps(st, indent=2, default=str))
        return 0
    print(f"pipeline {st['pipeline']} ({st['source']})")
    for note in st.get("notes") or []:
        print(_note(note["note"]))
    print(f"  PENDING   {_count(st.get('PENDING', 0)):>10}")
    print(f"  CLAIMED   {_count(st.get('CLAIMED', 0)):>10}   oldest claim idle {_count(st.get('oldest_claim_idle_ms', 0))} ms")
    for consumer, info in (st.get("claimed_by") or {}).items():
        print(f"    {consumer}: {info['claimed']} claimed, idle {info['idle_ms']} ms"
              + (f"  STALE: {source.stale_reason(st['stale_after_ms'])}" if info.get("stale") else ""))
    print(f"  PUBLISHED {st['PUBLISHED']:>10}")
    print(f"  DEAD      {st['DEAD']:>10}   (replayed {st['REPLAYED']})")
    for line in source.status_lines(st):
        print(f"  {line}")
    cp = st["checkpoint"]
    print(f"  checkpoint: batch {cp['batch']}, table version {cp['table_version']}, positions {cp['positions']}")
    if st["last_batch"]:
        print(f"  last batch: {json.dumps(st['last_batch'], default=str)}")
    for change in st.get("schema_changes") or []:
        what = [f"added {name} {kind}" for name, kind in change["added_columns"].items()]
        what += [f"widened {name} {how}" for name, how in change["widened_columns"].items()]
        print(f"  schema: batch {change['batch']} (table version {change['table_version']}) {', '.join(what)}")
    for r in st.get("last_runs") or []:
        print(f"  run {r['finished_at']:%Y-%m-%d %H:%M:%S} batch {r['batch']} {r['outcome']}: claimed {r['claimed']} "
              f"written {r['written']} dead {r['dead']}{_filtered(r)} in {r['seconds']} s "
              f"({r['rows_per_s'] or 0} rows/s)")
    return 0


def _filtered(run: dict) -> str:
    """The transform's filtered count of a metrics row, when it filtered any (older rows have none)."""
    return f" filtered {run['filtered']}" if run.get("filtered") else ""


@command("quality")
def _quality(args) -> int:
    from datetime import timedelta

    from deltadrain.quality.check import check_batches, check_table
    from deltadrain.quality.errors import BatchesFailed, QualityFailed

    cfg, pipeline, spark = _pipeline_session(args, "quality")
    failed = None
    try:
        if args.table:
            out = check_table(cfg, pipeline, spark).as_dict()
        else:
            out = check_batches(cfg, pipeline, spark, [args.batch] if args.batch else [], owed=args.owed,
                                settle=timedelta(seconds=args.settle))
    except QualityFailed as exc:
        out, failed = exc.report.as_dict(), exc
    except BatchesFailed as exc:
        out, failed = exc.summary, exc
    if args.json:
        print(json.dumps(out, indent=2, default=str))
    else:
        if args.owed:
            left = f"; {out['still_owed']} more left for the next check" if out["still_owed"] else ""
            print(f"pipeline {pipeline.name}: batches owed a check: {out['caught_up'] or 'none'}{left}")
        for report in out.get("reports", [out] if "results" in out else []):
            _print_quality(report)
    if failed is not None:
        print(f"deltadrain: error: {failed}", file=sys.stderr)
        return 1
    return 0


def _print_quality(report: dict) -> None:
    where = f"batch {report['batch']}" if report["scope"] == "batch" else "whole table"
    print(f"pipeline {report['pipeline']} {where}: {'passed' if report['success'] else 'FAILED'} "
          f"({report['rows_checked']} rows, suite {report['suite']}, policy {report['policy']})")
    for r in report["results"]:
        extra = f"  unexpected {r['unexpected_count']}" if r.get("unexpected_count") else ""
        print(f"  {'ok  ' if r['success'] else 'FAIL'} {r['expectation']}{extra}"
              f"{'  error: ' + r['error'] if r.get('error') else ''}")
    if report["quarantined"]:
        print(f"  {report['quarantined']} row(s) moved to the quarantine table")
    print(f"  Data Docs: {report['data_docs']}")


@command("metrics")
def _metrics(args) -> int:
    from deltadrain.lake.metrics import CHART_RUNS, write_chart
    from deltadrain.observe.tables import last_batches, one_read

    cfg, pipeline = _pipeline(args)
    with one_read():
        runs = last_batches(cfg, pipeline, args.last)
        chart = (str(write_chart(pipeline.name, last_batches(cfg, pipeline, CHART_RUNS), args.chart))
                 if args.chart else None)
    if args.json:
        print(json.dumps({"pipeline": pipeline.name, "runs": runs, "chart": chart}, indent=2, default=str))
        return 0
    print(f"{len(runs)} run(s) of {pipeline.name}, newest first")
    for r in runs:
        print(f"  {r['finished_at']:%Y-%m-%d %H:%M:%S}  batch {r['batch']}  {r['outcome']:<17} claimed {r['claimed']} "
              f"written {r['written']} dup {r['duplicates']} dead {r['dead']}{_filtered(r)}  {r['seconds']} s  "
              f"{r['rows_per_s'] or 0} rows/s  backlog {r['backlog']}")
    if chart:
        print(f"chart: {chart}")
    return 0


@command("maintain")
def _maintain(args) -> int:
    from deltadrain.lake.maintain import describe, maintain

    cfg = load_config(args.config)
    named = [cfg.pipeline(name) for name in args.pipeline]
    pipelines = named or ([] if args.shared else list(cfg.pipelines))
    shared = args.shared or not args.pipeline
    with stdout_to_stderr():  # Delta's VACUUM prints to the JVM's stdout, which would break --json
        spark = _session(args, cfg, "maintain")
        summaries = [maintain(cfg, spark, p).as_dict() for p in pipelines] + (
            [maintain(cfg, spark).as_dict()] if shared else [])
    if args.json:
        print(json.dumps(summaries, indent=2, default=str))
        return 0
    for summary in summaries:
        print("\n".join(describe(summary)))
    return 0


@command("dlq")
def _dlq(args) -> int:
    from datetime import datetime

    from deltadrain.observe.tables import find_dead_letters

    cfg, pipeline = _pipeline(args)

    def when(text: str | None):
        if text is None:
            return None
        try:
            return datetime.fromisoformat(text)
        except ValueError:
            raise DeltadrainError(f"--since/--until must be ISO-8601 times, got {text!r}") from None

    rows = find_dead_letters(str(cfg.dlq_path(pipeline)), error_contains=args.error, since=when(args.since),
                             until=when(args.until), state=None if args.state == "all" else args.state,
                             limit=args.limit)
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
        return 0
    print(f"{len(rows)} dead letter(s) of {pipeline.name}")
    for r in rows:
        print(f"- {r['partition']} {r['position']} id={r['message_id']} attempts={r['attempts']} state={r['state']} "
              f"[{r['error_type']}] {r['error']}")
        print(f"    payload ({r['payload_bytes']} bytes): {r['payload_preview']!r}")
    return 0


@command("demo")
def _demo(args) -> int:
    from deltadrain.dev.demo import run_demo

    run_demo(load_config(args.config), args.count)
    return 0


@command("bench")
def _bench(args) -> int:
    from pathlib import Path

    from deltadrain.dev.bench import run_bench, run_kafka_bench, run_lake_bench

    workdir = Path(args.workdir) if args.workdir else None
    if args.server_warm_up and (args.source, args.executor, args.lake) != ("valkey", "connect", "disk"):
        raise DeltadrainError("bench --server-warm-up applies to the Valkey bench with --executor connect only "
                              "(it warms the embedded Spark Connect server before the rounds)")
    if args.lake == "s3":
        if args.executor != "local" or args.rounds != 1:
            raise DeltadrainError("bench --lake s3 compares one local-driver drain per lake: no --executor "
                                  "or --rounds with it")
        report = run_lake_bench(args.source, args.count, args.partitions, args.batch, workdir)
    elif args.source == "kafka":
        report = run_kafka_bench(args.count, args.partitions, args.batch, workdir, rounds=args.rounds,
                                 executor=args.executor)
    elif args.rounds != 1 and args.executor != "connect":
        raise DeltadrainError("bench --rounds applies to --source kafka and to --executor connect only (the "
                              "local Valkey bench compares against raw limits measured in the same run)")
    else:
        report = run_bench(args.count, args.partitions, args.batch, workdir, executor=args.executor,
                           rounds=args.rounds, server_warm_up=args.server_warm_up)
    text = json.dumps(report, indent=2, default=str)
    print(text, flush=True)  # first: an --output that cannot be written must not lose a long run's report
    if args.output:
        try:
            Path(args.output).write_text(text + "\n")
        except OSError as exc:
            raise DeltadrainError(f"bench --output {args.output}: {exc} (the report is printed above)") from None
    return 0


@command("jars")
def _jars(args) -> int:
    from deltadrain.runtime import jars

    for kind in args.only.split(",") if args.only else jars.KINDS:
        print(f"{kind}: {jars.fetch(kind, quiet=not args.verbose)}")
    return 0


@command("jvm-archive")
def _jvm_archive(args) -> int:
    from deltadrain.dev import archive_training

    try:
        path, built = archive_training.build(force=args.force)
    except archive_training.ArchiveError as exc:
        # Not a prerequisite: every drain still runs, its JVM only starts the slow way.
        print(f"warning: no class-data archive built, so Spark drivers start without one: {exc}", file=sys.stderr)
        return 0 if args.optional else 1
    print(f"class-data archive: {path} ({'built' if built else 'up to date'})")
    return 0


def _steps_bar(desc: str, steps: tuple[str, ...], enabled: bool):
    """A progress bar over a Spark job's steps (the rows are counted by Spark, not here)."""
    from tqdm import tqdm

    bar = tqdm(total=len(steps), desc=desc, unit="step", disable=not enabled, file=sys.stderr)

    def advance(name: str) -> None:
        bar.set_postfix_str(name)
        bar.update(1)

    return bar, advance


@command("backfill")
def _backfill(args) -> int:
    from datetime import datetime

    from deltadrain.heal.backfill import STEPS, backfill

    try:
        start, end = datetime.fromisoformat(args.start), datetime.fromisoformat(args.end)
    except ValueError as exc:
        raise DeltadrainError(f"--start/--end must be ISO times with a zone, e.g. 2026-05-01T00:00:00+00:00: {exc}") from None
    cfg, pipeline, spark = _pipeline_session(args, "backfill")
    bar, advance = _steps_bar(f"backfill {pipeline.name}", STEPS, sys.stderr.isatty() and not args.json)
    with bar:
        summary = backfill(cfg, pipeline, spark, start, end, progress=advance)
    print(summary.line())
    return 0


@command("replay")
def _replay(args) -> int:
    from dataclasses import asdict

    from deltadrain.heal.replay import STEPS, parse_request, replay

    cfg = load_config(args.config)
    params = {"pipeline": args.pipeline, "mode": args.mode, "message_ids": args.message_id or [],
              "error_contains": args.error, "since": args.since, "until": args.until, "partition": args.partition,
              "position_from": args.position_from, "position_to": args.position_to, "limit": args.limit,
              "dry_run": not args.apply}
    request = parse_request(cfg, {k: v for k, v in params.items() if v is not None})
    spark = _session(args, cfg, f"replay of '{args.pipeline}'")
    bar, advance = _steps_bar(f"replay {args.pipeline} ({args.mode})", STEPS, sys.stderr.isatty() and not args.json)
    with bar:
        result = replay(cfg, spark, request, progress=advance)
    print(json.dumps(asdict(result), indent=2, default=str) if args.json else result.line())
    if request.dry_run:
        print(f"dry run: {result.selected} entries would be replayed; add --apply to replay them", file=sys.stderr)
    return 0


def _add_remote(p) -> None:
    p.add_argument("--remote", nargs="?", const="embedded", metavar="URL",
                   help="run on a Spark Connect server (sc://host:port; alone: the embedded one) instead of a "
                        "local driver")


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


def _unreachable(exc: Exception, args) -> str | None:
    """A connection failure to the command's Valkey or Kafka, said in one line with the fix."""
    from deltadrain.sources.connections import unreachable_source

    try:
        cfg = load_config(args.config)
    except DeltadrainError:
        return None
    name = getattr(args, "pipeline", None)
    return unreachable_source(exc, cfg, [p for p in cfg.pipelines if p.name == name])


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "quality" and args.settle and not args.owed:
        parser.error("--settle goes with --owed")
    try:
        if args.command in ("drain", "backfill", "replay"):
            from deltadrain.logs import configure

            configure()
        return COMMANDS[args.command](args)
    except ConfigError as exc:
        print(f"deltadrain: config error: {exc}", file=sys.stderr)
        return 2
    except DeltadrainError as exc:
        print(f"deltadrain: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        from deltadrain.formats.registry import failure_line
        from deltadrain.runtime.session import connect_lost

        hint = damaged_log(exc) or connect_lost(exc) or failure_line(exc) or _unreachable(exc, args)
        if hint is None:
            raise
        print(f"deltadrain: error: {hint}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
