"""`deltadrain demo`: services up, sample events in, drained by the Airflow ingest DAG, and where to look."""

from __future__ import annotations

import json
from typing import cast

from deltadrain.config import DeltadrainConfig, PipelineConfig, ValkeySource
from deltadrain.config.embedded import airflow_login, airflow_password_file, ports
from deltadrain.dev import services
from deltadrain.dev.produce import generate, produce
from deltadrain.errors import DeltadrainError
from deltadrain.observe.status import pipeline_status
from deltadrain.paths import command_line
from deltadrain.sources.valkey.client import valkey_client, valkey_source


def demo_pipeline(cfg: DeltadrainConfig) -> PipelineConfig:
    """The pipeline the demo fills and drains: the config's first Valkey pipeline."""
    found = next((p for p in cfg.pipelines if isinstance(p.source, ValkeySource)), None)
    if found is None:
        raise DeltadrainError(f"deltadrain demo drains a Valkey pipeline, and {cfg.source_file} has none")
    return found


def run_demo(cfg: DeltadrainConfig, count: int = 5000) -> dict:
    print("== starting the embedded services (Valkey, Kafka, Spark Connect, Airflow)")
    for row in services.up(cfg):
        warmed = f"; warmed up in {row['warm_up']}" if row.get("warm_up") else ""
        print(f"   {row['service']}: {row['result']} ({row.get('address', '')}){warmed}")
    pipeline = demo_pipeline(cfg)
    print(f"== producing {count} sample events (2% malformed, one poison) into '{pipeline.name}'")
    result = produce(cfg, pipeline, count, seed=0, malformed_ratio=0.02, progress=False)
    poison = next(m for m in generate(pipeline, 100, seed=1, poison_ratio=1.0) if m.kind == "poison")
    valkey_client(cfg, pipeline).xadd(valkey_source(pipeline).streams[0], {b"data": poison.value})
    print(f"   {json.dumps(result.summary()['kinds'])} + 1 poison")
    from deltadrain.airflow_api import embedded_api
    from deltadrain.names import REAPER_DAG, ingest_dag_id

    dag_id = ingest_dag_id(pipeline.name)
    api = embedded_api(cfg)
    print(f"== triggering the Airflow DAG {dag_id} (sensor -> drain: exactly-once MERGE, "
          "checkpoint in the same commit)")
    for dag in (dag_id, REAPER_DAG):
        api.wait_for_dag(dag)
        api.unpause(dag)
    api.trigger(dag_id)
    run_id, summary = api.wait_for_drain(dag_id)
    print(f"   run {run_id}: drain succeeded")
    print("   " + json.dumps(summary))
    status = pipeline_status(cfg, pipeline)
    print("== where to look")
    for line in where_to_look(cfg, pipeline, status, dag_id):
        print(f"   {line}")
    return status


# The view's place in Airflow's UI: its own entry in the navigation (plugins/deltadrain_view.py).
VIEW_ENTRY = "the deltadrain entry in Airflow's navigation"


def where_to_look(cfg: DeltadrainConfig, pipeline: PipelineConfig, status: dict, dag_id: str) -> list[str]:
    """The demo's last lines: the lifecycle, where the tables and the UI's pages are, and the commands to
    run next, which carry the config and home the demo ran with (`paths.command_line`)."""
    from deltadrain.names import REPLAY_DAG
    from deltadrain.orchestration.view.app import EXTERNAL_VIEWS

    user, _ = airflow_login()
    ui = f"http://127.0.0.1:{ports(cfg).airflow}"
    view = next(v for v in cast(list[dict[str, str]], EXTERNAL_VIEWS) if v["destination"] == "nav")

    def cli(words: str) -> str:
        return command_line(words, cfg.source_file, program=".venv/bin/deltadrain")

    return [
        f"lifecycle: PENDING={status['PENDING']} CLAIMED={status['CLAIMED']} PUBLISHED={status['PUBLISHED']} "
        f"DEAD={status['DEAD']}  (the poison message stays CLAIMED until its retries run out)",
        f"Delta table:  {cfg.target_path(pipeline)}",
        f"DLQ table:    {cfg.dlq_path(pipeline)}",
        f"Airflow UI:   {ui}  login: {user}, password in {airflow_password_file()}",
        f"DAG runs:     {ui}/dags/{dag_id}  (the drain task's log shows the run summary)",
        f"lifecycle, DLQ and replay in the UI: {ui}/plugin/{view['url_route']}  ({VIEW_ENTRY})",
        f"replay DAG:   {ui}/dags/{REPLAY_DAG}/trigger  (dry_run first)",
        f"status:       {cli(f'status {pipeline.name}')}",
        f"dead letters: {cli(f'dlq list {pipeline.name}')}",
        f"stop it all:  {cli('services down')}",
    ]
