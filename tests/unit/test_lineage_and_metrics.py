"""What the DAGs' tasks report to Airflow's OpenLineage provider and metrics backend, decided without
Airflow: the datasets' names (OpenLineage's naming for Kafka, file and S3; valkey://host:port for
streams), which datasets a task read and wrote with how many rows, and a drain summary's metrics."""

from __future__ import annotations

from pathlib import Path

import pytest

from deltadrain.observe.lineage import (
    DatasetName,
    field_type,
    source_datasets,
    source_namespace,
    table_dataset,
    task_datasets,
)
from deltadrain.observe.runmetrics import drain_metrics, stat_segment
from tests.support.pipelines import example_config, write_config


def _pipeline(tmp_path: Path, kind: str, **source):
    data = example_config()
    pipe = next(p for p in data["pipelines"] if p["source"]["kind"] == kind)
    pipe["source"].update(source)
    tmp_path.mkdir(parents=True, exist_ok=True)
    return write_config(tmp_path, data, pipe)[1:]


@pytest.mark.parametrize("kind,address,namespace", [
    ("kafka", "broker-1:9093,broker-2:9093", "kafka://broker-1:9093"),  # the first bootstrap server
    ("kafka", "SASL_SSL://broker-1:9094", "kafka://broker-1:9094"),
    ("valkey", "cache.internal:6380", "valkey://cache.internal:6380"),
    ("valkey", "node-a:7000,node-b:7001", "valkey://node-a:7000"),  # a cluster: its first seed node
])
def test_a_source_namespace_is_its_kind_and_first_server(kind, address, namespace):
    assert source_namespace(kind, address) == namespace


def test_a_kafka_pipeline_reads_its_topic_and_a_valkey_pipeline_each_stream(tmp_path):
    cfg, kafka = _pipeline(tmp_path / "k", "kafka", bootstrap_servers="broker-1:9093,broker-2:9093", topic="clicks")
    assert source_datasets(cfg, kafka) == [DatasetName("kafka://broker-1:9093", "clicks")]
    cfg, valkey = _pipeline(tmp_path / "v", "valkey", url="valkey://cache.internal:6380/0",
                            streams=["orders:{0}", "orders:{1}"])
    assert source_datasets(cfg, valkey) == [DatasetName("valkey://cache.internal:6380", "orders:{0}"),
                                            DatasetName("valkey://cache.internal:6380", "orders:{1}")]
    assert source_datasets(cfg, valkey)[0].uri == "valkey://cache.internal:6380/orders:{0}"


def test_a_delta_table_is_named_by_its_place(tmp_path):
    local = table_dataset(tmp_path / "lake" / "orders")
    assert local == DatasetName("file", str(tmp_path / "lake" / "orders"))
    assert local.uri == (tmp_path / "lake" / "orders").as_uri()
    # s3a:// is how Spark reaches the bucket; OpenLineage names it s3://.
    assert table_dataset("s3a://lake-bucket/deltadrain/orders") == DatasetName("s3://lake-bucket", "deltadrain/orders")
    assert table_dataset("s3a://lake-bucket/deltadrain/orders").uri == "s3://lake-bucket/deltadrain/orders"


def _names(datasets) -> list[tuple[str, int | None]]:
    return [(Path(d.name.name).name if d.name.namespace == "file" else d.name.name, d.rows) for d in datasets]


def test_a_drain_writes_the_dlq_only_when_it_wrote_dead_letters(tmp_path):
    cfg, p = _pipeline(tmp_path, "valkey", streams=["orders:{0}"])
    inputs, outputs = task_datasets("drain", cfg, p, {"written": 40, "dead_lettered": 2})
    assert _names(inputs) == [("orders:{0}", None)]
    assert _names(outputs) == [("orders", 40), ("orders", 2)]
    assert [d.table for d in outputs] == [str(cfg.target_path(p)), str(cfg.dlq_path(p))]
    assert _names(task_datasets("drain", cfg, p, {"written": 40, "dead_lettered": 0})[1]) == [("orders", 40)]
    # Failed with no summary: the table it meant to write, with no count.
    assert _names(task_datasets("drain", cfg, p, None)[1]) == [("orders", None)]
    # A backfill's summary has the same counts.
    assert _names(task_datasets("drain", cfg, p, {"mode": "backfill", "written": 3, "dead_lettered": 1})[1]) == [
        ("orders", 3), ("orders", 1)]


def test_a_replay_reads_and_writes_by_its_mode(tmp_path):
    cfg, p = _pipeline(tmp_path, "valkey", streams=["orders:{0}"])
    dlq, target = str(cfg.dlq_path(p)), str(cfg.target_path(p))
    inputs, outputs = task_datasets("replay", cfg, p, {"mode": "dlq", "dry_run": False, "replayed": 5})
    assert [d.table for d in inputs] == [dlq]
    assert [(d.name.name, d.rows) for d in outputs] == [("orders:{0}", 5), (str(Path(dlq).absolute()), None)]
    assert task_datasets("replay", cfg, p, {"mode": "dlq", "dry_run": True})[1] == []
    assert task_datasets("replay", cfg, p, None, {"mode": "dlq"})[1] == []  # a request is a dry run by default
    inputs, outputs = task_datasets("replay", cfg, p, {"mode": "reprocess", "dry_run": False, "written": 7})
    assert _names(inputs) == [("orders:{0}", None)] and [(d.table, d.rows) for d in outputs] == [(target, 7)]


def test_maintenance_rewrites_the_tables_it_did_not_skip(tmp_path):
    cfg, p = _pipeline(tmp_path, "valkey")
    summary = {"tables": [{"table": "target", "skipped": None}, {"table": "dlq", "skipped": None},
                          {"table": "quarantine", "skipped": "no table"}]}
    inputs, outputs = task_datasets("maintain", cfg, p, summary)
    assert inputs == [] and [d.table for d in outputs] == [str(cfg.target_path(p)), str(cfg.dlq_path(p))]
    assert [d.table for d in task_datasets("maintain", cfg, None, None)[1]] == [
        str(cfg.metrics_path()), str(cfg.quality_results_path())]


def test_field_types_are_delta_type_names():
    from deltalake.schema import ArrayType, PrimitiveType, StructType

    assert field_type(PrimitiveType("long")) == "long"
    assert field_type(PrimitiveType("decimal(10,2)")) == "decimal(10,2)"
    assert field_type(ArrayType(PrimitiveType("string"))) == "array"
    assert field_type(StructType([])) == "struct"


def _sent(metrics) -> dict[str, float]:
    return {m.legacy: m.value for m in metrics}


def test_a_drain_summary_becomes_metrics_tagged_with_its_pipeline():
    summary = {"pipeline": "orders", "written": 54, "duplicates_skipped": 1, "dead_lettered": 6, "gaps": 0,
               "seconds": 2.5, "timings": {"claim": 0.4, "dead letters": 1.1}}
    metrics = drain_metrics(summary, lag=12)
    assert {m.name for m in metrics} == {"deltadrain.written", "deltadrain.duplicates", "deltadrain.dead_lettered",
                                         "deltadrain.gaps", "deltadrain.batch_seconds", "deltadrain.step_seconds",
                                         "deltadrain.lag"}
    assert all(m.tags["pipeline"] == "orders" for m in metrics)
    assert _sent(metrics) == {"deltadrain.orders.written": 54, "deltadrain.orders.duplicates": 1,
                              "deltadrain.orders.dead_lettered": 6, "deltadrain.orders.gaps": 0,
                              "deltadrain.orders.batch_seconds": 2.5, "deltadrain.orders.step_seconds.claim": 0.4,
                              "deltadrain.orders.step_seconds.dead_letters": 1.1, "deltadrain.orders.lag": 12}
    kinds = {m.name: m.kind for m in metrics}
    assert (kinds["deltadrain.written"], kinds["deltadrain.lag"], kinds["deltadrain.step_seconds"]) == (
        "count", "gauge", "timing")
    assert "deltadrain.lag" not in {m.name for m in drain_metrics(summary)}  # not measured: not sent


def test_a_catch_up_sends_each_batchs_seconds_and_the_summed_counts():
    summary = {"pipeline": "orders", "written": 300, "dead_lettered": 0, "duplicates_skipped": 0, "gaps": 0,
               "seconds": 9.0, "timings": {"claim": 0.2},
               "runs": [{"batch": 1, "seconds": 5.0, "timings": {"claim": 0.5}},
                        {"batch": 2, "seconds": 4.0, "timings": {"claim": 0.2}}]}
    metrics = drain_metrics(summary)
    assert [m.value for m in metrics if m.name == "deltadrain.batch_seconds"] == [5.0, 4.0]
    assert [m.value for m in metrics if m.name == "deltadrain.step_seconds"] == [0.5, 0.2]
    assert [m.value for m in metrics if m.name == "deltadrain.written"] == [300]


def test_stat_segments_hold_only_what_metrics_backends_accept():
    assert stat_segment("dead letters") == "dead_letters"
    assert stat_segment("a.b/c") == "a_b_c"
