"""The Valkey drain against real Valkey, Spark and Delta, judged by reading the tables back: what only
Valkey has (leases and the reaper, stream ids, entries trimmed or XDELed, splits of what dead runs
held) and the drain's own steps tested on it (constraints, conflicting writers, spark-submit). What
every source must keep is in the contract suite, tests/integration/test_contract.py.

Each test has a pipeline of its own (streams, group, tables), so they can share the servers.
"""

from __future__ import annotations

import json
import logging
import re
import time

import pytest

from deltadrain.catchup import drain
from deltadrain.dev.produce import MALFORMED_KINDS, generate, produce
from deltadrain.failpoints import fired
from deltadrain.lake.checkpoint import read_checkpoint
from deltadrain.observe.status import mark_stale, pipeline_status
from deltadrain.positions import StreamId
from deltadrain.run.drain import DrainError
from deltadrain.sources import source_of
from deltadrain.sources.valkey.client import valkey_client
from deltadrain.sources.valkey.reap import REAPER, reap
from deltadrain.sources.valkey.status import valkey_counts
from tests.support.lake import dlq_rows, target_ids
from tests.support.pipelines import set_source
from tests.support.processes import cli_drain, held_at, run_or_killed, summary_of, wait_held
from tests.support.valkey import assert_exactly_once, drain_until_done, make_pipeline, pending, valkey_admin

pytestmark = pytest.mark.usefixtures("valkey_server")


def test_a_batch_refused_again_takes_its_refused_dead_letters_back(tmp_path, cfg, spark, monkeypatch):
    """Were the messages the constraints name not the ones Delta refuses, the second MERGE is refused
    too and nothing commits: the dead letters written for the first refusal are deleted (a later run,
    after the constraint changed, could publish those messages) and the batch stays pending."""
    import deltadrain.run.drain as drain_module
    from deltadrain.run.drain import BatchFailure

    _, c, p = make_pipeline(tmp_path, partitions=1, min_idle_ms=0)
    client = valkey_client(c, p)
    produce(c, p, 10, seed=64)
    assert drain(c, p, spark=spark).written == 10
    spark.sql(f"ALTER TABLE delta.`{c.target_path(p)}` ADD CONSTRAINT not_15 CHECK (event_id <> 'evt-64-000000015')")
    produce(c, p, 20, seed=64, start=10)
    stream = p.source.streams[0]
    entry = {json.loads(f[b"data"])["event_id"]: e.decode() for e, f in client.xrange(stream)}
    monkeypatch.setattr(drain_module, "refused_messages",
                        lambda *_: ([(stream, entry["evt-64-000000016"], "a wrongly named row")], ""))
    with pytest.raises(BatchFailure, match="refused its rows again without the 1 messages its constraints name"):
        drain(c, p, spark=spark)
    assert dlq_rows(spark, c, p) == [] and len(target_ids(spark, c, p)) == 10 and pending(client, p) == 20
    monkeypatch.undo()
    # The 20 the failed run holds (min_idle_ms: 0) are read half at a time, as a dead run's.
    runs = [drain(c, p, spark=spark) for _ in range(2)]
    assert [(r.reclaimed, r.written, r.dead_lettered) for r in runs] == [(10, 9, 1), (10, 10, 0)], runs
    assert [json.loads(bytes(r.original))["event_id"] for r in dlq_rows(spark, c, p)] == ["evt-64-000000015"]


def test_a_constraint_that_refuses_most_of_a_batch_fails_the_run_instead_of_dead_lettering_it(tmp_path, cfg, spark):
    """A constraint that refuses most of a batch (drain.refuses_the_data) refuses the data itself, not a
    few bad messages: the run fails naming it, commits and dead-letters nothing, and leaves the batch
    pending, instead of emptying the stream into the DLQ one batch at a time."""
    from deltadrain.run.drain import BatchFailure

    _, c, p = make_pipeline(tmp_path)
    client = valkey_client(c, p)
    produce(c, p, 10, seed=63)
    assert drain(c, p, spark=spark).written == 10
    spark.sql(f"ALTER TABLE delta.`{c.target_path(p)}` ADD CONSTRAINT early "
              "CHECK (event_id < 'evt-63-000000010')")
    produce(c, p, 30, seed=63, start=10)
    with pytest.raises(BatchFailure, match="30 of the batch's 30 messages break its constraints: they refuse the "
                                           "data itself.*CHECK constraint early"):
        drain(c, p, spark=spark)
    assert len(target_ids(spark, c, p)) == 10 and dlq_rows(spark, c, p) == []
    assert pending(client, p) == 30


def test_stream_ids_that_compare_wrongly_as_strings(tmp_path, cfg, spark):
    _, c, p = make_pipeline(tmp_path, partitions=1)
    client = valkey_client(c, p)
    stream = p.source.streams[0]
    msgs = list(generate(p, 12, seed=4))
    for seq, m in enumerate(msgs, start=1):  # ids 5-1 .. 5-12: "5-10" < "5-9" as strings
        client.xadd(stream, {b"data": m.value}, id=f"5-{seq}")
    s = drain(c, p, spark=spark)
    assert s.positions == {stream: "5-12"} and s.written == 12
    assert_exactly_once(spark, c, p, client, [m.key for m in msgs], 0)


def test_stream_ids_up_to_the_end_of_9999_drain_and_one_beyond_stops_the_run_naming_it(tmp_path, cfg, spark):
    """Explicit XADD ids may go to 2^64 - 1; deltadrain stores the milliseconds as a timestamp too.
    Up to its limit they drain; past it every run stops naming the entry, committing nothing (the
    second run reclaims it: min_idle_ms 0)."""
    from datetime import UTC

    from deltadrain.sources.valkey.claim import MAX_MS

    _, c, p = make_pipeline(tmp_path, partitions=1, min_idle_ms=0)
    client = valkey_client(c, p)
    stream = p.source.streams[0]
    msgs = list(generate(p, 3, seed=5))
    for seq, m in enumerate(msgs[:2], start=1):
        client.xadd(stream, {b"data": m.value}, id=f"{MAX_MS}-{seq}")
    s = drain(c, p, spark=spark)
    assert (s.outcome, s.written, s.positions) == ("committed", 2, {stream: f"{MAX_MS}-2"})
    rows = spark.read.format("delta").load(str(c.target_path(p))).select("_dd_pos_hi", "_dd_source_ts").collect()
    assert {(r._dd_pos_hi, r._dd_source_ts.astimezone(UTC).isoformat()) for r in rows} == {
        (MAX_MS, "9999-12-30T23:59:59.999000+00:00")}  # collected in the local time zone, whichever it is
    beyond = f"{MAX_MS + 1}-0"
    client.xadd(stream, {b"data": msgs[2].value}, id=beyond)
    for _ in range(2):
        with pytest.raises(Exception, match=re.escape(f"stream '{stream}': entry {beyond} has an id deltadrain "
                                                      "cannot store")):
            drain(c, p, spark=spark)
    assert read_checkpoint(spark, str(c.target_path(p)), p.name).positions == {stream: f"{MAX_MS}-2"}
    assert sorted(target_ids(spark, c, p)) == sorted(m.key for m in msgs[:2])
    assert pending(client, p) == 1  # still in the stream for whoever moves it


def test_times_before_1900_survive_the_staging(tmp_path, cfg, spark):
    """The claim tasks stage rows with pyarrow; Spark must read them back unchanged, times before the
    Gregorian switch and before 1900 (where Spark's calendar rebasing could shift them) included."""
    from datetime import UTC, datetime

    _, c, p = make_pipeline(tmp_path, partitions=1)
    client = valkey_client(c, p)
    msgs = list(generate(p, 3, seed=8))
    old = [json.loads(m.value) | {"event_time": t} for m, t in
           zip(msgs, ["1850-03-01T12:00:00Z", "1582-10-04T00:00:00Z", "2026-11-23T04:30:00.123456Z"], strict=True)]
    for payload in old:
        client.xadd(p.source.streams[0], {b"data": json.dumps(payload).encode()})
    s = drain(c, p, spark=spark)
    assert (s.outcome, s.written, s.dead_lettered) == ("committed", 3, 0)
    rows = {r.event_id: r for r in spark.read.format("delta").load(str(c.target_path(p))).collect()}
    for payload in old:
        row = rows[payload["event_id"]]
        assert row.event_time.astimezone(UTC) == datetime.fromisoformat(payload["event_time"])
        assert (row.amount, row.quantity, row.customer) == (payload["amount"], payload["quantity"], payload["customer"])


def test_reaper_takes_over_claims_of_a_dead_consumer(tmp_path, cfg, spark):
    _, c, p = make_pipeline(tmp_path, min_idle_ms=200)
    client = valkey_client(c, p)
    result = produce(c, p, 500, seed=9)
    for stream in p.source.streams:  # a consumer that claims and dies
        client.xgroup_create(stream, p.source.group, id="0", mkstream=True)
        client.xreadgroup(p.source.group, "crashed-drain", {stream: ">"}, count=50)
    assert pending(client, p) == 200
    # Status flags a claimant idle over min_idle_ms as stale: its entries are anyone's to take over.
    fresh = mark_stale(valkey_counts(client, p.source), source_of(p).stale_after_ms(p))["claimed_by"]["crashed-drain"]
    assert fresh["claimed"] == 200 and fresh["stale"] == (fresh["idle_ms"] > 200)
    time.sleep(0.3)
    st = pipeline_status(c, p)
    assert st["claimed_by"]["crashed-drain"]["stale"] and st["STALE_CLAIMED"] == 200 == st["CLAIMED"]
    report = reap(c, p, client)
    assert report["taken_over"] == 200
    assert sorted(report["consumers_removed"]) == sorted(f"{s}/crashed-drain" for s in p.source.streams)
    # A dead consumer's entries are read half at a time (its death convicts nothing), then the new ones.
    runs = [drain(c, p, spark=spark) for _ in range(3)]
    assert [(r.reclaimed, r.claimed, r.written) for r in runs] == [(100, 100, 100), (100, 100, 100), (0, 300, 300)]
    reap(c, p, client)
    assert all(REAPER not in str(x["name"]) for st in p.source.streams for x in client.xinfo_consumers(st, p.source.group))
    assert_exactly_once(spark, c, p, client, result.valid_ids, 0)


def test_a_transform_that_loses_ids_dead_letters_those_messages_instead_of_inserting_them_again(tmp_path, cfg, spark):
    # No MERGE key matches a null id: without the check each redelivery of such a row was inserted again.
    _, c, p = make_pipeline(tmp_path, partitions=2, max_retries=0,
                            transform="tests.integration.null_id_transform.lose_some_ids")
    client = valkey_client(c, p)
    # Two of 40 lose their id: each is isolated by splitting the batch (about 2*log2(n) small Spark jobs a
    # culprit), so two make the point and more only cost minutes.
    result = produce(c, p, 40, seed=141)
    lost = {json.loads(m.value)["event_id"] for m in generate(p, 40, seed=141)
            if json.loads(m.value)["customer"].endswith("7")}
    assert len(lost) == 2
    drain_until_done(c, p, spark, client)
    dead = dlq_rows(spark, c, p)
    assert {r.message_id for r in dead} == lost and all(r.error_type == "transform" for r in dead)
    assert all("left the message id ('event_id') null or blank at" in r.error for r in dead)
    assert_exactly_once(spark, c, p, client, sorted(set(result.valid_ids) - lost), len(lost))


def test_messages_the_transform_filters_out_are_counted_in_the_summary_commit_and_metrics(tmp_path, cfg, spark,
                                                                                           capsys, caplog):
    """A transform may drop rows. Those messages are acknowledged and land nowhere; the run counts them
    (`filtered`), so that claimed = written + duplicates + dead + left pending + filtered, and says so in
    its commit and its metrics row. A metrics table an older deltadrain made gains the column."""
    from datetime import UTC, datetime, timedelta

    from pyspark.sql.types import _parse_datatype_string

    from deltadrain.cli import main
    from deltadrain.heal.backfill import backfill
    from deltadrain.lake.checkpoint import find_commit
    from deltadrain.lake.metrics import METRICS_SCHEMA, last_runs, metrics_path

    path, c, p = make_pipeline(tmp_path, partitions=2, transform="tests.integration.filter_transform.drop_single_items")
    client = valkey_client(c, p)
    old = METRICS_SCHEMA.removesuffix(", filtered BIGINT")
    assert old != METRICS_SCHEMA
    row = (p.name, "older", 0, "empty", 0, 0, 0, 0, 0, 0, 0, 0, 0, 1.0, None, 0, "{}", None, datetime(2026, 1, 1))
    spark.createDataFrame([row], _parse_datatype_string(old)).write.format("delta").save(str(metrics_path(c)))

    result = produce(c, p, 600, seed=143, malformed_ratio=0.05)
    payloads = {}
    for m in generate(p, 600, seed=143, malformed_ratio=0.05):
        try:
            payloads[json.loads(m.value)["event_id"]] = json.loads(m.value)
        except (ValueError, KeyError, TypeError):
            continue
    single = {i for i in result.valid_ids if payloads[i]["quantity"] == 1}
    bad = result.bad_places(MALFORMED_KINDS)
    assert 0 < len(single) < len(result.valid_ids) and bad
    # A message the target holds comes again, and one it filtered: a duplicate, and filtered again.
    kept = next(i for i in sorted(result.valid_ids) if i not in single)
    caplog.set_level(logging.DEBUG, logger="deltadrain.lake.metrics")
    run = drain(c, p, spark=spark)
    # The old metrics table made delta-rs refuse the row; the Spark path added the column, once.
    assert "appending with Spark" in caplog.text
    caplog.clear()
    for eid in (kept, min(single)):
        client.xadd(p.source.streams[0], {b"data": json.dumps(payloads[eid]).encode()})
    again = drain(c, p, spark=spark)
    assert "appending with Spark" not in caplog.text

    assert (run.outcome, run.claimed, run.filtered, run.dead_lettered, run.written, run.acked) == (
        "committed", 600, len(single), len(bad), len(result.valid_ids) - len(single), 600), run
    assert (again.claimed, again.filtered, again.duplicates_skipped, again.written, again.acked) == (2, 1, 1, 0, 2)
    for r in (run, again):
        assert r.claimed == r.written + r.duplicates_skipped + r.dead_lettered + r.left_pending + r.filtered
    assert_exactly_once(spark, c, p, client, sorted(set(result.valid_ids) - single), bad)
    target = str(c.target_path(p))
    assert [find_commit(target, p.name, b)["meta"]["filtered"] for b in (1, 2)] == [len(single), 1]
    runs = last_runs(spark, c, p, 5)
    assert [(r["run_id"], r["filtered"]) for r in runs] == [(again.run_id, 1), (run.run_id, len(single)),
                                                             ("older", None)]
    assert runs[1]["rows_per_s"] == pytest.approx(600 / run.seconds, abs=0.01)  # filtered ones count as handled
    assert main(["--config", str(path), "metrics", p.name]) == 0
    assert f"filtered {len(single)}" in capsys.readouterr().out
    # A backfill over all of it counts the same messages filtered, and writes nothing.
    healed = backfill(c, p, spark, datetime.now(UTC) - timedelta(hours=1), datetime.now(UTC) + timedelta(minutes=1))
    assert (healed.read, healed.filtered, healed.skipped_dead_lettered, healed.written) == (
        602, len(single) + 1, len(bad), 0), healed
    assert healed.duplicates_skipped == len(result.valid_ids) - len(single) + 1
    assert_exactly_once(spark, c, p, client, sorted(set(result.valid_ids) - single), bad)


@pytest.mark.slow
def test_a_message_that_kills_every_run_is_isolated_by_splitting_and_dead_alone(tmp_path, cfg, spark):
    """A Valkey claim is a delivery, so runs killed by a message (stopped from inside the transform as
    a SIGKILL stops them, failpoints.ABANDON: the real SIGKILLs are the kill tests') leave their
    entries pending. Each run after a death reads
    half of what died (valkey.crashes), the other half waits with REST; a run that reads one entry
    alone counts it. The crasher is dead once runs that read it alone died max_retries times; every
    other entry is published, and the crasher was read by at most isolation.crash_loop_runs runs."""
    from deltadrain.run.isolation import crash_loop_runs
    from deltadrain.sources.valkey.crashes import ALONE, FIRST_HALF, REST, REST_OF_SPLIT
    from deltadrain.sources.valkey.drain import failures_key
    from tests.integration.crash_transform import CRASH_MARKER

    _, c, p = make_pipeline(tmp_path, partitions=1, batch_cap=8, max_retries=2, min_idle_ms=0,
                            transform="tests.integration.crash_transform.abandon_on_marker")
    client = valkey_client(c, p)
    messages = [m for m in generate(p, 30, seed=97) if m.kind == "valid"][:12]
    payloads = [m.value for m in messages]
    payloads[5] = json.dumps({**json.loads(payloads[5]), "status": CRASH_MARKER}).encode()
    stream, group = p.source.streams[0], p.source.group
    ids = [client.xadd(stream, {b"data": value}).decode() for value in payloads]
    runs = []
    while pending(client, p) or not runs or runs[-1] == "killed" or runs[-1]["outcome"] != "empty":
        assert len(runs) < 14, runs
        runs.append(run_or_killed(c, p, spark))
        if len(runs) == 4:
            # [4, 8) died read whole as a rest, and its first half [4, 6) died: [6, 8) waits with REST,
            # delivered twice; the reaper leaves REST alone. Status names both as under suspicion.
            pel = _pel(client, stream, group)
            assert {i: pel[i][:2] for i in ids[6:8]} == {i: (REST, 2) for i in ids[6:8]}
            assert {pel[i][1] for i in ids[4:6]} == {3}
            assert reap(c, p, client)["taken_over"] == 2
            splits = pipeline_status(c, p)["splits"]
            assert [(x["ids"], x["entries"], x["deliveries"], x["kind"], x["alone"]) for x in splits] == [
                ([ids[4], ids[5]], 2, 3, "suspect", 0), ([ids[6], ids[7]], 2, 2, "rest", 0)]
        if len(runs) == 7:  # the crasher died alone twice: status says so before it is a dead letter
            splits = pipeline_status(c, p)["splits"]
            assert (splits[0]["ids"], splits[0]["entries"], splits[0]["alone"]) == ([ids[5], ids[5]], 1, 2)
    # Killed with 8; their first half [0, 4) lands; the rest [4, 8), read whole, dies; its first half
    # [4, 6) dies; [4] alone lands; [5] alone dies twice (max_retries 2), then is a dead letter unread
    # by the transform; the REST [6, 8) lands; then the 4 new entries.
    assert [r if r == "killed" else (r["claimed"], r["dead_lettered"], r["written"]) for r in runs] == [
        "killed", (4, 0, 4), "killed", "killed", (1, 0, 1), "killed", "killed", (1, 1, 0), (2, 0, 2), (4, 0, 4),
        (0, 0, 0)], runs
    assert [{x["read"] for x in r["dead_runs"]} for r in runs if r != "killed"] == [
        {FIRST_HALF}, {ALONE}, {ALONE}, {REST_OF_SPLIT}, set(), set()]
    # Runs that read the crasher: 8, 4, 2, then alone twice and once more as a dead letter.
    assert runs.count("killed") + 1 == crash_loop_runs(p.batch_cap, p.max_retries)
    dead = {r.position: r for r in dlq_rows(spark, c, p)}
    assert list(dead) == [ids[5]] and dead[ids[5]].error_type == "max_retries"
    assert "every run that read this message alone died before committing: 2 runs" in dead[ids[5]].error
    assert bytes(dead[ids[5]].original) == payloads[5]
    assert sorted(target_ids(spark, c, p)) == sorted(m.key for i, m in enumerate(messages) if i != 5)
    assert pending(client, p) == 0
    assert pipeline_status(c, p)["splits"] == []
    assert valkey_admin().hlen(failures_key(p.name)) == 0  # the counts alone went with their entries


def test_a_split_across_streams_reads_the_first_half_in_stream_order_then_the_rest_whole_then_new_entries(
        tmp_path, cfg, spark):
    """Two runs died on 10 entries of each of 4 streams (40 pending, delivered twice: one segment).
    The next run reads the first 20 in (stream, id) order (the first two streams' entries) and hands
    the other 20 to REST across both remaining streams, delivery counts kept; the run after reads the
    REST 20 whole; then the new entries come. Every message lands once."""
    from deltadrain.sources.valkey.crashes import FIRST_HALF, REST, REST_OF_SPLIT

    _, c, p = make_pipeline(tmp_path, partitions=4, batch_cap=40, min_idle_ms=0)
    client = valkey_client(c, p)
    result = produce(c, p, 80, seed=107)
    group, streams = p.source.group, sorted(p.source.streams)
    held: dict[str, list[str]] = {}
    for stream in streams:  # a run claims 10 of each stream and dies; a second reclaims them and dies
        client.xgroup_create(stream, group, id="0", mkstream=True)
        held[stream] = [e[0].decode() for e in client.xreadgroup(group, "drain-dead-1", {stream: ">"}, count=10)[0][1]]
        client.xautoclaim(stream, group, "drain-dead-2", 0, start_id="0-0", count=10)
    assert {n for stream in streams for _, n, _ in _pel(client, stream, group).values()} == {2}

    first = drain(c, p, spark=spark)
    assert (first.outcome, first.claimed, first.reclaimed) == ("committed", 20, 20)
    assert {(x["partition"], x["entries"], x["deliveries"], x["read"]) for x in first.dead_runs} == {
        (stream, 10, 2, FIRST_HALF) for stream in streams}
    for stream in streams[:2]:  # read, committed, acknowledged
        assert _pel(client, stream, group) == {}
    for stream in streams[2:]:
        assert {i: v[:2] for i, v in _pel(client, stream, group).items()} == {i: (REST, 2) for i in held[stream]}

    second = drain(c, p, spark=spark)
    assert (second.outcome, second.claimed, second.reclaimed) == ("committed", 20, 20)
    assert {x["read"] for x in second.dead_runs} == {REST_OF_SPLIT}
    assert pending(client, p) == 0
    third = drain(c, p, spark=spark)  # nothing pending: an ordinary batch of the 40 new entries
    assert (third.outcome, third.claimed, third.reclaimed, third.dead_runs) == ("committed", 40, 0, [])
    assert drain(c, p, spark=spark).outcome == "empty"
    assert_exactly_once(spark, c, p, client, result.valid_ids, 0)


def test_a_table_created_after_the_first_batch_looked_is_merged_into(tmp_path, cfg, spark, monkeypatch):
    """The first batch found no table, but a backfill created one (with some of the same ids) before
    the batch's append: the append is refused and the batch MERGEs, so nothing is written twice."""
    from datetime import UTC, datetime, timedelta

    import deltadrain.run.commit
    from deltadrain.heal.backfill import backfill

    _, c, p = make_pipeline(tmp_path)
    client = valkey_client(c, p)
    began = datetime.now(UTC) - timedelta(seconds=1)
    early = produce(c, p, 120, seed=97)
    middle = datetime.now(UTC) + timedelta(milliseconds=50)
    while datetime.now(UTC) < middle + timedelta(milliseconds=50):
        time.sleep(0.01)
    late = produce(c, p, 80, seed=98, start=120)
    healed = backfill(c, p, spark, began, middle)
    assert healed.written == 120
    looked = []
    real_exists = deltadrain.run.commit.exists

    def stale_exists(path):  # what a check made just before the backfill's commit answers
        looked.append(path)
        return False if len(looked) == 1 else real_exists(path)

    monkeypatch.setattr(deltadrain.run.commit, "exists", stale_exists)
    s = drain(c, p, spark=spark)
    assert len(looked) == 2  # the append was refused, the retry MERGEd
    assert s.outcome == "committed" and s.written == 80 and s.duplicates_skipped == 120 and s.acked == 200
    assert_exactly_once(spark, c, p, client, early.valid_ids + late.valid_ids, 0)


@pytest.mark.slow
def test_a_stale_run_whose_claims_were_taken_over_neither_duplicates_nor_loses(tmp_path, cfg, spark,
                                                                               spark_connect_server):
    path, c, p = make_pipeline(tmp_path, min_idle_ms=500, batch_cap=5000)
    client = valkey_client(c, p)
    result = produce(c, p, 2000, seed=51)
    release = tmp_path / "release"
    stale = cli_drain(path, p.name, held_at("before_commit", release), remote=True)
    wait_held(stale, lambda: pending(client, p) >= 2000, 120, "the held run did not claim its batch")
    assert pending(client, p) == 2000
    time.sleep(0.6)
    assert reap(c, p, client)["taken_over"] == 2000  # the stale run's lease expired
    fresh = drain(c, p, spark=spark)  # the first half of what the stale run held, as a dead run's
    assert fresh.outcome == "committed" and fresh.reclaimed == 1000 and fresh.written == 1000
    release.touch()
    out, err = stale.communicate(timeout=600)
    assert stale.returncode == 0, err[-3000:]
    s = summary_of(out)
    assert s["outcome"] == "ahead" and s["acked"] == 0
    rest = drain(c, p, spark=spark)
    assert rest.outcome == "committed" and rest.reclaimed == 1000 and rest.written == 1000
    assert_exactly_once(spark, c, p, client, result.valid_ids, 0)


@pytest.mark.slow
def test_valkey_restart_between_claim_and_ack(tmp_path, cfg, spark, valkey_server, spark_connect_server):
    path, c, p = make_pipeline(tmp_path, min_idle_ms=0)
    client = valkey_client(c, p)
    result = produce(c, p, 2000, seed=61, malformed_ratio=0.05)
    release = tmp_path / "release"
    run = cli_drain(path, p.name, held_at("after_commit", release), remote=True)
    merge_commit = c.target_path(p) / "_delta_log" / f"{0:020d}.json"  # the first batch creates the table
    wait_held(run, merge_commit.exists, 240, "the held run did not commit its batch")
    assert read_checkpoint(spark, str(c.target_path(p)), p.name).batch == 1
    assert pending(client, p) == 2000  # committed, not yet acknowledged
    valkey_server.down()  # committed, not yet acknowledged
    valkey_server.up()
    assert pending(client, p) == 2000  # the PEL survived the restart (AOF)
    assert run.poll() is None, "the restart took longer than the pause"
    release.touch()
    out, err = run.communicate(timeout=600)
    assert run.returncode == 0, err[-3000:]
    s = summary_of(out)
    assert s["outcome"] == "committed" and s["acked"] == 2000
    assert pending(client, p) == 0
    drain_until_done(c, p, spark, client)
    assert_exactly_once(spark, c, p, client, result.valid_ids, result.bad_places(MALFORMED_KINDS))


@pytest.mark.slow
def test_the_spark_submit_entry_point_catches_up_in_full_batches_up_to_its_limit(tmp_path, cfg, spark):
    """What the Airflow ingest DAG submits: spark_jobs/drain.py under spark-submit with the cached jars.
    A backlog of five full batches: the first job drains three (max_batches_per_run), the second the
    other two and stops on the empty run after them; every batch is its own commit and metrics row. A
    failing job exits non-zero with the drain's own error."""
    import os
    import subprocess

    from deltadrain.lake.metrics import last_runs
    from deltadrain.paths import PROJECT_ROOT
    from deltadrain.runtime.session import spark_submit_command

    path, c, p = make_pipeline(tmp_path, batch_cap=200, airflow={"max_batches_per_run": 3})
    client = valkey_client(c, p)
    result = produce(c, p, 1000, seed=83, malformed_ratio=0.05)
    job = str(PROJECT_ROOT / "spark_jobs" / "drain.py")

    def submitted(run_id: str) -> dict:
        cmd = spark_submit_command(job, [p.name, "--config", str(path), "--run-id", run_id])
        assert not any("--packages" in part or "spark.jars.packages" in part for part in cmd)
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env={**os.environ})
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return summary_of(done.stdout)

    first = submitted("catchup-a")
    assert first["batches"] == [1, 2, 3] and first["claimed"] == 600 and first["acked"] == 600
    assert "max_batches_per_run (3)" in first["stopped"]
    assert [r["run_id"] for r in first["runs"]] == ["catchup-a", "catchup-a-2", "catchup-a-3"]
    second = submitted("catchup-b")
    assert second["batches"] == [4, 5] and second["claimed"] == 400 and second["outcome"] == "committed"
    assert second["batch"] == 5 and "ended empty" in second["stopped"]
    assert first["written"] + second["written"] == len(result.valid_ids)
    assert_exactly_once(spark, c, p, client, result.valid_ids, result.bad_places(MALFORMED_KINDS))
    runs = last_runs(spark, c, p, 10)
    assert sorted(r["batch"] for r in runs if r["outcome"] == "committed") == [1, 2, 3, 4, 5]
    assert len({r["run_id"] for r in runs}) == len(runs) == 6  # the empty run after batch 5 too
    # A failing run exits non-zero with the drain's own error on stderr, not only an exit code.
    bad = subprocess.run(spark_submit_command(job, ["nope", "--config", str(path)]),
                         capture_output=True, text=True, timeout=600)
    # spark-submit's PythonRunner merges the Python driver's stderr into its stdout.
    assert bad.returncode != 0 and "deltadrain: error: " in bad.stdout + bad.stderr
    assert "no pipeline named 'nope'" in bad.stdout + bad.stderr


class WriterDuringMerge:
    """Makes another writer commit to the table *while* the drain's MERGE runs, for the first
    `times` attempts of its commit: a real Delta conflict, at a moment no sleep can aim at.

    Each attempt of `commit_batch` starts at its `during_merge` failpoint, which arms a gate. A
    Python UDF put in the MERGE's source then holds its Spark task (in a Python worker) until a
    driver thread has run `commit()` on the same table, so that commit lands after the MERGE read
    the table and before the MERGE commits.

    `commit` must write through a session of its own (`spark.newSession()`): the drain's txn and
    commit metadata are session conf while it commits, and would be stamped on a commit made in its
    session, as if that commit were the batch."""

    def __init__(self, gate_dir, commit, times: int):
        self.gate, self.commit, self.times = gate_dir, commit, times
        self.gate.mkdir()
        self.attempts = 0
        self.done: list[int] = []
        self.errors: list[BaseException] = []

    def install(self, monkeypatch, id_field: str) -> None:
        import threading

        from pyspark.sql import functions as F

        import deltadrain.run.drain
        from deltadrain import failpoints

        gate = str(self.gate)

        def wait_for_writer(value):
            import os
            import time as t

            for name in sorted(os.listdir(gate)):
                if name.startswith("go-"):
                    n = name[3:]
                    try:  # one task per attempt takes the gate and waits for the other writer
                        os.close(os.open(os.path.join(gate, f"taken-{n}"), os.O_CREAT | os.O_EXCL))
                    except FileExistsError:
                        continue
                    deadline = t.time() + 120
                    while not os.path.exists(os.path.join(gate, f"done-{n}")) and t.time() < deadline:
                        t.sleep(0.05)
            return True

        gate_udf = F.udf(wait_for_writer, "boolean")
        real_commit, real_hit_later = deltadrain.run.drain.commit_batch, failpoints.hit_later

        def commit_batch(spark, path, **kwargs):
            kwargs["rows"] = kwargs["rows"].where(gate_udf(F.col(f"`{id_field}`")))
            return real_commit(spark, path, **kwargs)

        def writer(n: int) -> None:
            try:
                while not (self.gate / f"taken-{n}").exists():
                    time.sleep(0.05)
                self.commit()
                self.done.append(n)
            except BaseException as exc:  # reported by the test, not lost in a thread
                self.errors.append(exc)
            finally:
                (self.gate / f"done-{n}").touch()

        def hit_later(name: str) -> None:
            if name == "during_merge":
                self.attempts += 1
                if self.attempts <= self.times:
                    threading.Thread(target=writer, args=(self.attempts,), daemon=True).start()
                    (self.gate / f"go-{self.attempts}").touch()
            real_hit_later(name)

        monkeypatch.setattr(deltadrain.run.drain, "commit_batch", commit_batch)
        monkeypatch.setattr(failpoints, "hit_later", hit_later)


def test_a_commit_that_other_writers_keep_beating_is_a_conflict_that_acks_nothing(tmp_path, cfg, spark,
                                                                                   monkeypatch):
    """Writers that do not move the batch (here a table property change, as maintenance makes) win
    every retry: the run reports a conflict (not a restored table), commits and acknowledges nothing,
    and releases its claims; the next run commits the batch."""
    from deltadrain.run.commit import CONFLICT_RETRIES
    _, c, p = make_pipeline(tmp_path)
    client = valkey_client(c, p)
    first = produce(c, p, 50, seed=101)
    assert drain(c, p, spark=spark).outcome == "committed"
    second = produce(c, p, 200, seed=101, start=50)
    target = str(c.target_path(p))
    n = iter(range(1, 100))
    other = spark.newSession()
    writer = WriterDuringMerge(
        tmp_path / "gate", lambda: other.sql(f"ALTER TABLE delta.`{target}` SET TBLPROPERTIES "
                                             f"('deltadrain.test.maintenance' = '{next(n)}')"),
        times=CONFLICT_RETRIES + 1)
    with monkeypatch.context() as m:
        writer.install(m, p.payload_schema.id_field)
        with pytest.raises(DrainError, match="conflicted with it") as failed:
            drain(c, p, spark=spark)
    assert not writer.errors and writer.done == list(range(1, CONFLICT_RETRIES + 2))
    assert "restored" not in str(failed.value)
    assert read_checkpoint(spark, target, p.name).batch == 1
    assert sorted(target_ids(spark, c, p)) == sorted(first.valid_ids)  # nothing of the batch landed
    assert pending(client, p) == 200  # nothing acknowledged; released for the next run
    s = drain(c, p, spark=spark)
    assert (s.outcome, s.batch, s.written, s.acked) == ("committed", 2, 200, 200)
    assert_exactly_once(spark, c, p, client, first.valid_ids + second.valid_ids, 0)


def test_a_backfill_that_commits_during_the_drains_merge_is_retried_over_once_per_id(tmp_path, cfg, spark,
                                                                                      monkeypatch):
    """A backfill MERGEs part of the batch's messages while the live drain's MERGE runs: the drain's
    commit conflicts, it retries on the new table, and every id is in the target once."""
    from datetime import UTC, datetime, timedelta

    from deltadrain.heal.backfill import backfill

    _, c, p = make_pipeline(tmp_path)
    client = valkey_client(c, p)
    first = produce(c, p, 30, seed=103)
    assert drain(c, p, spark=spark).outcome == "committed"
    began = datetime.now(UTC) - timedelta(milliseconds=10)
    early = produce(c, p, 120, seed=103, start=30)
    middle = datetime.now(UTC) + timedelta(milliseconds=50)
    while datetime.now(UTC) < middle + timedelta(milliseconds=50):
        time.sleep(0.01)
    late = produce(c, p, 80, seed=103, start=150)
    healed = []
    other = spark.newSession()
    writer = WriterDuringMerge(tmp_path / "gate", lambda: healed.append(backfill(c, p, other, began, middle)),
                               times=1)
    with monkeypatch.context() as m:
        writer.install(m, p.payload_schema.id_field)
        s = drain(c, p, spark=spark)
    assert not writer.errors and writer.done == [1] and writer.attempts == 2  # one conflict, one retry
    assert healed[0].written == 120
    assert (s.outcome, s.batch, s.written, s.duplicates_skipped, s.acked) == ("committed", 2, 80, 120, 200), s.line()
    assert_exactly_once(spark, c, p, client, first.valid_ids + early.valid_ids + late.valid_ids, 0)


def test_an_optimize_that_commits_during_the_drains_merge_is_retried_over_once_per_id(tmp_path, cfg, spark,
                                                                                       monkeypatch):
    """Maintenance compacts the target (OPTIMIZE replaces the files the MERGE read) while the drain's
    MERGE runs: the drain's commit conflicts, it retries on the compacted table, the batch lands once
    and the checkpoint is the batch's."""
    from deltadrain.lake.maintain import maintain_table, snapshot_files

    _, c, p = make_pipeline(tmp_path, batch_cap=60)
    client = valkey_client(c, p)
    first = produce(c, p, 180, seed=107)
    for _ in range(3):
        assert drain(c, p, spark=spark).outcome == "committed"
    target = str(c.target_path(p))
    assert snapshot_files(spark, target) >= 3
    second = produce(c, p, 60, seed=107, start=180)
    compacted = []
    other = spark.newSession()
    writer = WriterDuringMerge(tmp_path / "gate",
                               lambda: compacted.append(maintain_table(other, "target", target, c.maintenance)),
                               times=1)
    with monkeypatch.context() as m:
        writer.install(m, p.payload_schema.id_field)
        s = drain(c, p, spark=spark)
    assert not writer.errors and writer.done == [1]
    assert compacted[0].compacted >= 3 and compacted[0].files_after == 1
    assert writer.attempts == 2  # the MERGE lost to the compaction once and was retried
    assert (s.outcome, s.batch, s.written, s.acked) == ("committed", 4, 60, 60), s.line()
    cp = read_checkpoint(spark, target, p.name)
    assert (cp.batch, cp.found_in) == (4, "commit")
    assert_exactly_once(spark, c, p, client, first.valid_ids + second.valid_ids, 0)


def _append(client, stream: str, msgs) -> list[str]:
    return [client.xadd(stream, {b"data": m.value}).decode() for m in msgs]


def _covers(gap: dict, ids: list[str]) -> bool:
    lo, hi = StreamId.parse(gap["from"]), StreamId.parse(gap["to"])
    return all(lo <= StreamId.parse(i) <= hi for i in ids)


def test_entries_trimmed_before_the_group_read_them_are_a_reported_gap(tmp_path, cfg, spark, caplog, capsys):
    """Under on_gap: fail (the default) a run stops at the gap and claims nothing; once the operator
    accepts the loss (on_gap: continue), the next commit carries the gap and goes on after it."""
    from deltadrain.cli import main
    from deltadrain.observe.probe import probe
    from deltadrain.sources.valkey.client import group_counts

    path, c, p = make_pipeline(tmp_path, partitions=2)
    client = valkey_client(c, p)
    trimmed_stream, other = p.source.streams
    msgs = list(generate(p, 110, seed=101))
    ids = _append(client, trimmed_stream, msgs[:100])
    _append(client, other, msgs[100:])
    assert valkey_admin().xtrim(trimmed_stream, maxlen=60, approximate=False) == 40
    gone, kept = ids[:40], ids[40:]
    st = pipeline_status(c, p)  # status shows it before any drain
    assert [(g["partition"], g["missing"]) for g in st["gaps"]] == [(trimmed_stream, 40)]
    assert main(["--config", str(path), "status", p.name]) == 0
    assert f"GAP: stream {trimmed_stream} ids 0-1 .. " in capsys.readouterr().out
    from deltadrain.orchestration.view.app import _templates
    from deltadrain.orchestration.view.data import pipeline_view

    # The Airflow view shows it too, open until a run has recorded it.
    assert [(g["partition"], g["kind"], g["missing"]) for g in pipeline_view(c, p)["open_gaps"]] == [
        (trimmed_stream, "unread", 40)]
    found = probe(c, p)  # the sensor wakes a run, whose failure shows in Airflow
    assert (found.new, found.gaps, found.has_work) == (70, 40, True)
    with pytest.raises(DrainError, match=rf"stream {re.escape(trimmed_stream)} ids 0-1 to \S+ \(40 entries, removed before the "
                       r"group read them\)\. Nothing was committed\. To go on past them.*Accept gaps.*"
                       rf"deltadrain --config {re.escape(str(path))} drain {p.name} --accept-gaps`\) or set on_gap: continue"):
        drain(c, p, spark=spark)
    assert not (c.target_path(p) / "_delta_log").exists()
    assert [group_counts(client, st, p.source.group) for st in (trimmed_stream, other)] == [(60, 0), (10, 0)]
    assert [(g["partition"], g["missing"]) for g in pipeline_status(c, p)["gaps"]] == [(trimmed_stream, 40)]
    c, p = set_source(path, on_gap="continue")  # the operator accepts the loss
    caplog.set_level("WARNING", logger="deltadrain.run")
    s = drain(c, p, spark=spark)
    assert (s.outcome, s.written, s.gaps) == ("committed", 70, 40)
    assert len(s.gap_ranges) == 1
    gap = s.gap_ranges[0]
    assert (gap["partition"], gap["kind"], gap["missing"]) == (trimmed_stream, "unread", 40)
    assert _covers(gap, gone) and not _covers(gap, kept[:1])  # up to the first entry left, not beyond
    assert any("step=gap" in r.getMessage() and trimmed_stream in r.getMessage() for r in caplog.records)
    cp = read_checkpoint(spark, str(c.target_path(p)), p.name)
    assert cp.batch == 1 and cp.meta["gaps"] == s.gap_ranges
    assert sorted(target_ids(spark, c, p)) == sorted(m.key for m in msgs[40:])
    # Reported once: the next batch, and status, find no gap any more.
    _append(client, other, generate(p, 5, seed=101, start=110))
    again = drain(c, p, spark=spark)
    assert (again.outcome, again.written, again.gaps, again.gap_ranges) == ("committed", 5, 0, [])
    assert "gaps" not in read_checkpoint(spark, str(c.target_path(p)), p.name).meta
    assert pipeline_status(c, p)["gaps"] == []
    # The Airflow view lists the gap with the batch whose commit recorded it (read with delta-rs).
    view = pipeline_view(c, p)
    assert view["open_gaps"] == []
    assert [(g["batch"], g["partition"], g["kind"], g["range"], g["missing"]) for g in view["gaps"]] == [
        (1, trimmed_stream, "unread", f"{gap['from']} to {gap['to']}", 40)]
    page = _templates().get_template("pipeline.html.j2").render(v=view, state="DEAD", replay_dag="r", triggered=[])
    assert f"{gap['from']} to {gap['to']}" in page and "none in the last" not in page


def test_entries_trimmed_while_a_claim_task_reads_are_a_gap_it_records(tmp_path, cfg, spark, monkeypatch):
    """The run checks for gaps before it claims; a producer trimming with MAXLEN while the claim tasks
    read (a drain that falls behind) removes entries past the group's position after that check. Each
    XREADGROUP runs in one transaction with the XINFO calls of the check and records what it reads past."""
    from deltadrain.sources.valkey import claim
    from deltadrain.sources.valkey.drain import claim_context, ensure_groups
    from deltadrain.sources.valkey.gaps import gaps_key, recorded

    path, c, p = make_pipeline(tmp_path, partitions=1, source={"on_gap": "continue"})
    client = valkey_client(c, p)
    (stream,) = p.source.streams
    ensure_groups(client, p.source)
    msgs = list(generate(p, 30, seed=131))
    ids = _append(client, stream, msgs)
    monkeypatch.setattr(claim, "READ_CHUNK", 10)
    task = claim.run_claim(claim.ClaimTask(stream, quota=30, reclaim=False), claim_context(c, p, "task-1"))
    assert next(task).positions == ids[:10]
    assert valkey_admin().xtrim(stream, maxlen=10, approximate=False) == 20  # ids 10..19 go before any read
    assert [pos for chunk in task for pos in chunk.positions] == ids[20:]
    (gap,) = [json.loads(v) for v in recorded(client, gaps_key(p.name)).values()]
    assert (gap["partition"], gap["kind"], gap["missing"]) == (stream, "unread", 10)
    assert _covers(gap, ids[10:20]) and not _covers(gap, ids[9:10] + ids[20:21])
    # The next commit carries it, and the 10 entries task-1 held that the trim took as well (they
    # died with its run: deleted while pending).
    s = drain(c, p, spark=spark)
    assert (s.outcome, s.gaps) == ("committed", 20)
    by_kind = {g["kind"]: g for g in s.gap_ranges}
    assert by_kind["unread"]["from"] == gap["from"] and by_kind["unread"]["missing"] == 10
    assert by_kind["pending"]["ids"] == ids[:10]
    assert recorded(client, gaps_key(p.name)) == {}


def test_a_gap_with_nothing_readable_after_it_is_committed_past_once_under_continue(tmp_path, cfg, spark):
    """A stream trimmed to empty, and one whose undelivered tail was XDELed: XREADGROUP has nothing to
    deliver, so nothing would move the group past either gap. Under on_gap: continue the run moves it
    to the stream's end and commits the gaps in a batch without rows; later runs neither report them
    again nor see work, and the group's lag stays exact for what comes next."""
    from deltadrain.observe.probe import probe
    from deltadrain.orchestration.view.data import pipeline_view
    from deltadrain.sources.valkey.client import group_counts

    _, c, p = make_pipeline(tmp_path, partitions=2, source={"on_gap": "continue"})
    client = valkey_client(c, p)
    trimmed, deleted = p.source.streams
    msgs = list(generate(p, 70, seed=107))
    _append(client, trimmed, msgs[:20])
    _append(client, deleted, msgs[20:40])
    assert drain(c, p, spark=spark).written == 40
    _append(client, trimmed, msgs[40:60])
    tail = _append(client, deleted, msgs[60:63])
    assert valkey_admin().xtrim(trimmed, maxlen=0, approximate=False) == 40
    assert valkey_admin().xdel(deleted, *tail) == 3
    found = probe(c, p)
    assert (found.new, found.gaps, found.has_work) == (0, 21, True)  # 20, and 1 for the XDEL range of unknown size
    s = drain(c, p, spark=spark)
    assert (s.outcome, s.batch, s.claimed, s.written, s.acked, s.gaps) == ("committed", 2, 0, 0, 0, 21), s.line()
    got = {g["partition"]: g for g in s.gap_ranges}
    assert (got[trimmed]["missing"], got[deleted]["missing"], got[deleted]["to"]) == (20, None, tail[-1])
    cp = read_checkpoint(spark, str(c.target_path(p)), p.name)
    assert cp.batch == 2 and cp.meta["gaps"] == s.gap_ranges and cp.positions == s.positions
    assert [group_counts(client, st, p.source.group) for st in p.source.streams] == [(0, 0), (0, 0)]
    assert not probe(c, p).has_work
    again = drain(c, p, spark=spark)
    assert (again.outcome, again.gaps) == ("empty", 0), again.line()
    assert pipeline_status(c, p)["gaps"] == []
    view = pipeline_view(c, p)
    assert view["open_gaps"] == [] and {g["batch"] for g in view["gaps"]} == {2}
    _append(client, trimmed, msgs[63:70])
    assert probe(c, p).new == 7
    more = drain(c, p, spark=spark)
    assert (more.outcome, more.written, more.gaps) == ("committed", 7, 0), more.line()
    assert sorted(target_ids(spark, c, p)) == sorted(m.key for m in msgs[:40] + msgs[63:70])


def _read_by_a_crashed_drain(tmp_path, produced: int, seed: int, deleted: int, on_gap: str = "continue"):
    """One stream of `produced` entries; a drain read the first 10 and died, then entry `deleted`
    was deleted from the stream while pending. Returns (path, cfg, pipeline, client, messages, ids)."""
    path, c, p = make_pipeline(tmp_path, partitions=1, min_idle_ms=100, source={"on_gap": on_gap})
    client = valkey_client(c, p)
    stream = p.source.streams[0]
    msgs = list(generate(p, produced, seed=seed))
    ids = _append(client, stream, msgs)
    client.xgroup_create(stream, p.source.group, id="0")
    client.xreadgroup(p.source.group, "crashed-drain", {stream: ">"}, count=10)
    assert valkey_admin().xdel(stream, ids[deleted]) == 1
    time.sleep(0.2)  # past min_idle_ms
    return path, c, p, client, msgs, ids


def test_an_entry_deleted_while_pending_is_reported_with_its_id(tmp_path, cfg, spark, capsys):
    from deltadrain.cli import main
    from deltadrain.sources.valkey.crashes import RELEASED, REST

    path, c, p, client, msgs, ids = _read_by_a_crashed_drain(tmp_path, 20, seed=102, deleted=4, on_gap="fail")
    stream = p.source.streams[0]
    # Under on_gap: fail the run that finds it (its XAUTOCLAIM drops it from the pending list) stops,
    # commits nothing and releases all it claimed: the first half of what the dead run held (split),
    # the other half waiting with REST; the next run stops before claiming anything.
    for _ in range(2):
        with pytest.raises(DrainError, match=rf"ids {ids[4]} to {ids[4]} \(1 entry, deleted while pending\)"):
            drain(c, p, spark=spark)
        assert not (c.target_path(p) / "_delta_log").exists()
        pel = _pel(client, stream, p.source.group)
        assert sorted(pel) == sorted(ids[:4] + ids[5:10])
        assert {pel[i][0] for i in ids[:4]} == {RELEASED} and {pel[i][0] for i in ids[5:10]} == {REST}
    # The operator accepts the loss for one run (the config keeps on_gap: fail). It reads the rest of
    # the split and its commit carries the gap.
    capsys.readouterr()
    assert main(["--config", str(path), "drain", p.name, "--accept-gaps", "--local"]) == 0
    s = summary_of(capsys.readouterr().out)
    assert (s["outcome"], s["reclaimed"], s["written"], s["acked"], s["gaps"]) == ("committed", 5, 5, 5, 1)
    assert [(g["partition"], g["kind"], g["from"], g["to"], g["missing"], g["ids"]) for g in s["gap_ranges"]] == [
        (stream, "pending", ids[4], ids[4], 1, [ids[4]])]
    assert read_checkpoint(spark, str(c.target_path(p)), p.name).meta["gaps"] == s["gap_ranges"]
    # Then what the failed runs handed back rides along with the new entries; the gap is not met again.
    rest = drain(c, p, spark=spark)
    assert (rest.outcome, rest.reclaimed, rest.written, rest.gap_ranges) == ("committed", 4, 14, [])
    assert sorted(target_ids(spark, c, p)) == sorted(m.key for i, m in enumerate(msgs) if i != 4)
    assert pending(client, p) == 0
    assert drain(c, p, spark=spark).gap_ranges == []  # carried by one commit, then forgotten


def test_an_accepted_xdel_gap_beyond_the_batch_stops_no_later_run_and_a_new_one_still_does(tmp_path, cfg, spark):
    """An entry XDELed ahead of the group is a gap up to its id, found from the group's position, so
    every run until the group reads past it finds it again. Once one run accepted it (its commit
    carries it), the runs under on_gap: fail after it, which read only a batch each, do not stop on it
    again; an XDEL further ahead is a new gap and stops them."""
    from deltadrain.observe.probe import probe

    _, c, p = make_pipeline(tmp_path, partitions=1, batch_cap=30)
    client = valkey_client(c, p)
    stream = p.source.streams[0]
    msgs = list(generate(p, 100, seed=109))
    ids = _append(client, stream, msgs)
    assert valkey_admin().xdel(stream, ids[80]) == 1
    with pytest.raises(DrainError, match=rf"ids 0-1 to {ids[80]} \(1 entry, removed before the group read them\)"):
        drain(c, p, spark=spark)
    accepted = drain(c, p.accepting_gaps(), spark=spark)  # one batch of 30: the group stops at ids[29]
    assert (accepted.outcome, accepted.written, accepted.gaps) == ("committed", 30, 1), accepted.line()
    assert probe(c, p).gaps == 0 and pipeline_status(c, p)["gaps"] == []
    s = drain(c, p, spark=spark)  # on_gap: fail again
    assert (s.outcome, s.written, s.gaps, s.gap_ranges) == ("committed", 30, 0, []), s.line()
    # A new XDEL beyond the accepted one is a new gap: it stops the runs until accepted in its turn.
    assert valkey_admin().xdel(stream, ids[90]) == 1
    assert probe(c, p).gaps == 1
    with pytest.raises(DrainError, match=rf"ids {StreamId.parse(ids[59]).ms}-\d+ to {ids[90]} \(an unknown number"):
        drain(c, p, spark=spark)
    again = drain(c, p.accepting_gaps(), spark=spark)
    assert (again.outcome, again.written, again.gaps) == ("committed", 30, 1), again.line()
    runs = drain_until_done(c, p, spark, client)
    assert all(r.gaps == 0 for r in runs) and sum(r.written for r in runs) == 8
    assert_exactly_once(spark, c, p, client, [m.key for i, m in enumerate(msgs) if i not in (80, 90)], 0)


def test_deleting_or_trimming_acknowledged_entries_is_no_gap(tmp_path, cfg, spark):
    _, c, p = make_pipeline(tmp_path, partitions=1)
    client = valkey_client(c, p)
    stream = p.source.streams[0]
    ids = _append(client, stream, generate(p, 30, seed=103))
    assert drain(c, p, spark=spark).acked == 30
    # The first, a middle and the last delivered entry (max-deleted-entry-id = last-delivered-id).
    assert valkey_admin().xdel(stream, ids[0], ids[10], ids[29]) == 3
    quiet = drain(c, p, spark=spark)
    assert (quiet.outcome, quiet.gaps, quiet.gap_ranges) == ("empty", 0, [])
    _append(client, stream, generate(p, 10, seed=103, start=30))
    more = drain(c, p, spark=spark)
    assert (more.outcome, more.written, more.gaps, more.gap_ranges) == ("committed", 10, 0, [])
    assert "gaps" not in read_checkpoint(spark, str(c.target_path(p)), p.name).meta
    valkey_admin().xtrim(stream, maxlen=0, approximate=False)  # everything was read and acknowledged
    _append(client, stream, generate(p, 3, seed=103, start=40))
    last = drain(c, p, spark=spark)
    assert (last.outcome, last.written, last.gaps, last.gap_ranges) == ("committed", 3, 0, [])
    assert pipeline_status(c, p)["gaps"] == []
    assert len(target_ids(spark, c, p)) == 43


@pytest.mark.slow
def test_a_gap_found_by_a_run_that_dies_is_carried_by_the_next_commit(tmp_path, cfg, spark, spark_connect_server):
    """The killed run's XAUTOCLAIM dropped the deleted pending entries it met from the pending list: only
    its gap records can still tell of them."""
    path, c, p = make_pipeline(tmp_path, partitions=1, min_idle_ms=0, source={"on_gap": "continue"})
    client = valkey_client(c, p)
    stream = p.source.streams[0]
    msgs = list(generate(p, 50, seed=104))
    ids = _append(client, stream, msgs)
    client.xgroup_create(stream, p.source.group, id="0")
    client.xreadgroup(p.source.group, "crashed-drain", {stream: ">"}, count=5)
    # Trimmed: 0-4 while pending, 5-19 before the group read them.
    assert valkey_admin().xtrim(stream, minid=ids[20], approximate=False) == 20
    proc = cli_drain(path, p.name, {"DELTADRAIN_FAILPOINT": "after_claim"}, remote=True)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == -9 and fired("after_claim") in err, err[-3000:]
    # The next run reads part of what the dead runs held (split: their entries are pending, deleted
    # or not), and its commit carries the deleted pending entries the killed run met.
    first = drain(c, p, spark=spark)
    assert first.outcome == "committed"
    found = [i for g in first.gap_ranges if g["kind"] == "pending" for i in g["ids"]]
    assert ids[:2] == found[:2]
    assert read_checkpoint(spark, str(c.target_path(p)), p.name).meta["gaps"] == first.gap_ranges
    runs = [first]
    while runs[-1].outcome != "empty":
        assert len(runs) < 8, [r.line() for r in runs]
        runs.append(drain(c, p, spark=spark))
    # Every gap once: the 5 deleted while pending, and the 15 trimmed before the group read them,
    # found by the first run that read new entries.
    reported = [i for r in runs for g in r.gap_ranges if g["kind"] == "pending" for i in g["ids"]]
    assert sorted(reported, key=StreamId.parse) == ids[:5] and sum(r.gaps for r in runs) == 20
    (unread,) = [g for r in runs for g in r.gap_ranges if g["kind"] == "unread"]
    assert unread["missing"] == 15 and _covers(unread, ids[5:20]) and not _covers(unread, ids[20:21])
    assert sum(r.written for r in runs) == 30
    assert sorted(target_ids(spark, c, p)) == sorted(m.key for m in msgs[20:])


def _pel(client, stream: str, group: str) -> dict[str, tuple[str, int, int]]:
    """id -> (owner, delivery count, idle ms) of every pending entry."""
    return {r["message_id"].decode(): (r["consumer"].decode(), r["times_delivered"], r["time_since_delivered"])
            for r in client.xpending_range(stream, group, min="-", max="+", count=1000)}


def test_a_release_moves_only_the_entries_its_run_still_holds(tmp_path, cfg, spark):
    """A run that lost the race releases its claims; the reaper had meanwhile handed some of them to
    another live run B, which must keep them (owner and delivery count unchanged, not made idle)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from deltadrain.sources.valkey.acknowledge import release
    from deltadrain.sources.valkey.crashes import RELEASED
    from deltadrain.sources.valkey.drain import claim_context

    _, c, p = make_pipeline(tmp_path, partitions=1, min_idle_ms=60_000)
    client = valkey_client(c, p)
    stream, group = p.source.streams[0], p.source.group
    ids = _append(client, stream, generate(p, 12, seed=105))
    client.xgroup_create(stream, group, id="0")
    client.xreadgroup(group, "drain-a", {stream: ">"}, count=10)  # run A claims 0..9
    client.xclaim(stream, group, "drain-b", 0, ids[:4])  # the reaper's hand-over: B's now (delivered twice)
    valkey_admin().xdel(stream, ids[7])  # deleted while A holds it
    before = _pel(client, stream, group)
    staged = tmp_path / "claimed.parquet"
    pq.write_table(pa.table({"_dd_partition": [stream] * 10, "_dd_position": ids[:10],
                             "_dd_attempts": pa.array([1] * 10, pa.int32())}), staged)
    released = release([str(staged)], claim_context(c, p, "drain-a"))
    after = _pel(client, stream, group)
    assert released == 5  # 4, 5, 6, 8, 9
    for i in ids[:4]:  # B's: untouched
        assert after[i][:2] == before[i][:2] == ("drain-b", 2) and after[i][2] < 60_000
    for i in ids[4:7] + ids[8:10]:  # A's own: released, idle long enough to be reclaimed, no delivery counted
        assert after[i][:2] == (RELEASED, 1) and after[i][2] >= 60_000
    assert after[ids[7]][0] == "drain-a"  # deleted: left pending for XAUTOCLAIM to report as a gap
    assert set(after) == set(before)
    # The next claim takes A's released entries only (and reports the deleted one), never B's.
    _, taken, deleted = client.xautoclaim(stream, group, "drain-c", 60_000, start_id="0-0", count=100)
    assert sorted(entry_id.decode() for entry_id, _ in taken) == sorted(ids[4:7] + ids[8:10])
    assert [i.decode() for i in deleted] == [ids[7]]


def test_the_reaper_leaves_a_deleted_pending_entry_for_the_drain_to_report(tmp_path, cfg, spark):
    _, c, p, client, _, ids = _read_by_a_crashed_drain(tmp_path, 10, seed=106, deleted=6)
    report = reap(c, p, client)
    assert report["taken_over"] == 9 and report["consumers_removed"] == []  # it still holds the deleted one
    # The dead run's 10 are read half at a time: the first 5, then the rest, where the deleted one (never
    # handed to REST: only what the stream still has moves) is met and reported once.
    runs = [drain(c, p, spark=spark)]
    assert (runs[0].written, runs[0].gap_ranges) == (5, [])
    while runs[-1].outcome != "empty":
        assert len(runs) < 8, [r.line() for r in runs]
        runs.append(drain(c, p, spark=spark))
    assert sum(r.written for r in runs) == 9
    assert [g["ids"] for r in runs for g in r.gap_ranges] == [[ids[6]]]
    assert pending(client, p) == 0
