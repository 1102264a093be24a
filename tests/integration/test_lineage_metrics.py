"""What the DAGs' tasks report to the Airflow around them, received by real receivers on 127.0.0.1: the
OpenLineage events Airflow's openlineage provider sends with its http transport, and the StatsD packets
Airflow's metrics client sends, for drain runs through dag.test() on the session's Spark Connect server."""

from __future__ import annotations

import os

import pytest

from deltadrain.dev.produce import produce
from deltadrain.names import ingest_dag_id
from deltadrain.observe.lineage import source_namespace
from deltadrain.sources import source_of
from tests.support.processes import run_dag
from tests.support.receivers import LineageReceiver, StatsdReceiver
from tests.support.valkey import make_pipeline


@pytest.fixture
def receivers():
    lineage, statsd = LineageReceiver(), StatsdReceiver()
    yield lineage, statsd
    lineage.close()
    statsd.close()


@pytest.fixture
def pipeline(tmp_path, monkeypatch, airflow_db, valkey_server, spark_connect_server):
    """A two-stream Valkey pipeline of its own, with the DAG files parsed against its config; retries 0,
    so that a failing drain fails its run at once."""
    def make(**overrides):
        path, c, p = make_pipeline(tmp_path, partitions=2, airflow={"retries": 0}, **overrides)
        monkeypatch.setenv("DELTADRAIN_CONFIG", str(path))
        return path, c, p

    return make


def _env(lineage: LineageReceiver, statsd: StatsdReceiver) -> dict[str, str]:
    # InfluxDB-style StatsD lines carry the tags: the pipeline tag is then on the wire to check.
    return {**os.environ, "AIRFLOW__OPENLINEAGE__TRANSPORT": lineage.transport(),
            "AIRFLOW__OPENLINEAGE__NAMESPACE": "deltadrain-test",
            "AIRFLOW__METRICS__STATSD_INFLUXDB_ENABLED": "True", **statsd.env()}


def _drain_event(lineage: LineageReceiver, p, event_type: str) -> dict:
    job = f"{ingest_dag_id(p.name)}.drain"
    found = [e for e in lineage.events if e["job"]["name"] == job and e["eventType"] == event_type]
    assert len(found) == 1, [(e["eventType"], e["job"]["name"]) for e in lineage.events]
    assert found[0]["job"]["namespace"] == "deltadrain-test"
    return found[0]


def _sources(c, p) -> list[tuple[str, str]]:
    namespace = source_namespace("valkey", source_of(p).address(c, p))
    assert namespace.startswith("valkey://127.0.0.1:")
    return sorted((namespace, stream) for stream in p.source.streams)


@pytest.mark.slow
def test_a_committed_drain_reports_its_lineage_and_metrics(pipeline, receivers):
    lineage, statsd = receivers
    path, c, p = pipeline()
    result = produce(c, p, 60, seed=301, malformed_ratio=0.1)
    run = run_dag(ingest_dag_id(p.name), env=_env(lineage, statsd))
    assert run["states"]["drain"] == "success", run["log"][-3000:]
    summary = run["xcoms"]["drain"]
    written, dead = summary["written"], summary["dead_lettered"]
    assert written == len(result.valid_ids) and dead == 60 - written > 0

    event = _drain_event(lineage, p, "COMPLETE")
    assert sorted((d["namespace"], d["name"]) for d in event["inputs"]) == _sources(c, p)
    outputs = {d["name"]: d for d in event["outputs"]}
    target, dlq = outputs[str(c.target_path(p))], outputs[str(c.dlq_path(p))]
    assert len(outputs) == 2 and target["namespace"] == dlq["namespace"] == "file"
    assert target["outputFacets"]["outputStatistics"]["rowCount"] == written
    assert dlq["outputFacets"]["outputStatistics"]["rowCount"] == dead
    columns = {f["name"]: f["type"] for f in target["facets"]["schema"]["fields"]}
    assert set(p.payload_schema.fields) <= set(columns) and "_dd_position" in columns, columns
    assert "error" in {f["name"] for f in dlq["facets"]["schema"]["fields"]}

    # Where Airflow sends its own metrics: the tagged name, and the name with the pipeline in it.
    tagged, named = f"airflow.deltadrain.{{}},pipeline={p.name}", f"airflow.deltadrain.{p.name}.{{}}"
    for metric, value in (("written", written), ("dead_lettered", dead), ("duplicates", 0), ("gaps", 0)):
        assert statsd.values(tagged.format(metric)) == statsd.values(named.format(metric)) == [(value, "c")], \
            (metric, [line for line in statsd.lines if "deltadrain" in line])
    assert statsd.values(tagged.format("lag")) == [(0, "g")]  # drained to the end
    (batch_ms, kind), = statsd.values(tagged.format("batch_seconds"))
    assert kind == "ms" and batch_ms == pytest.approx(summary["seconds"] * 1000, abs=1)
    steps = {line.partition(":")[0] for line in statsd.lines if line.startswith(named.format("step_seconds."))}
    assert {named.format(f"step_seconds.{s}") for s in ("checkpoint", "claim", "transform", "dead_letters",
                                                        "commit", "ack")} == steps


@pytest.mark.slow
def test_a_failed_drain_reports_what_it_meant_to_read_and_write(pipeline, receivers):
    lineage, statsd = receivers
    path, c, p = pipeline(transform="deltadrain.transforms.no_such_transform")
    produce(c, p, 10, seed=302)
    run = run_dag(ingest_dag_id(p.name), env=_env(lineage, statsd))
    assert run["states"]["drain"] == "failed", run["log"][-3000:]
    event = _drain_event(lineage, p, "FAIL")
    assert sorted((d["namespace"], d["name"]) for d in event["inputs"]) == _sources(c, p)
    # The target it meant to write, with no count: nothing was written, and no DLQ.
    assert [(d["name"], d.get("outputFacets") or {}) for d in event["outputs"]] == [(str(c.target_path(p)), {})]
    assert "cannot be imported" in event["run"]["facets"]["errorMessage"]["message"]
    statsd.quiet()
    assert not [line for line in statsd.lines if ".deltadrain." in line]  # a failed drain has no figures
