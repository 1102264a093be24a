"""What the commands share: the registry of commands, printing, the Spark session a command runs on."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from contextlib import contextmanager

from deltadrain.config import load_config

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
    """(the command's Spark session, where it runs): on the Spark Connect server when one is up, else in
    a local driver of this process's own (`cli.where`)."""
    from deltadrain.cli.where import open_session

    return open_session(args, cfg, purpose)


def _pipeline_session(args, purpose: str):
    """(config, the pipeline named on the command line, a Spark session, where it runs) for the commands
    that read tables."""
    cfg = load_config(args.config)
    pipeline = cfg.pipeline(args.pipeline)
    return cfg, pipeline, *_session(args, cfg, f"{purpose} of '{pipeline.name}'")


def _with_place(line: str, place) -> str:
    """A command's one-line JSON summary with where it ran (`spark`)."""
    return json.dumps({**json.loads(line), "spark": place.line}, default=str)


def _steps_bar(desc: str, steps: tuple[str, ...], enabled: bool):
    """A progress bar over a Spark job's steps (the rows are counted by Spark, not here)."""
    from tqdm import tqdm

    bar = tqdm(total=len(steps), desc=desc, unit="step", disable=not enabled, file=sys.stderr)

    def advance(name: str) -> None:
        bar.set_postfix_str(name)
        bar.update(1)

    return bar, advance

