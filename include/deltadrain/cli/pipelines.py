"""The commands on a pipeline: drain, reap, status, quality, metrics, maintain, dlq, backfill, replay."""

from __future__ import annotations

import json
import sys

from deltadrain.cli.common import (
    _count,
    _note,
    _pipeline,
    _pipeline_session,
    _session,
    _steps_bar,
    _with_place,
    command,
    stdout_to_stderr,
)
from deltadrain.config import load_config
from deltadrain.errors import DeltadrainError


@command("drain")
def _drain(args) -> int:
    from deltadrain.catchup import drain

    cfg = load_config(args.config)
    pipeline = cfg.pipeline(args.pipeline)
    if args.accept_gaps:
        pipeline = pipeline.accepting_gaps()
    spark, place = _session(args, cfg, f"drain of '{pipeline.name}'")
    if args.max_batches == 1:
        print(_with_place(drain(cfg, pipeline, spark=spark, run_id=args.run_id).line(), place))
        return 0
    from deltadrain.catchup import drain_batches

    print(_with_place(drain_batches(cfg, pipeline, spark, run_id=args.run_id, max_batches=args.max_batches).line(),
                      place))
    return 0


@command("reap")
def _reap(args) -> int:
    from deltadrain.sources import Reaps, reaper_of, source_of

    cfg = load_config(args.config)
    names = [args.pipeline] if args.pipeline else [p.name for p in cfg.pipelines if isinstance(source_of(p), Reaps)]
    for name in names:
        pipeline = cfg.pipeline(name)
        print(json.dumps(reaper_of(pipeline).reap(cfg, pipeline)))
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

    cfg, pipeline, spark, _ = _pipeline_session(args, "quality")
    failed: QualityFailed | BatchesFailed | None = None
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
        spark, _ = _session(args, cfg, "maintain")
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


@command("backfill")
def _backfill(args) -> int:
    from datetime import datetime

    from deltadrain.heal.backfill import STEPS, backfill

    try:
        start, end = datetime.fromisoformat(args.start), datetime.fromisoformat(args.end)
    except ValueError as exc:
        raise DeltadrainError(f"--start/--end must be ISO times with a zone, e.g. 2026-05-01T00:00:00+00:00: {exc}") from None
    cfg, pipeline, spark, place = _pipeline_session(args, "backfill")
    bar, advance = _steps_bar(f"backfill {pipeline.name}", STEPS, sys.stderr.isatty() and not args.json)
    with bar:
        summary = backfill(cfg, pipeline, spark, start, end, progress=advance)
    print(_with_place(summary.line(), place))
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
    spark, place = _session(args, cfg, f"replay of '{args.pipeline}'")
    bar, advance = _steps_bar(f"replay {args.pipeline} ({args.mode})", STEPS, sys.stderr.isatty() and not args.json)
    with bar:
        result = replay(cfg, spark, request, progress=advance)
    print(json.dumps({**asdict(result), "spark": place.line}, indent=2, default=str) if args.json
          else _with_place(result.line(), place))
    if request.dry_run:
        print(f"dry run: {result.selected} entries would be replayed; add --apply to replay them", file=sys.stderr)
    return 0

