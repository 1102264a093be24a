"""The `deltadrain` command: services, pools, produce, drain, status, reap, backfill, replay, quality, metrics,
maintain, dlq, bench, jars, jvm-archive, demo.

`parser` reads the arguments, `pipelines` and `tools` hold the commands (each registers itself in
`COMMANDS`), and `main` runs one and turns what users can fix into one line."""

from __future__ import annotations

import sys

from deltadrain.cli import pipelines, tools  # noqa: F401 (their commands register themselves)
from deltadrain.cli.common import COMMANDS, stdout_to_stderr
from deltadrain.cli.parser import build_parser
from deltadrain.config import load_config
from deltadrain.errors import ConfigError, DeltadrainError
from deltadrain.lake.delta import damaged_log

__all__ = ["COMMANDS", "build_parser", "main", "stdout_to_stderr"]


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
    from deltadrain.orchestration.connections import use_airflow_connections

    use_airflow_connections()  # connections kept in Airflow's store too; Airflow is imported only to look one up
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
        from pathlib import Path

        from deltadrain.formats.registry import failure_line
        from deltadrain.runtime.session import connect_lost

        config = Path(args.config) if args.config else None
        hint = damaged_log(exc) or connect_lost(exc, config) or failure_line(exc) or _unreachable(exc, args)
        if hint is None:
            raise
        print(f"deltadrain: error: {hint}", file=sys.stderr)
        return 1

