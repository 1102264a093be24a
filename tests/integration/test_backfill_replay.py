"""Backfill and replay on real Valkey, Kafka, Spark and Delta, judged by reading the tables back:
healed rows appear once, replays never duplicate. What every source must do (a backfill that heals
deleted rows without moving the checkpoint or the group, one that names the history the source
removed, a reprocess) is in the contract suite, tests/integration/test_contract.py; these are the
rest: constraints, ids repeated past the dedup window, DLQ replay filters and races, the CLI, and each
source's own ways (Valkey's maxlen and history gaps; Kafka's producer timestamps, read ranges and
ids by place)."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

import pytest

from deltadrain.catchup import drain
from deltadrain.dev.produce import MALFORMED_KINDS, generate, produce
from deltadrain.errors import DeltadrainError
from deltadrain.heal.backfill import backfill
from deltadrain.heal.replay import ReplayRequest, parse_request, replay
from deltadrain.sources.valkey.client import valkey_client
from tests.support.lake import dlq_rows, target_ids
from tests.support.valkey import drain_until_done, make_pipeline, valkey_admin


def delete_rows(spark, cfg, pipeline, ids: list[str]) -> None:
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    DeltaTable.forPath(spark, str(cfg.target_path(pipeline))).delete(
        F.col(pipeline.payload_schema.id_field).isin(ids))


def test_a_backfill_leaves_out_and_names_the_rows_the_target_refuses(tmp_path, spark, valkey_server):
    """A constraint added after a row was lost refuses it: the backfill merges the other lost rows and
    names the refused one (history, like a transform failure here: it is not made a dead letter). A
    later message with the refused one's id, which the constraint accepts, takes its place."""
    _, c, p = make_pipeline(tmp_path)
    client = valkey_client(c, p)
    began = datetime.now(UTC) - timedelta(seconds=1)
    result = produce(c, p, 30, seed=104)
    victim = json.loads(next(generate(p, 1, seed=104, start=1)).value)
    client.xadd(p.source.streams[2], {b"data": json.dumps({**victim, "customer": "cust-again"}).encode()})
    ended = datetime.now(UTC) + timedelta(seconds=1)
    drain_until_done(c, p, spark, client)
    lost = sorted(result.valid_ids)[:4]
    assert lost[1] == victim["event_id"]
    delete_rows(spark, c, p, lost)
    spark.sql(f"ALTER TABLE delta.`{c.target_path(p)}` ADD CONSTRAINT not_it CHECK (customer <> '{victim['customer']}')")
    s = backfill(c, p, spark, began, ended)
    assert (s.read, s.written, s.duplicates_skipped, s.dead_lettered) == (31, 4, 26, 0), s
    assert [(r["error"], json.loads(client.xrange(r["partition"], r["position"], r["position"])[0][1][b"data"]))
            for r in s.skipped_refused] == [(f"CHECK constraint not_it (customer <> '{victim['customer']}')", victim)]
    assert sorted(target_ids(spark, c, p)) == sorted(result.valid_ids)
    held = spark.read.format("delta").load(str(c.target_path(p))).where(f"event_id = '{victim['event_id']}'")
    assert [r.customer for r in held.collect()] == ["cust-again"]
    assert dlq_rows(spark, c, p) == []


def test_a_reprocess_of_an_id_the_target_holds_twice_rewrites_each_row_from_its_own_message(tmp_path, spark,
                                                                                              valkey_server):
    """A business id repeated beyond dedup_window is two rows (semantics.md, section 7). Reprocessing
    that id re-reads both messages, and each updates the row it was published as, not both rows."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    _, c, p = make_pipeline(tmp_path, partitions=1, dedup_window="PT0S")
    client = valkey_client(c, p)
    stream = p.source.streams[0]
    first, second = (json.loads(m.value) for m in generate(p, 2, seed=107))
    second["event_id"] = first["event_id"]  # the same business id, later, with other values
    assert first["customer"] != second["customer"]
    for payload in (first, second):
        client.xadd(stream, {b"data": json.dumps(payload).encode()})
        assert drain(c, p, spark=spark).outcome == "committed"  # a batch each: the window misses the first
    target = str(c.target_path(p))

    def rows():
        return sorted((r._dd_position, r.customer) for r in spark.read.format("delta").load(target).collect())

    published = rows()
    assert [customer for _, customer in published] == [first["customer"], second["customer"]]
    DeltaTable.forPath(spark, target).update(F.lit(True), {"customer": F.lit("corrupted")})
    done = replay(c, spark, ReplayRequest(pipeline=p.name, mode="reprocess", message_ids=[first["event_id"]],
                                          dry_run=False))
    assert (done.selected, done.written, done.skipped, done.batches) == (2, 2, [], [1, 2])
    assert rows() == published


def test_a_reprocess_skips_the_rows_a_constraint_refuses_naming_it_and_updates_the_rest(tmp_path, spark,
                                                                                       valkey_server):
    """The transform's new version breaks the target's CHECK on some rows: those messages keep their
    old rows and are reported with the constraint, the others are rewritten."""
    from pyspark.sql import functions as F

    _, c, p = make_pipeline(tmp_path, partitions=1)
    client = valkey_client(c, p)
    produce(c, p, 20, seed=108)
    drain_until_done(c, p, spark, client)
    target = str(c.target_path(p))
    spark.sql(f"ALTER TABLE delta.`{target}` ADD CONSTRAINT lower_customer CHECK (customer = lower(customer))")
    before = {r.event_id: r for r in spark.read.format("delta").load(target).collect()}
    odd = next(r for r in before.values() if r.quantity % 2 == 1)
    even = next(r for r in before.values() if r.quantity % 2 == 0)
    shouting = p.model_copy(update={"transform": "tests.integration.shout_transform.shout_odd_quantities"})
    done = replay(c.model_copy(update={"pipelines": [shouting]}), spark,
                  ReplayRequest(pipeline=p.name, mode="reprocess", message_ids=[odd.event_id, even.event_id],
                                dry_run=False))
    assert (done.selected, done.written) == (2, 1)
    assert [(x["partition"], x["position"]) for x in done.skipped] == [(odd._dd_partition, odd._dd_position)]
    assert "lower_customer" in done.skipped[0]["reason"] and "refused" in done.skipped[0]["reason"]
    after = {r.event_id: r for r in spark.read.format("delta").load(target).where(
        F.col("event_id").isin(odd.event_id, even.event_id)).collect()}
    assert after[odd.event_id].asDict() == before[odd.event_id].asDict()  # untouched
    assert after[even.event_id]._dd_run_id == done.run_id and after[even.event_id].customer == even.customer
    assert spark.read.format("delta").load(target).count() == len(before)
    # A transform that now filters one of them out: that row stays as published, reported, its batch unlisted.
    single = next(r for r in before.values() if r.quantity == 1)
    filtering = p.model_copy(update={"transform": "tests.integration.filter_transform.drop_single_items"})
    done = replay(c.model_copy(update={"pipelines": [filtering]}), spark,
                  ReplayRequest(pipeline=p.name, mode="reprocess", message_ids=[single.event_id, even.event_id],
                                dry_run=False))
    assert (done.selected, done.written, done.batches) == (2, 1, [even._dd_batch])
    assert [(x["partition"], x["position"]) for x in done.skipped] == [(single._dd_partition, single._dd_position)]
    assert "filters it out" in done.skipped[0]["reason"]
    kept = spark.read.format("delta").load(target).where(F.col("event_id") == single.event_id).collect()
    assert [r.asDict() for r in kept] == [before[single.event_id].asDict()]


def test_a_dlq_replay_does_not_send_back_a_dead_letter_the_target_holds_at_its_own_place(tmp_path, spark,
                                                                                           valkey_server):
    """A DEAD dead letter of a message the target holds from the same place (a run killed between its
    refused dead letters and its commit, then drained again after the constraint was dropped) is not
    sent back: past the dedup window its copy would be a second row. It is marked REPLAYED, so that
    it neither stays DEAD nor takes a place in every later replay; a dry run only names it."""
    from deltadrain.lake.deadletter import dlq_struct, write_dead_letters

    _, c, p = make_pipeline(tmp_path, partitions=1)
    client = valkey_client(c, p)
    result = produce(c, p, 20, seed=106)
    drain_until_done(c, p, spark, client)
    stream = p.source.streams[0]
    position, entry = client.xrange(stream, count=1)[0]
    now = datetime.now(UTC)
    hi, lo = (int(x) for x in position.decode().split("-"))
    row = {"pipeline": p.name, "partition": stream, "position": position.decode(), "pos_hi": hi, "pos_lo": lo,
           "message_id": json.loads(entry[b"data"])["event_id"], "original": bytes(entry[b"data"]),
           "error": "the target table refused its row: CHECK constraint gone (event_id <> 'x')", "error_type": "refused",
           "attempts": 1, "first_failure_at": now, "last_failure_at": now, "state": "DEAD", "batch": 2,
           "run_id": "killed-run", "replayed_at": None, "replay_run_id": None}
    write_dead_letters(spark, str(c.dlq_path(p)), spark.createDataFrame([row], dlq_struct()))
    reason = "the target holds this message at its own place already: marked REPLAYED without sending it"
    dry = replay(c, spark, ReplayRequest(pipeline=p.name))
    assert (dry.selected, dry.replayed, [x["reason"] for x in dry.skipped]) == (1, 0, [reason])
    assert [d.state for d in dlq_rows(spark, c, p)] == ["DEAD"]
    done = replay(c, spark, ReplayRequest(pipeline=p.name, dry_run=False))
    assert (done.selected, done.replayed, [x["reason"] for x in done.skipped]) == (1, 0, [reason])
    assert [(d.state, d.replay_run_id) for d in dlq_rows(spark, c, p)] == [("REPLAYED", done.run_id)]
    assert replay(c, spark, ReplayRequest(pipeline=p.name, dry_run=False)).selected == 0
    assert client.xlen(stream) == 20
    assert sorted(target_ids(spark, c, p)) == sorted(result.valid_ids)


@pytest.mark.slow
def test_dlq_replay_with_filters_and_dry_run(tmp_path, spark, valkey_server):
    path, c, p = make_pipeline(tmp_path, max_retries=0, transform="deltadrain.transforms.identity")
    client = valkey_client(c, p)
    result = produce(c, p, 300, seed=105, malformed_ratio=0.1)
    drain_until_done(c, p, spark, client)
    dead = dlq_rows(spark, c, p)
    kinds = {r.error_type for r in dead}
    assert {(r.partition, r.position) for r in dead} == result.bad_places(MALFORMED_KINDS) and len(kinds) > 2
    some = sorted(dead, key=lambda r: (r.partition, r.pos_hi, r.pos_lo))[0]
    dry = replay(c, spark, ReplayRequest(pipeline=p.name, error_contains=some.error[:20], limit=2))
    assert 1 <= dry.selected <= 2 and dry.replayed == 0 and {r.state for r in dlq_rows(spark, c, p)} == {"DEAD"}

    one = ReplayRequest(pipeline=p.name, partition=some.partition, position_from=some.position,
                        position_to=some.position, dry_run=False)
    # With its stream since removed from the config no drain reads it: the entry is not sent there.
    source = p.source.model_copy(update={"streams": [s for s in p.source.streams if s != some.partition]})
    narrowed = c.model_copy(update={"pipelines": [p.model_copy(update={"source": source})]})
    gone = replay(narrowed, spark, one)
    assert (gone.selected, gone.replayed) == (1, 0) and "no drain reads it" in gone.skipped[0]["reason"]
    assert {r.state for r in dlq_rows(spark, c, p)} == {"DEAD"}
    done = replay(c, spark, one)
    assert done.selected == 1 and done.replayed == 1
    by_key = {(r.partition, r.position): r for r in dlq_rows(spark, c, p)}
    assert by_key[(some.partition, some.position)].state == "REPLAYED"
    assert by_key[(some.partition, some.position)].replay_run_id == done.run_id
    assert sum(r.state == "REPLAYED" for r in by_key.values()) == 1
    assert replay(c, spark, one).selected == 0  # already REPLAYED
    # Still malformed: the next drain dead-letters the replayed copy again, as a new entry.
    drain_until_done(c, p, spark, client)
    assert len(dlq_rows(spark, c, p)) == len(dead) + 1


@pytest.mark.parametrize("maxlen", [50, None])
def test_replayed_dead_letters_are_appended_under_the_streams_maxlen(tmp_path, valkey_server, maxlen):
    """config's maxlen is applied by every producer of a stream: replay's XADD trims as produce does
    (approximately: whole nodes of 100 entries go), and without maxlen it keeps everything. Entries
    the group has not drained yet are never what it trims: such a replay is refused, nothing sent."""
    from deltadrain.dev.produce import VALKEY_FIELD
    from deltadrain.errors import DeltadrainError
    from deltadrain.sources import source_of

    _, c, p = make_pipeline(tmp_path, partitions=1)
    p = p.model_copy(update={"source": p.source.model_copy(update={"maxlen": maxlen})})
    client, stream = valkey_client(c, p), p.source.streams[0]
    pipe = client.pipeline(transaction=False)
    for i in range(1000):
        pipe.xadd(stream, {VALKEY_FIELD: b"x%d" % i})
    pipe.execute()
    copy = {"partition": stream, "original": b"{}", "position": "1-0"}
    client.xgroup_create(stream, p.source.group, id="0")  # all 1000 unread
    if maxlen:
        with pytest.raises(DeltadrainError, match=re.escape(f"{stream}: 1 copies + 1000 entries not yet drained > maxlen 50")):
            source_of(p).send_back(c, p, [copy])
        assert client.xlen(stream) == 1000
        entries = client.xreadgroup(p.source.group, "d", {stream: ">"}, count=990)[0][1]
        client.xack(stream, p.source.group, *[i for i, _ in entries])  # 10 left to drain: room for one copy
    source_of(p).send_back(c, p, [copy])
    length = client.xlen(stream)
    assert (50 <= length < 150) if maxlen else length == 1001
    last = client.xrevrange(stream, count=1)[0][1]
    assert last[b"replay_of"] == b"1-0" and last[VALKEY_FIELD] == b"{}"


@pytest.mark.slow
def test_two_replays_at_once_mark_both_entries_replayed(tmp_path, spark, valkey_server, monkeypatch):
    # Two replay DAG runs started together (the view's "Replay selected" does that) both rewrite the
    # DLQ table's one file; each commit must land or conflict and retry, never replace the other's.
    # Their marking MERGEs start together (a barrier), so that they read the same table version and
    # one of them really loses the race, which the test checks.
    import threading
    from concurrent.futures import ThreadPoolExecutor

    import deltadrain.heal.replay
    from deltadrain.lake.delta import is_conflict

    together, lost = threading.Barrier(2, timeout=300), []
    real_retry = deltadrain.heal.replay.retry_conflicts

    def both_at_once(action, *args, **kwargs):
        first = [True]

        def attempt():
            if first[0]:
                first[0] = False
                together.wait()
            try:
                return action()
            except Exception as exc:
                if is_conflict(exc):
                    lost.append(type(exc).__name__)
                raise

        return real_retry(attempt, *args, **kwargs)

    monkeypatch.setattr(deltadrain.heal.replay, "retry_conflicts", both_at_once)
    path, c, p = make_pipeline(tmp_path, max_retries=0, transform="deltadrain.transforms.identity")
    client = valkey_client(c, p)
    produce(c, p, 200, seed=107, malformed_ratio=0.1)
    drain_until_done(c, p, spark, client)
    dead = sorted(dlq_rows(spark, c, p), key=lambda r: (r.partition, r.pos_hi, r.pos_lo))
    for round_ in range(2):
        picked = dead[2 * round_:2 * round_ + 2]
        requests = [ReplayRequest(pipeline=p.name, partition=r.partition, position_from=r.position,
                                  position_to=r.position, dry_run=False) for r in picked]
        lost.clear()
        with ThreadPoolExecutor(2) as pool:
            done = list(pool.map(lambda q: replay(c, spark, q), requests))
        assert lost, "the two marking commits did not collide"
        assert [d.replayed for d in done] == [1, 1]
        by_key = {(r.partition, r.position): r for r in dlq_rows(spark, c, p)}
        assert [by_key[(r.partition, r.position)].replay_run_id for r in picked] == [d.run_id for d in done]
        assert sum(r.state == "REPLAYED" for r in by_key.values()) == 2 * (round_ + 1)
    # The four replayed copies are still malformed: drained, they are dead letters again, once each.
    drain_until_done(c, p, spark, client)
    assert len(dlq_rows(spark, c, p)) == len(dead) + 4


def test_replay_requests_are_validated_values(cfg):
    with pytest.raises(DeltadrainError, match="not configured"):
        parse_request(cfg, {"pipeline": "nope"})
    with pytest.raises(DeltadrainError, match="limit"):
        parse_request(cfg, {"pipeline": cfg.pipelines[0].name, "limit": -1})
    with pytest.raises(DeltadrainError, match="time range is inverted"):
        parse_request(cfg, {"pipeline": cfg.pipelines[0].name, "since": "2026-02-01T00:00:00Z",
                            "until": "2026-01-01T00:00:00Z"})
    with pytest.raises(DeltadrainError, match="position range is inverted"):
        parse_request(cfg, {"pipeline": cfg.pipelines[0].name, "position_from": "10-0", "position_to": "9-5"})
    with pytest.raises(DeltadrainError, match="mode"):
        parse_request(cfg, {"pipeline": cfg.pipelines[0].name, "mode": "drop table"})
    valkey = next(p for p in cfg.pipelines if p.source.kind == "valkey")
    kafka = next(p for p in cfg.pipelines if p.source.kind == "kafka")
    for params, word in (({"pipeline": valkey.name, "partition": "orders:{9}"}, "not one of the pipeline's streams"),
                         ({"pipeline": kafka.name, "partition": "clicks-0"}, "a Kafka partition is a number"),
                         ({"pipeline": kafka.name, "position_from": "5-3"}, "a Kafka position is an offset"),
                         ({"pipeline": valkey.name, "position_to": "\u0661\u0662-0"}, "is not a position"),
                         ({"pipeline": valkey.name, "message_ids": ["a"] * 100_001}, "message_ids")):
        with pytest.raises(DeltadrainError, match=word):
            parse_request(cfg, params)
    assert parse_request(cfg, {"pipeline": kafka.name, "partition": "3", "position_to": "42"}).partition == "3"
    ok = parse_request(cfg, {"pipeline": cfg.pipelines[0].name, "error_contains": "x' OR 1=1 --", "since": "",
                             "position_from": "1700000000000-10"})
    assert ok.error_contains == "x' OR 1=1 --" and ok.since is None and ok.dry_run


@pytest.mark.slow
def test_backfill_and_replay_commands(tmp_path, spark, valkey_server, spark_connect_server):
    """`deltadrain backfill` and `replay` as the operator runs them (on the worker's Connect server: the
    commands are what is tested here, not a driver of their own)."""
    import json
    import subprocess
    import sys

    path, c, p = make_pipeline(tmp_path, max_retries=0)
    client = valkey_client(c, p)
    began = datetime.now(UTC) - timedelta(seconds=1)
    result = produce(c, p, 120, seed=107, malformed_ratio=0.1)
    drain_until_done(c, p, spark, client)
    delete_rows(spark, c, p, sorted(result.valid_ids)[:2])
    cli = [sys.executable, "-m", "deltadrain.cli", "--config", str(path)]
    done = subprocess.run([*cli, "backfill", p.name, "--start", began.isoformat(),
                           "--end", (datetime.now(UTC) + timedelta(seconds=1)).isoformat(), "--remote"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    s = json.loads(done.stdout.strip().splitlines()[-1])
    assert s["mode"] == "backfill" and s["written"] == 2 and s["acked"] == 0
    assert sorted(target_ids(spark, c, p)) == sorted(result.valid_ids)
    dry = subprocess.run([*cli, "replay", p.name, "--json", "--remote"], capture_output=True, text=True,
                         timeout=600)
    assert dry.returncode == 0, dry.stderr[-2000:]
    shown = json.loads(dry.stdout[dry.stdout.index("{"):])
    dead = dlq_rows(spark, c, p)
    assert shown["dry_run"] and shown["selected"] == len(dead) and "add --apply" in dry.stderr
    bad = subprocess.run([*cli, "replay", p.name, "--limit", "0"], capture_output=True, text=True, timeout=600)
    assert bad.returncode == 1 and "limit" in bad.stderr


def test_a_kafka_backfill_does_not_duplicate_a_record_stamped_long_before_its_interval(tmp_path, spark,
                                                                                       kafka_broker):
    """The interval picks offsets by timestamp, but a record's CreateTime is the producer's: one
    stamped 10 days back sits among records of today. Its row must still be found by the MERGE (the
    dedup window starts from the rows' oldest source time), or every backfill inserts it again."""
    from confluent_kafka import Producer

    from deltadrain.dev.produce import generate
    from deltadrain.sources.kafka.client import kafka_client_conf
    from tests.support.kafka import drain_until_done as drain_kafka
    from tests.support.kafka import make_kafka_pipeline

    _, c, p = make_kafka_pipeline(tmp_path, partitions=1)
    began = datetime.now(UTC) - timedelta(seconds=5)
    msgs = list(generate(p, 30, seed=83))
    stamped = int((datetime.now(UTC) - timedelta(days=10)).timestamp() * 1000)
    producer = Producer(kafka_client_conf(c, p))
    for i, m in enumerate(msgs):  # timestamp 0: the producer's clock
        producer.produce(p.source.topic, value=m.value, key=m.partition_key, partition=0,
                         timestamp=stamped if i == 15 else 0)
    assert producer.flush(30) == 0
    drain_kafka(c, p, spark)
    for _ in range(2):
        healed = backfill(c, p, spark, began, datetime.now(UTC) + timedelta(seconds=1))
        assert (healed.read, healed.written, healed.duplicates_skipped) == (30, 0, 30)
    ids = target_ids(spark, c, p)
    assert len(ids) == len(set(ids)) == 30


def test_a_kafka_reprocess_reads_each_far_apart_record_as_a_range_of_its_own(tmp_path, spark, kafka_broker,
                                                                            monkeypatch):
    """Three records of one partition, far apart (here any two not adjacent are): each is read as a
    range of its own, not every offset between them, and each row is rewritten from its record."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    from deltadrain.sources.kafka import drain as kafka_drain
    from deltadrain.sources.kafka import history as kafka_history
    from tests.support.kafka import drain_until_done as drain_kafka
    from tests.support.kafka import make_kafka_pipeline

    _, c, p = make_kafka_pipeline(tmp_path, partitions=1)
    produce(c, p, 30, seed=106)
    drain_kafka(c, p, spark)
    target = str(c.target_path(p))
    ids = target_ids(spark, c, p)
    held = (spark.read.format("delta").load(target).select("event_id", "customer", F.col("_dd_position").cast("long")
                                                           .alias("at")).orderBy("at").collect())
    victims = {r.event_id: r.customer for r in (held[0], held[len(held) // 2], held[-1])}
    DeltaTable.forPath(spark, target).update(F.col("event_id").isin(list(victims)), {"customer": F.lit("corrupted")})
    monkeypatch.setattr(kafka_history, "PICK_SPAN", 2)
    reads = []
    real_read = kafka_drain.read_ranges
    monkeypatch.setattr(kafka_drain, "read_ranges", lambda *a, **k: reads.append(a[3]) or real_read(*a, **k))
    r = replay(c, spark, ReplayRequest(pipeline=p.name, mode="reprocess", message_ids=list(victims), dry_run=False))
    assert (r.selected, r.written, r.skipped) == (3, 3, [])
    assert [sum(hi - lo for lo, hi in ranges.values()) for ranges in reads] == [1, 1, 1]
    rows = spark.read.format("delta").load(target).where(F.col("event_id").isin(list(victims))).collect()
    assert {row.event_id: row.customer for row in rows} == victims
    assert sorted(target_ids(spark, c, p)) == sorted(ids)


def test_a_replay_position_bound_without_a_sequence_covers_that_whole_millisecond(spark):
    from deltadrain.heal.replay import _filtered

    df = spark.createDataFrame([("a", 1700000000000, 0), ("b", 1700000000000, 3), ("c", 1700000000001, 0)],
                               "id string, hi long, lo long")

    def picked(**bounds) -> list[str]:
        request = ReplayRequest(pipeline="orders", **bounds)
        got = _filtered(df, request, id_col="id", time_col="id", partition_col="id", hi="hi", lo="lo")
        return sorted(r.id for r in got.collect())

    assert picked(position_to="1700000000000") == ["a", "b"]  # as XRANGE reads an end bound
    assert picked(position_to="1700000000000-0") == ["a"]
    assert picked(position_from="1700000000000") == ["a", "b", "c"]
    assert picked(position_from="1700000000000-1", position_to="1700000000001") == ["b", "c"]
    assert picked(position_to="1700000000000-3") == ["a", "b"]  # Kafka offsets compare the same way (lo 0)


def test_a_kafka_dlq_replay_sent_twice_lands_each_dead_letter_once(tmp_path, spark, kafka_broker, monkeypatch):
    """A crash between the re-append and the REPLAYED mark re-sends on the next replay: the copies
    must land on one row each, also for messages whose id is their place (no id field), and also
    when a copy died again and its dead letter is replayed in turn."""
    import json

    import yaml
    from confluent_kafka import Producer

    import deltadrain.heal.replay as replay_module
    from deltadrain.config import load_config
    from deltadrain.sources.kafka.client import kafka_client_conf
    from deltadrain.transforms import POISON_MARKER
    from tests.support.kafka import drain_until_done as drain_kafka
    from tests.support.kafka import make_kafka_pipeline

    path, c, p = make_kafka_pipeline(tmp_path, partitions=2, max_retries=0)
    producer = Producer(kafka_client_conf(c, p))

    def send(i: int, *, poison: bool, with_id: bool) -> None:
        body = {"customer": POISON_MARKER if poison else f"c{i}", "amount": 1.5, "quantity": 1,
                "status": "NEW", "event_time": "2026-11-25T07:00:00Z"}
        if with_id:
            body["event_id"] = f"evt-{i}"
        producer.produce(p.source.topic, json.dumps(body).encode(), partition=i % 2)

    for i in range(20):
        send(i, poison=False, with_id=True)
    for i in range(20, 26):  # poison the sample transform refuses, half without an id of their own
        send(i, poison=True, with_id=i < 23)
    producer.flush(30)
    drain_kafka(c, p, spark)
    dead = dlq_rows(spark, c, p)
    assert len(dead) == 6 and {r.error_type for r in dead} == {"transform"}
    placed = sorted(r.message_id for r in dead if not r.message_id.startswith("evt-"))
    assert len(placed) == 3 and all(m.startswith(f"{p.source.topic}-") for m in placed)

    # Replayed while the transform still refuses them: the copies die again, under the same ids.
    first = replay(c, spark, ReplayRequest(pipeline=p.name, dry_run=False))
    assert first.replayed == 6
    drain_kafka(c, p, spark)
    again_dead = [r for r in dlq_rows(spark, c, p) if r.state == "DEAD"]
    assert sorted(r.message_id for r in again_dead) == sorted(r.message_id for r in dead)
    assert {(r.partition, r.position) for r in again_dead}.isdisjoint({(r.partition, r.position) for r in dead})

    # The transform is fixed; the replay's first try dies after the re-append, before the mark.
    data = yaml.safe_load(path.read_text())
    next(q for q in data["pipelines"] if q["name"] == p.name)["transform"] = "deltadrain.transforms.identity"
    path.write_text(yaml.safe_dump(data))
    c = load_config(path)
    p = c.pipeline(p.name)
    mark = replay_module.mark_replayed

    def crash(*args, **kwargs):
        raise RuntimeError("killed between the re-append and the mark")

    monkeypatch.setattr(replay_module, "mark_replayed", crash)
    request = ReplayRequest(pipeline=p.name, dry_run=False)
    with pytest.raises(RuntimeError, match="killed"):
        replay(c, spark, request)
    monkeypatch.setattr(replay_module, "mark_replayed", mark)
    again = replay(c, spark, request)
    assert again.selected == 6 and again.replayed == 6
    assert [r.state for r in dlq_rows(spark, c, p)] == ["REPLAYED"] * 12

    runs = drain_kafka(c, p, spark)
    assert sum(s.claimed for s in runs) == 12  # both copies of every dead letter were read
    ids = target_ids(spark, c, p)
    assert len(ids) == len(set(ids)) == 26, "a replayed copy landed as a second row"
    assert set(ids) == {f"evt-{i}" for i in range(23)} | set(placed)


def test_history_gaps_name_a_trim_an_xdel_both_at_once_and_a_stream_emptied(tmp_path, valkey_server):
    """What a backfill reports of the history it cannot read, from a real stream's XINFO: trimming
    leaves max-deleted-entry-id alone, so an XDEL after a trim is a second gap; a stream trimmed to
    empty has no first entry (it reads 0-0) and is one gap up to its last id, not none."""
    from deltadrain.sources.valkey.history import StreamRange, history_gaps

    _, c, p = make_pipeline(tmp_path, partitions=1)
    client = valkey_client(c, p)
    base = p.source.streams[0]
    names = {kind: f"{base}-{kind}" for kind in ("trim", "xdel", "both", "empty", "whole")}
    for name in names.values():
        for i in range(1, 11):
            client.xadd(name, {"n": i}, id=f"{i}-0")
    valkey_admin().xtrim(names["trim"], minid="4-0", approximate=False)
    valkey_admin().xdel(names["xdel"], "7-0")
    valkey_admin().xdel(names["both"], "7-0")  # ends up in the retained part, after the trim below
    valkey_admin().xtrim(names["both"], minid="4-0", approximate=False)
    valkey_admin().xtrim(names["empty"], maxlen=0, approximate=False)

    def gaps(kind: str, lo: str = "2-0", hi: str = "9-0") -> list[tuple[str, str, str]]:
        return [(g["from"], g["to"], g["reason"].split(":")[0].split(" up to")[0])
                for g in history_gaps(client, [StreamRange(names[kind], lo, hi)])]

    trimmed, deleted = "the stream was trimmed (MAXLEN/MINID)", "entries"
    assert gaps("trim") == [("2-0", "3-18446744073709551615", trimmed)]
    assert gaps("xdel") == [("2-0", "7-0", deleted)]
    assert gaps("both") == [("2-0", "3-18446744073709551615", trimmed), ("4-0", "7-0", deleted)]
    assert gaps("both", lo="8-0") == []  # the range starts after everything removed
    assert gaps("empty") == [("2-0", "9-0", "the stream holds no entries")]
    assert gaps("empty", lo="11-0", hi="12-0") == []  # after its last id: nothing was there to lose
    assert gaps("whole") == []  # nothing removed
    reason = history_gaps(client, [StreamRange(names["empty"], "1-0", "5-0")])[0]["reason"]
    assert "all 10 added up to 10-0 were trimmed or deleted" in reason
