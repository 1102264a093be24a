"""The tool commands: services, pools, produce, demo, bench, jars, jvm-archive (dev/ is imported only here,
when one of them runs)."""

from __future__ import annotations

import json
import sys

from deltadrain.cli.common import (
    _print,
    command,
)
from deltadrain.config import load_config
from deltadrain.errors import DeltadrainError


@command("services")
def _services(args) -> int:
    from deltadrain.dev import services

    cfg = load_config(args.config)
    only = args.only.split(",") if args.only else None
    if args.action == "up":
        rows = services.up(cfg, only, warm=not args.no_warm_up)
    else:
        rows = {"down": services.down, "status": services.status}[args.action](cfg, only)
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


@command("demo")
def _demo(args) -> int:
    if args.cdc:
        from deltadrain.dev.cdc_demo import CDC_CONFIG, run_cdc_demo

        run_cdc_demo(load_config(args.config or CDC_CONFIG))
        return 0
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

