"""Shared by the Kafka A/B benchmarks (claim_notices/claim_notices.py, dead_runs/dead_runs.py): one
config with a pipeline per side, each on a 6-partition topic of its own, produced with the same data."""

import copy
import uuid
from pathlib import Path

import yaml

from deltadrain.config import load_config
from deltadrain.dev import services
from deltadrain.dev.produce import ensure_topic, produce
from deltadrain.paths import PROJECT_ROOT
from deltadrain.sources.kafka.client import kafka_client_conf


def pipelines(workdir: Path, batch: int, sides: tuple[str, ...], prefix: str, count: int):
    """(config, the pipelines in the order of `sides`), the Kafka service up, `count` messages in each topic."""
    workdir.mkdir(parents=True, exist_ok=True)
    data = yaml.safe_load((PROJECT_ROOT / "config" / "pipelines.yaml").read_text())
    base = next(p for p in data["pipelines"] if p["source"]["kind"] == "kafka")
    pipes = []
    for side in sides:
        p = copy.deepcopy(base)
        name = f"{prefix}_{side}_{uuid.uuid4().hex[:6]}"
        p.update(name=name, batch_cap=batch, target={"path": name})
        p["source"].update(topic=name, partitions=6, group=name)
        p.pop("quality", None)
        pipes.append(p)
    data.update(pipelines=pipes, data_dir=str(workdir / "lake"))
    path = workdir / f"{prefix}.yaml"
    path.write_text(yaml.safe_dump(data))
    cfg = load_config(path)
    services.up(cfg, ["kafka"])
    for p in cfg.pipelines:
        ensure_topic(kafka_client_conf(cfg, p), p.source.topic, 6)
        produce(cfg, p, count, seed=5, progress=False)
    return cfg, cfg.pipelines
