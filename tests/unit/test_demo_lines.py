"""The demo's "where to look" lines: every command in them parses as the CLI reads it and carries the
config and home the demo ran with, for each demo variant (config/pipelines*.yaml); the UI's places are
named as the view's plugin mounts them."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from deltadrain.cli import build_parser
from deltadrain.config import load_config
from deltadrain.dev.demo import where_to_look
from deltadrain.paths import DEFAULT_CONFIG, PROJECT_ROOT

VARIANTS = sorted((PROJECT_ROOT / "config").glob("pipelines*.yaml"))
PROGRAM = ".venv/bin/deltadrain"


def printed_commands(lines: list[str]) -> list[list[str]]:
    """The commands in the lines, split as a shell splits them (environment assignments first)."""
    return [shlex.split(line.split(":", 1)[1]) for line in lines if PROGRAM in line]


def cli_words(words: list[str]) -> tuple[dict[str, str], list[str]]:
    """(the assignments before the program, the program's arguments)."""
    at = words.index(PROGRAM)
    return dict(w.split("=", 1) for w in words[:at]), words[at + 1:]


@pytest.mark.parametrize("variant", VARIANTS, ids=[v.name for v in VARIANTS])
def test_every_printed_command_parses_and_carries_the_variants_config_and_home(variant: Path, monkeypatch, tmp_path):
    home = tmp_path / "home"
    monkeypatch.setenv("DELTADRAIN_HOME", str(home))
    monkeypatch.chdir(PROJECT_ROOT)  # where `make demo` runs it
    cfg = load_config(variant)
    pipeline = cfg.pipelines[0]
    status = {"PENDING": 0, "CLAIMED": 1, "PUBLISHED": 4900, "DEAD": 100}
    lines = where_to_look(cfg, pipeline, status, f"deltadrain__ingest__{pipeline.name}")
    commands = printed_commands(lines)
    assert [cli_words(c)[1][-2:] if c[-1] != "down" else ["services", "down"] for c in commands] == [
        ["status", pipeline.name], ["list", pipeline.name], ["services", "down"]]
    for words in commands:
        env, argv = cli_words(words)
        assert env == {"DELTADRAIN_HOME": str(home)}
        args = build_parser().parse_args(argv)
        if variant == DEFAULT_CONFIG:
            assert args.config is None
        else:
            assert args.config == str(variant.relative_to(PROJECT_ROOT))
    view = next(line for line in lines if "in the UI" in line)
    assert "/plugin/deltadrain " in view and "the deltadrain entry in Airflow's navigation" in view
    assert not any("Browse" in line for line in lines)


def test_the_default_variant_with_the_default_home_prints_bare_commands(monkeypatch):
    from deltadrain.paths import DEFAULT_HOME

    monkeypatch.setenv("DELTADRAIN_HOME", str(DEFAULT_HOME))
    cfg = load_config(DEFAULT_CONFIG)
    lines = where_to_look(cfg, cfg.pipelines[0], {"PENDING": 0, "CLAIMED": 0, "PUBLISHED": 0, "DEAD": 0}, "d")
    assert [" ".join(c) for c in printed_commands(lines)] == [
        f"{PROGRAM} status orders", f"{PROGRAM} dlq list orders", f"{PROGRAM} services down"]
