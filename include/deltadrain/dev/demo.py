"""`deltadrain demo`: services up, sample events in, drained by the Airflow ingest DAG, and where to look."""

from __future__ import annotations

import json

from deltadrain.config import DeltadrainConfig, ValkeySource
from deltadrain.config.embedded import airflow_login, airflow_password_file, ports
from deltadrain.dev import services
from deltadrain.dev.produce import generate, produce
from deltadrain.observe.status import pipeline_status
from deltadrain.sources.valkey.client import valkey_client, valkey_source


def run_demo(cfg: DeltadrainConfig, count: int = 5000) -> dict:
    print("== starting the embedded services (Valkey, Kafka, Spark Connect, Airflow)")
    for row in services.up(cfg):
        print(f"   {row['service']}: {row['result']} ({row.get('address', '')})")
    pipeline = next(p for p in cfg.pipelines if isinstance(p.source, ValkeySource))
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
    user, _ = airflow_login()
    port = ports(cfg).airflow
    print("== where to look")
    print(f"   lifecycle: PENDING={status['PENDING']} CLAIMED={status['CLAIMED']} PUBLISHED={status['PUBLISHED']} "
          f"DEAD={status['DEAD']}  (the poison message stays CLAIMED until its retries run out)")
    print(f"   Delta table:  {cfg.target_path(pipeline)}")
    print(f"   DLQ table:    {cfg.dlq_path(pipeline)}")
    print(f"   Airflow UI:   http://127.0.0.1:{port}  login: {user}, password in {airflow_password_file()}")
    print(f"   DAG runs:     http://127.0.0.1:{port}/dags/{dag_id}  (the drain task's log shows the run summary)")
    print(f"   lifecycle, DLQ and replay in the UI: http://127.0.0.1:{port}/deltadrain/  (menu Browse > deltadrain)")
    print(f"   replay DAG:   http://127.0.0.1:{port}/dags/deltadrain__replay/trigger  (dry_run first)")
    print(f"   status:       .venv/bin/deltadrain status {pipeline.name}")
    print(f"   dead letters: .venv/bin/deltadrain dlq list {pipeline.name}")
    print("   stop it all:  .venv/bin/deltadrain services down")
    return status
