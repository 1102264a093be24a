"""The benchmark's pipelines: a config of its own per run, its source made and dropped."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import yaml

from deltadrain.paths import PROJECT_ROOT


def _bench_config(workdir: Path, partitions: int, batch: int, window: str = "PT1H",
                  kind: str = "valkey") -> tuple[Path, str]:
    base = yaml.safe_load((PROJECT_ROOT / "config" / "pipelines.yaml").read_text())
    pipe = next(p for p in base["pipelines"] if p["source"]["kind"] == kind)
    name = f"bench_{int(time.time())}"
    pipe.update(name=name, batch_cap=batch, transform="deltadrain.transforms.identity", dedup_window=window)
    if kind == "valkey":
        pipe["source"]["streams"] = [f"{name}:{{{i}}}" for i in range(partitions)]
    else:
        pipe["source"].update(topic=name, partitions=partitions, group=f"{name}-group")
    pipe["target"] = {"path": name}
    pipe.pop("quality", None)
    base["pipelines"] = [pipe]
    base["data_dir"] = str(workdir / "lake")
    path = workdir / "bench.yaml"
    path.write_text(yaml.safe_dump(base, sort_keys=False))
    return path, name


@contextlib.contextmanager
def bench_source(cfg, pipeline):
    """The pipeline's source server up for the block, and stopped after it if the bench started it
    (`services.running`); the bench's own source data deleted after it, whatever happened in it.
    Otherwise both stay: after Valkey run 12's 2.2 million entries, a server of 687 MiB resident."""
    from deltadrain.dev import services

    with services.running(cfg, [pipeline.source.kind]):
        try:
            yield
        finally:
            _drop_source(cfg, pipeline)


def _drop_source(cfg, pipeline) -> None:
    """Delete the bench pipeline's Valkey streams, failure counts and gap records, or its Kafka topic."""
    from deltadrain.config import ValkeySource
    from deltadrain.sources.kafka.client import kafka_client_conf
    from deltadrain.sources.valkey.client import valkey_client
    from deltadrain.sources.valkey.drain import failures_key
    from deltadrain.sources.valkey.gaps import gaps_key

    if isinstance(pipeline.source, ValkeySource):
        client = valkey_client(cfg, pipeline)
        for key in (*pipeline.source.streams, failures_key(pipeline.name), gaps_key(pipeline.name)):
            client.delete(key)  # one key a DEL: a cluster refuses keys of several slots in one
        return
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({**kafka_client_conf(cfg, pipeline)})
    for fut in admin.delete_topics([pipeline.source.topic]).values():
        with contextlib.suppress(Exception):  # never created (the run failed before producing)
            fut.result(30)


def _config_copy(config: Path, tag: str) -> Path:
    """A copy of a bench config beside it with a consumer group and a lake of its own (`TAG.yaml`), so
    that several runs drain the same Valkey entries."""
    doc = yaml.safe_load(config.read_text())
    doc["pipelines"][0]["source"]["group"] = f"bench-{tag}"
    doc["data_dir"] = str(config.parent / f"lake_{tag}")
    copy = config.parent / f"{tag}.yaml"
    copy.write_text(yaml.safe_dump(doc, sort_keys=False))
    return copy
