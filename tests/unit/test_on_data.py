"""`schedule: on_data`: the source's Assets and their URIs, the watcher's decision to wake the ingest DAG,
its trigger as Airflow stores it, and the DAGs the factory makes of such a pipeline."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from deltadrain.config import parse_config
from deltadrain.names import batch_quality_dag_id, ingest_dag_id
from deltadrain.orchestration.assets import source_uri, watched
from deltadrain.orchestration.triggers import SourceDataTrigger, should_wake, work_seen
from tests.support.pipelines import example_config


def on_data_config(**airflow):
    data = example_config()
    for p in data["pipelines"]:
        p["schedule"] = "on_data"
        p["airflow"] = {**p.get("airflow", {}), **airflow}
    return parse_config(data, Path("/etc/deltadrain/pipelines.yaml"))


def test_source_uris_name_the_kind_the_first_server_and_the_stream_or_topic():
    assert source_uri("kafka", "b1:9092,b2:9092", "orders") == "kafka://b1:9092/orders"
    assert source_uri("valkey", "127.0.0.1:6399", "orders:{0}") == "valkey://127.0.0.1:6399/orders:{0}"
    # What a URL path cannot hold as it is is quoted: the stream stays one path, the Asset one URI.
    assert source_uri("valkey", "h:1", "a b/c?#") == "valkey://h:1/a%20b%2Fc%3F%23"


def test_a_valkey_pipeline_has_an_asset_per_stream_and_a_kafka_one_one_for_its_topic():
    from deltadrain.config.embedded import ports

    cfg = on_data_config()
    orders, clicks = cfg.pipelines
    assert [w for _, w in watched(cfg, orders)] == [[s] for s in orders.source.streams]
    assert [u for u, _ in watched(cfg, orders)] == [f"valkey://127.0.0.1:{ports(cfg).valkey}/{s}"
                                                    for s in orders.source.streams]
    assert watched(cfg, clicks) == [(f"kafka://127.0.0.1:{ports(cfg).kafka}/{clicks.source.topic}", None)]


def probe(new=0, reclaimable=0, gaps=0, unstarted=False, partitions=None) -> dict:
    parts = partitions if partitions is not None else {"s:{0}": {"new": new, "claimed": 0, "reclaimable": reclaimable}}
    return {"partitions": parts, "gaps": gaps, "unstarted": unstarted,
            "new": sum(p.get("new", 0) for p in parts.values()),
            "reclaimable": sum(p.get("reclaimable", 0) for p in parts.values()),
            "has_work": bool(sum(p.get("new", 0) + p.get("reclaimable", 0) for p in parts.values()) or gaps
                             or unstarted)}


def test_work_is_what_the_watched_partitions_hold_and_the_whole_pipelines_gaps():
    two = {"s:{0}": {"new": 3, "claimed": 0, "reclaimable": 0}, "s:{1}": {"new": 0, "claimed": 2, "reclaimable": 0}}
    assert work_seen(probe(partitions=two), ["s:{0}"]) is not None
    # Claimed and not stale: a drain holds them; nothing for this stream's watcher.
    assert work_seen(probe(partitions=two), ["s:{1}"]) is None
    assert work_seen(probe(partitions=two, gaps=1), ["s:{1}"]) is not None
    assert work_seen(probe(partitions={"s:{1}": {"new": 0, "claimed": 2, "reclaimable": 2}}), ["s:{1}"]) is not None
    assert work_seen(probe(partitions={}, unstarted=True), None) is not None  # Kafka's first run at `latest`
    assert work_seen(probe(), None) is None
    # The same work reads the same; more of it, or a drain taking some, reads differently.
    assert work_seen(probe(new=3), None) == work_seen(probe(new=3), None) != work_seen(probe(new=4), None)


def test_the_watcher_wakes_once_per_change_of_work_and_again_only_when_it_is_left_undone():
    assert not should_wake(None, None, None, 100.0, 60)
    assert should_wake("a", None, None, 100.0, 60)        # first work
    assert not should_wake("a", "a", 100.0, 130.0, 60)   # the run it woke is queued or draining it
    assert should_wake("b", "a", 100.0, 101.0, 60)        # more came: one more run (Airflow queues one)
    assert should_wake("a", "a", 100.0, 160.0, 60)        # still there a wait_timeout later: that run failed


def events_from(trigger: SourceDataTrigger, probes: list[dict], clock: list[float], monkeypatch) -> list[dict]:
    """The events the trigger yields for these probes, one per poll, at these times."""
    times = iter(clock)
    monkeypatch.setattr("deltadrain.orchestration.triggers.time.time", lambda: next(times))

    async def stream():
        for p in probes:
            yield p

    async def collect():
        return [e.payload async for e in trigger.filter_shared_stream(stream())]

    return asyncio.run(collect())


def test_many_polls_of_the_same_work_make_one_event_and_new_work_after_a_drain_another(monkeypatch):
    trigger = SourceDataTrigger("orders", "/x.yaml", poll_seconds=1, again_seconds=60, watch=["s:{0}"])
    polls = [probe(new=5), probe(new=5), probe(new=5),     # one event: the run it wakes drains them
             {"error": "ConnectionError: refused"},         # a source that is down is waited for
             probe(new=0), probe(new=0),                    # drained
             probe(new=5),                                  # the same count again, but new messages
             probe(new=5)]
    events = events_from(trigger, polls, [0, 1, 2, 4, 5, 6, 7], monkeypatch)
    assert len(events) == 2
    assert events[0] == {"pipeline": "orders", "watch": ["s:{0}"], "new": 5, "reclaimable": 0, "gaps": 0}
    # No message, no login in what the Asset event carries: counts only.
    assert set(events[0]) == {"pipeline", "watch", "new", "reclaimable", "gaps"}


def test_work_left_undone_wakes_the_dag_again_after_again_seconds(monkeypatch):
    trigger = SourceDataTrigger("orders", None, poll_seconds=1, again_seconds=60, watch=None)
    events = events_from(trigger, [probe(gaps=2)] * 4, [0, 30, 61, 62], monkeypatch)
    assert [e["gaps"] for e in events] == [2, 2]


def test_the_trigger_is_stored_by_its_kwargs_which_hold_no_secret_and_its_watchers_share_one_probe():
    from airflow.triggers.base import BaseEventTrigger

    cfg = on_data_config(poll_interval="PT3S", wait_timeout="PT2M")
    from deltadrain.orchestration.assets import source_assets

    assets = source_assets(cfg, cfg.pipelines[0], "/etc/deltadrain/pipelines.yaml")
    triggers = [a.watchers[0].trigger for a in assets]
    classpath, kwargs = triggers[0].serialize()
    assert classpath == "deltadrain.orchestration.triggers.SourceDataTrigger"
    assert kwargs == {"pipeline": "orders", "config": "/etc/deltadrain/pipelines.yaml", "poll_seconds": 3.0,
                      "again_seconds": 120.0, "watch": [cfg.pipelines[0].source.streams[0]]}
    rebuilt = SourceDataTrigger(**kwargs)
    assert rebuilt.serialize() == triggers[0].serialize()
    assert BaseEventTrigger.hash(classpath, kwargs) == BaseEventTrigger.hash(*rebuilt.serialize())
    # One watcher per stream, each its own trigger, and one probe loop for them all.
    assert len({BaseEventTrigger.hash(*t.serialize()) for t in triggers}) == len(assets) == 4
    assert len({t.shared_stream_key() for t in triggers}) == 1
    assert not any(word in json.dumps(kwargs).lower() for word in ("password", "secret", "token"))


@pytest.mark.parametrize("quality", ["fail", "quarantine"])
def test_an_on_data_ingest_dag_is_scheduled_on_its_sources_assets_and_outputs_its_tables(quality):
    from airflow.sdk.definitions.timetables.assets import AssetTriggeredTimetable
    from airflow.serialization.serialized_objects import DagSerialization

    from deltadrain.orchestration.factory import build_dags

    data = example_config()
    for p in data["pipelines"]:
        p["schedule"] = "on_data"
        p["quality"] = {**p.get("quality", {}), "on_failure": quality}
    cfg = parse_config(data, Path("/etc/deltadrain/pipelines.yaml"))
    dags = build_dags(cfg)
    for p in cfg.pipelines:
        dag = dags[ingest_dag_id(p.name)]
        assert isinstance(dag.timetable, AssetTriggeredTimetable) and dag.max_active_runs == 1
        assert [a.uri for a in dag.timetable.asset_condition.objects] == [u for u, _ in watched(cfg, p)]
        # No sensor: the watcher waited for the work in the triggerer before the run started.
        assert "wait_for_work" not in dag.task_ids
        drain = dag.task_dict["drain"]
        assert [o.uri for o in drain.outlets] == [cfg.target_path(p).as_uri(), cfg.dlq_path(p).as_uri()]
        if quality == "fail":  # source -> ingest -> target -> quality, the check in a DAG of its own
            checks = dags[batch_quality_dag_id(p.name)]
            assert [a.uri for a in checks.timetable.asset_condition.objects] == [cfg.target_path(p).as_uri()]
            assert "quality" not in dag.task_ids
        else:  # a quarantine writes to the target: its check stays in the run, the target its inlet
            assert batch_quality_dag_id(p.name) not in dags
            assert [i.uri for i in dag.task_dict["quality"].inlets] == [cfg.target_path(p).as_uri()]
        # What the DAG processor stores: the watchers' triggers by classpath and kwargs.
        stored = json.dumps(DagSerialization.serialize_dag(dag))
        assert stored.count("deltadrain.orchestration.triggers.SourceDataTrigger") == len(watched(cfg, p))


def test_on_data_is_an_ingest_schedule_only():
    from deltadrain.errors import ConfigError

    data = example_config()
    data["maintenance"] = {**data.get("maintenance", {}), "schedule": "on_data"}
    with pytest.raises(ConfigError, match="field 'maintenance.schedule': 'on_data' is not a cron expression"):
        parse_config(data, Path("x.yaml"))
