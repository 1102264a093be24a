"""A pipeline's config file of a test's own: the example config with one pipeline (made by
tests.support.valkey.make_pipeline or tests.support.kafka.make_kafka_pipeline) and tables under the
test's tmp_path, edited as an operator edits it; the transforms the drain tests run both ways."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from deltadrain.config import load_config

ROOT = Path(__file__).resolve().parents[2]

HANDLER, IDENTITY = "deltadrain.transforms.sample_orders", "deltadrain.transforms.identity"
# The identity transform takes the drain's shortcut (no pass of its own before the MERGE): the
# tests that judge counts, duplicates and kills run both ways.
BOTH_TRANSFORMS = pytest.mark.parametrize("transform", [HANDLER, IDENTITY], ids=["handler", "identity"])


def example_config() -> dict:
    return yaml.safe_load((ROOT / "config" / "pipelines.yaml").read_text())


def write_config(tmp_path: Path, data: dict, pipe: dict):
    """`data` (the example config) with `pipe` as its only pipeline and tables under tmp_path: (path, cfg, p)."""
    data["pipelines"] = [pipe]
    data["data_dir"] = str(tmp_path / "lake")
    path = tmp_path / "pipelines.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    cfg = load_config(path)
    return path, cfg, cfg.pipeline(pipe["name"])


def alerts_config(tmp_path: Path, alerts: dict | None):
    """The example config, both pipelines, with the first one's `alerts` block set to `alerts` (None: none)."""
    data = example_config()
    if alerts is not None:
        data["pipelines"][0]["alerts"] = alerts
    path = tmp_path / "pipelines.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_config(path)


def set_source(path: Path, **fields):
    """Change the source settings of the config file's only pipeline, as an operator edits the YAML:
    returns the reloaded (cfg, pipeline)."""
    data = yaml.safe_load(path.read_text())
    data["pipelines"][0]["source"].update(fields)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    cfg = load_config(path)
    return cfg, cfg.pipeline(data["pipelines"][0]["name"])

