"""Table maintenance (OPTIMIZE, VACUUM) against real Valkey, Spark and Delta: the data, the checkpoint and
exactly-once survive it, judged by reading the tables back."""

from __future__ import annotations

import pytest
import yaml

from deltadrain.catchup import drain
from deltadrain.config import load_config
from deltadrain.dev.produce import MALFORMED_KINDS, produce
from deltadrain.lake.checkpoint import read_checkpoint
from deltadrain.lake.maintain import files_on_disk, maintain, snapshot_files
from deltadrain.lake.metrics import last_runs, metrics_path
from deltadrain.orchestration.view.data import pipeline_view
from deltadrain.sources.valkey.client import valkey_client
from tests.support.lake import dlq_rows, target_ids
from tests.support.valkey import assert_exactly_once, drain_until_done, make_pipeline


def set_maintenance(path, **fields):
    """The config file with these `maintenance:` settings, reloaded: (cfg, its only pipeline)."""
    data = yaml.safe_load(path.read_text())
    data["maintenance"] = {**(data.get("maintenance") or {}), **fields}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    cfg = load_config(path)
    return cfg, cfg.pipelines[0]


def bad_places(result) -> set[tuple[str, str]]:
    return result.bad_places(MALFORMED_KINDS)


def dead_keys(spark, c, p) -> list[tuple]:
    return sorted((r.partition, r.position, r.state) for r in dlq_rows(spark, c, p))


@pytest.mark.slow
def test_maintenance_compacts_and_vacuums_every_table_and_the_drains_go_on_exactly_once(tmp_path, cfg, spark,
                                                                                        valkey_server):
    path, c, p = make_pipeline(tmp_path, batch_cap=50)
    client = valkey_client(c, p)
    first = produce(c, p, 150, seed=131, malformed_ratio=0.1)
    runs = drain_until_done(c, p, spark, client)
    assert sum(1 for s in runs if s.outcome == "committed") >= 3
    target, dlq = str(c.target_path(p)), str(c.dlq_path(p))
    files = {"target": snapshot_files(spark, target), "dlq": snapshot_files(spark, dlq)}
    assert files["target"] >= 3 and files["dlq"] >= 2, files  # a batch or more adds files to each
    ids, dead = sorted(target_ids(spark, c, p)), dead_keys(spark, c, p)
    before = read_checkpoint(spark, target, p.name, dlq)
    runs_recorded = len(last_runs(spark, c, p, 100))
    assert pipeline_view(c, p)["data_files"] == files  # the Airflow view shows them (read with delta-rs)

    # Keeps replaced files 7 days by default: the compaction replaces them, nothing is deleted yet.
    kept = maintain(c, spark, p).as_dict()
    by_table = {t["table"]: t for t in kept["tables"]}
    assert by_table["target"]["files_before"] == files["target"] and by_table["target"]["files_after"] == 1
    assert by_table["dlq"]["files_after"] == 1 and by_table["quarantine"]["skipped"] == "no table yet"
    assert kept["compacted"] == files["target"] + files["dlq"] and kept["vacuumed"] == 0
    assert files_on_disk(target) == files["target"] + 1

    # With no retention, VACUUM deletes what the compaction replaced.
    c, p = set_maintenance(path, retain="PT0S")
    on_disk = files_on_disk(target) + files_on_disk(dlq)  # with files of rewrites the snapshots no longer hold
    again = maintain(c, spark, p).as_dict()
    assert (again["compacted"], again["files_after"]) == (0, 2)  # nothing left to compact
    assert again["vacuumed"] == on_disk - 2 >= files["target"] + files["dlq"]
    assert files_on_disk(target) == 1 and files_on_disk(dlq) == 1
    assert sorted(target_ids(spark, c, p)) == ids and dead_keys(spark, c, p) == dead
    assert pipeline_view(c, p)["data_files"] == {"target": 1, "dlq": 1}
    # The checkpoint is still read from the batch's commit: maintenance commits move no batch.
    after = read_checkpoint(spark, target, p.name, dlq)
    assert (after.batch, after.positions, after.found_in) == (before.batch, before.positions, "commit")

    shared = maintain(c, spark).as_dict()  # the metrics table: one small append per run
    metrics = {t["table"]: t for t in shared["tables"]}["metrics"]
    assert metrics["files_before"] == runs_recorded and metrics["files_after"] == 1
    assert files_on_disk(metrics_path(c)) == 1 and len(last_runs(spark, c, p, 100)) == runs_recorded

    # The drains go on from the same checkpoint: the next batch is the next number, nothing twice.
    second = produce(c, p, 60, seed=131, start=150, malformed_ratio=0.1)
    s = drain(c, p, spark=spark)
    assert (s.outcome, s.batch) == ("committed", before.batch + 1), s.line()
    drain_until_done(c, p, spark, client)
    assert_exactly_once(spark, c, p, client, first.valid_ids + second.valid_ids, bad_places(first) | bad_places(second))
