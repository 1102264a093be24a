"""This code drains on from a lake an earlier release wrote.

tests/fixtures/release_lake_<release>.tar.gz is a small lake made by tests/fixtures/make_release_lake.py
run at that release (its docstring says how): one Valkey pipeline, four batches, dead letters, metrics
and quality results. The test puts the release's entries back on the session's Valkey as the release
left them (all delivered and acknowledged), appends new ones, and drains with this code: the new
batches continue the old checkpoint, every event is in the target once, the dead letters of both
releases are in the DLQ, and status reads the lake.
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

# The only deltadrain imports (a reorganisation of the package adjusts these lines).
from deltadrain.catchup import drain
from deltadrain.config import load_config
from deltadrain.lake.checkpoint import read_checkpoint
from deltadrain.lake.delta import snapshot_txn
from deltadrain.observe.status import pipeline_status  # what `deltadrain status` prints
from tests.support.lake import assert_dead_letters, dlq_rows, target_ids
from tests.support.valkey import drain_until_done, pending, valkey_admin

RELEASE = "44a7cf7"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
NEW_BASE_MS = 1_767_225_700_000  # the new entries' ids: after every id the release wrote
NEW = 26  # two batches of the fixture's batch_cap (20)
REPEAT, MALFORMED = 9, 17  # new entry 9 repeats an event the release published; 17 is not JSON

pytestmark = pytest.mark.usefixtures("valkey_server")


def sid(text: str) -> tuple[int, int]:
    ms, seq = text.split("-")
    return int(ms), int(seq)


def unpack(tmp_path: Path, release: str) -> tuple[Path, dict]:
    with tarfile.open(FIXTURES / f"release_lake_{release}.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    root = tmp_path / f"release_lake_{release}"
    return root, json.loads((root / "manifest.json").read_text())


def forget_streams(client, manifest: dict) -> None:
    """The pipeline's streams and its own keys (failures, gaps) off the worker's Valkey."""
    client.delete(*manifest["streams"], *client.keys(f"deltadrain:{{{manifest['pipeline']}}}:*"))


def new_entries(manifest: dict) -> list[dict]:
    """The entries the test appends: valid new events, one event the release published, one malformed."""
    repeated = next(e for e in manifest["entries"] if e["kind"] == "valid")
    out = []
    for j in range(NEW):
        stream = manifest["streams"][j % len(manifest["streams"])]
        eid = f"rl-new-{j:04d}"
        body = {"event_id": eid, "customer": f"cust-{j % 5:03d}", "amount": 5.5 + j, "quantity": 1 + j % 3,
                "status": "PAID" if j % 2 else "new", "event_time": f"2026-01-02T00:{j:02d}:00Z"}
        kind, text = "valid", json.dumps(body)
        if j == REPEAT:
            kind, eid, text = "repeat", repeated["event_id"], repeated["payload"]
        elif j == MALFORMED:
            kind, eid, text = "invalid_json", None, text[:-4] + "{oops"
        out.append({"stream": stream, "id": f"{NEW_BASE_MS + j}-0", "kind": kind, "event_id": eid, "payload": text})
    return out


def test_a_lake_written_by_the_release_is_drained_on_from_its_checkpoint(tmp_path, spark):
    root, manifest = unpack(tmp_path, RELEASE)
    cfg = load_config(root / manifest["config"])
    p = cfg.pipeline(manifest["pipeline"])
    target, dlq = str(cfg.target_path(p)), str(cfg.dlq_path(p))
    lake = cfg.lake_dir()
    assert lake == (root / manifest["lake"]).resolve() and target == str(lake / manifest["tables"]["target"])
    old_batch, old_positions = manifest["checkpoint"]["batch"], manifest["checkpoint"]["positions"]
    old_dead = {tuple(place) for place in manifest["dlq_places"]}

    # The release's lake as this code reads it.
    before = read_checkpoint(spark, target, p.name, dlq)
    assert (before.batch, before.positions, before.found_in) == (old_batch, old_positions, "commit")
    assert snapshot_txn(target, p.name)[0] == old_batch == manifest["batches"][-1]
    assert sorted(target_ids(spark, cfg, p)) == manifest["target_event_ids"]
    assert {(r.partition, r.position) for r in dlq_rows(spark, cfg, p)} == old_dead

    client = valkey_admin()
    forget_streams(client, manifest)
    try:
        # The streams as the release left them: every entry delivered to the group and acknowledged.
        for e in manifest["entries"]:
            client.xadd(e["stream"], {manifest["field"].encode(): e["payload"].encode()}, id=e["id"])
        for stream in manifest["streams"]:
            written = [e["id"] for e in manifest["entries"] if e["stream"] == stream]
            assert max(written, key=sid) == old_positions[stream]
            client.xgroup_create(stream, manifest["group"], id=old_positions[stream], entries_read=len(written))
        new = new_entries(manifest)
        for e in new:
            client.xadd(e["stream"], {manifest["field"].encode(): e["payload"].encode()}, id=e["id"])

        summaries = drain_until_done(cfg, p, spark, client)
        runs = [s.line() for s in summaries]
        assert [(s.outcome, s.batch) for s in summaries] == [("committed", old_batch + 1),
                                                             ("committed", old_batch + 2)], runs
        totals = [sum(getattr(s, key) for s in summaries) for key in ("claimed", "written", "duplicates_skipped",
                                                                      "dead_lettered", "acked")]
        assert totals == [NEW, NEW - 2, 1, 1, NEW], runs
        assert pending(client, p) == 0

        # Each event once: the release's rows and the new valid ones; the repeated event is not added again.
        ids = target_ids(spark, cfg, p)
        assert len(ids) == len(set(ids)), "an event id is twice in the target"
        new_good = {e["event_id"] for e in new if e["kind"] == "valid"}
        assert set(ids) == set(manifest["target_event_ids"]) | new_good
        rows = spark.read.format("delta").load(target)
        assert {r.event_id for r in rows.where(f"_dd_batch > {old_batch}").collect()} == new_good
        assert {r.status for r in rows.collect()} <= {"new", "paid", "shipped", "cancelled"}  # the transform ran

        # The DLQ: the release's dead letters as they were, and the new malformed entry, nothing valid.
        bad = next(e for e in new if e["kind"] == "invalid_json")
        dead = dlq_rows(spark, cfg, p)
        assert_dead_letters(dead, ids, old_dead | {(bad["stream"], bad["id"])})
        assert {(r.partition, r.position) for r in dead if r.batch <= old_batch} == old_dead
        [fresh] = [r for r in dead if r.batch > old_batch]
        assert (fresh.batch, fresh.state, fresh.error_type) == (old_batch + 1, "DEAD", "invalid_json")

        # The batch sequence and positions continue from the release's checkpoint.
        assert snapshot_txn(target, p.name)[0] == old_batch + 2
        after = read_checkpoint(spark, target, p.name, dlq)
        last_new = {s: max((e["id"] for e in new if e["stream"] == s), key=sid) for s in manifest["streams"]}
        assert (after.batch, after.positions, after.found_in) == (old_batch + 2, last_new, "commit")

        # One metrics row per run, after the release's; its quality results still read.
        metrics = spark.read.format("delta").load(str(lake / manifest["tables"]["metrics"])).where(
            f"pipeline = '{p.name}'")
        assert metrics.count() == manifest["metrics_rows"] + len(summaries)
        assert sorted(r.batch for r in metrics.where(f"batch > {old_batch}").collect()) == [old_batch + 1,
                                                                                          old_batch + 2]
        results = spark.read.format("delta").load(str(lake / manifest["tables"]["quality_results"]))
        assert results.where(f"pipeline = '{p.name}' AND success").count() == manifest["quality_result_rows"]

        # `deltadrain status` on the pipeline.
        status = pipeline_status(cfg, p)
        assert status["checkpoint"]["batch"] == old_batch + 2 and status["checkpoint"]["positions"] == last_new
        assert status["last_batch"]["batch"] == old_batch + 2
        assert (status["PUBLISHED"], status["DEAD"], status["PENDING"], status["CLAIMED"]) == (len(ids), len(dead),
                                                                                              0, 0)

        # Nothing left: another run commits nothing.
        again = drain(cfg, p, spark=spark)
        assert (again.outcome, again.batch) == ("empty", old_batch + 2)
    finally:
        forget_streams(client, manifest)
