"""The `deltadrain` command: services, pools, produce, drain, status, reap, backfill, replay, quality, metrics,
maintain, dlq, bench, jars, jvm-archive, demo.

`parser` reads the arguments, `pipelines` and `tools` hold the commands (each registers itself in
`COMMANDS`), and `main` runs one and turns what users can fix into one line."""

from __future__ import annotations

import os
import sys
from pathlib import Path

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
    # The config --config names is the one of this command wherever it is not passed along: in the commands
    # its messages print to run next (paths.command_line) and in the processes it starts.
    given = os.environ.get("DELTADRAIN_CONFIG")
    if args.config:
        os.environ["DELTADRAIN_CONFIG"] = str(Path(args.config).resolve())
    try:
        return _run(args)
    finally:
        if given is None:
            os.environ.pop("DELTADRAIN_CONFIG", None)
        else:
            os.environ["DELTADRAIN_CONFIG"] = given


def _run(args) -> int:
    """The command, with what a user can fix said in one line."""
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
        from deltadrain.formats.registry import failure_line
        from deltadrain.runtime.session import connect_lost

        config = Path(args.config) if args.config else None
        hint = damaged_log(exc) or connect_lost(exc, config) or failure_line(exc) or _unreachable(exc, args)
        if hint is None:
            raise
        print(f"deltadrain: error: {hint}", file=sys.stderr)
        return 1

