"""The contract every source keeps (docs/contract.md), tested once and run against each kind: exactly-once
effect, bad input as dead letters, the checkpoint in the table's own commit, poison isolation, SIGKILLs at
each step boundary and at random moments, a neighbour that commits first, backfill and replay. Against
real servers, Spark and Delta, judged by reading the tables back.

Each test runs once per kind in tests/support/harness.py's HARNESSES, through that kind's harness (the
`h` fixture): a new source gets the whole suite by adding its harness. What only one kind has (Valkey's
leases, reaper and stream ids; Kafka's offsets, retention, claim notices and transactions) is tested in
test_valkey_drain.py and test_kafka_drain.py.

Drains run in the test's process on the session's Spark, unless a process's death is the point: a
CLI drain is then killed, a client of the session's Spark Connect server where only the run's process
must die, a local driver (a JVM of its own) where the kill must stop a MERGE inside it."""

from __future__ import annotations

import json
import os
import random
import time
from datetime import UTC, datetime, timedelta

import pytest

from deltadrain.dev.produce import MALFORMED_KINDS, generate
from deltadrain.heal.backfill import BackfillError, backfill
from deltadrain.heal.replay import ReplayRequest, replay
from tests.support.harness import DEAD_LETTER_TYPES, HARNESSES, Expected, Harness
from tests.support.pipelines import BOTH_TRANSFORMS, HANDLER, IDENTITY
from tests.support.processes import held_at, summary_of, wait_held


@pytest.fixture(params=list(HARNESSES))
def kind(request) -> str:
    return request.param


@pytest.fixture
def h(kind, request, tmp_path, spark) -> Harness:
    """The kind's harness, its server up; the test makes its pipeline with `h.pipeline(...)`."""
    harness = HARNESSES[kind]
    request.getfixturevalue(harness.server)
    return harness(tmp_path, spark)


def connect_client(request) -> bool:
    """The session's Spark Connect server is up: CLI drains may run as its clients (`remote=True`)."""
    request.getfixturevalue("spark_connect_server")
    return True


# -- exactly once, and bad input as data ---------------------------------------------------------------

@BOTH_TRANSFORMS
def test_valid_messages_published_once_bad_ones_dead_lettered_with_reasons(h, transform, spark, monkeypatch,
                                                                          capsys):
    """3 000 messages, a tenth of them malformed in every way `produce` knows: the first run publishes the
    valid ones and dead-letters the rest with their reasons, in the commit that creates the table and
    holds its checkpoint; status and `dlq list` show it; a later batch MERGEs into that table."""
    from delta.tables import DeltaTable

    from deltadrain.cli import main
    from deltadrain.lake.delta import snapshot_txn

    # Both places a batch is read: by Spark tasks with the handler, in the drain's own process (a small
    # batch) with the identity.
    if transform == HANDLER:
        h.read_in_spark_tasks(monkeypatch)
    h.pipeline(transform=transform)
    result = h.produce(3000, seed=21, malformed_ratio=0.1)
    expected = h.expect(result)
    first, *_ = h.drain_until_done()
    assert (first.outcome, first.batch, first.claimed, first.acked) == ("committed", 1, 3000, 3000)
    assert (first.written, first.dead_lettered) == (len(expected.ids), len(expected.dead))
    assert first.positions == h.end_positions()
    h.assert_exactly_once(expected)
    # The first batch created the table in the commit that holds its rows and its checkpoint.
    target = str(h.c.target_path(h.p))
    assert [(x.version, x.operation) for x in DeltaTable.forPath(spark, target).history().collect()] == [(0, "WRITE")]
    assert snapshot_txn(target, h.p.name) == (1, 0)
    cp = h.checkpoint()
    assert (cp.batch, cp.positions, cp.found_in) == (1, first.positions, "commit")
    # Each dead letter has the type its kind of malformed message gets, a reason and its bytes.
    dead = h.dlq_rows()
    assert {(r.partition, r.position): r.error_type for r in dead} == {
        place: DEAD_LETTER_TYPES[result.places[place]] for place in expected.dead}
    reasons = {r.error_type: r.error for r in dead}
    assert "exceeds max_message_bytes" in reasons["oversized"] and "should be double" in reasons["schema"]
    # Valid UTF-8 and JSON to a lenient parser, yet no column can hold them: dead letters, not a failed run.
    assert result.kinds["lone_surrogate"] == sum("lone UTF-16 surrogate" in r.error for r in dead) > 0
    assert result.kinds["too_deep"] == sum("nested deeper" in r.error for r in dead) > 0
    assert all(r.state == "DEAD" and r.attempts == 1 and r.pipeline == h.p.name for r in dead)
    assert all(r.original is not None for r in dead if r.error_type != "empty")
    # Draining again finds nothing and changes nothing.
    again = h.drain()
    assert (again.outcome, again.batch) == ("empty", 1)
    h.assert_exactly_once(expected)

    # Status and the DLQ listing, through the CLI, with 100 new messages waiting.
    more = h.produce(100, seed=21, start=3000)
    cli = ["--config", str(h.path)]
    assert main([*cli, "status", h.p.name, "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert (st["PENDING"], st["CLAIMED"], st["PUBLISHED"], st["DEAD"]) == (100, 0, len(expected.ids), len(expected.dead))
    assert st["checkpoint"]["batch"] == 1 and st["last_batch"]["written"] == len(expected.ids)
    assert st["last_batch"]["dead_lettered"] == len(expected.dead)
    assert {part: info["pending"] for part, info in st["partitions"].items() if info["pending"]} == {
        str(part): n for part, n in more.per_partition.items()}
    h.check_status_partitions(st)
    assert main([*cli, "status", h.p.name]) == 0
    text = capsys.readouterr().out
    assert f"PUBLISHED {len(expected.ids):>10}" in text and f"DEAD      {len(expected.dead):>10}" in text
    assert main([*cli, "dlq", "list", h.p.name, "--json", "--limit", "1000"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == len(expected.dead) and all(r["state"] == "DEAD" and r["error"] for r in rows)
    assert main([*cli, "dlq", "list", h.p.name, "--json", "--error", "not valid UTF-8"]) == 0
    utf8 = json.loads(capsys.readouterr().out)
    assert len(utf8) == result.kinds["invalid_utf8"] and {r["error_type"] for r in utf8} == {"invalid_utf8"}
    assert main([*cli, "dlq", "list", h.p.name, "--json", "--since", "2999-01-01T00:00:00"]) == 0
    assert json.loads(capsys.readouterr().out) == []
    assert main([*cli, "dlq", "list", h.p.name, "--since", "yesterday"]) == 1
    assert "ISO-8601" in capsys.readouterr().err
    # Later batches MERGE into the table the first one created.
    later = h.drain()
    assert (later.outcome, later.batch, later.written) == ("committed", 2, 100)
    h.assert_exactly_once(expected + h.expect(more))


@BOTH_TRANSFORMS
def test_same_id_twice_in_a_batch_and_across_batches_is_written_once(h, transform):
    h.pipeline(partitions=2, transform=transform)
    msgs = list(generate(h.p, 5, seed=3))
    h.send([m.value for m in msgs], partition=0)
    h.send([msgs[0].value], partition=1)  # the same id in another partition, in the same batch
    first = h.drain()
    assert (first.written, first.duplicates_skipped, first.acked) == (5, 1, 6), first.line()
    h.send([msgs[1].value], partition=0)  # and again in a later batch
    second = h.drain()
    assert (second.batch, second.written, second.duplicates_skipped, second.acked) == (2, 0, 1, 1), second.line()
    h.assert_exactly_once(Expected(frozenset(m.key for m in msgs), frozenset()))


def test_a_commit_whose_reply_is_lost_is_already_committed_and_acknowledged(h, monkeypatch):
    h.pipeline()
    result = h.produce(300, seed=91, malformed_ratio=0.1)
    monkeypatch.setenv("DELTADRAIN_FAILPOINT", "after_merge")  # the MERGE lands, then the call raises
    s = h.drain()
    monkeypatch.delenv("DELTADRAIN_FAILPOINT")
    expected = h.expect(result)
    assert (s.outcome, s.batch, s.acked, s.written) == ("already_committed", 1, 300, len(expected.ids)), s.line()
    h.assert_exactly_once(expected)


def test_a_first_batch_of_only_bad_messages_creates_the_table_with_its_checkpoint(h):
    h.pipeline()
    result = h.produce(40, seed=96, malformed_ratio=1.0)
    assert not result.valid_ids
    expected = h.expect(result)
    s = h.drain()
    assert (s.outcome, s.written, s.dead_lettered, s.acked) == ("committed", len(expected.ids), len(expected.dead), 40)
    assert s.positions == h.end_positions()
    checkpoint = h.checkpoint()
    assert (checkpoint.batch, checkpoint.positions) == (1, s.positions)
    h.assert_exactly_once(expected)


def test_batch_cap_bounds_a_run_and_status_shows_the_lifecycle(h):
    h.pipeline(batch_cap=400)
    result = h.produce(1000, seed=8, malformed_ratio=0.05)
    expected = h.expect(result)
    s = h.drain()
    assert s.claimed == 400
    st = h.status()
    assert (st["PENDING"], st["CLAIMED"], st["PUBLISHED"] + st["DEAD"]) == (600, 0, 400)
    assert st["checkpoint"]["batch"] == 1 and (st["last_batch"]["batch"], st["last_batch"]["claimed"]) == (1, 400)
    assert [x.claimed for x in h.drain_until_done()] == [400, 200]
    h.assert_exactly_once(expected)
    st = h.status()
    assert (st["PENDING"], st["CLAIMED"], st["PUBLISHED"], st["DEAD"]) == (0, 0, len(expected.ids), len(expected.dead))


def test_checkpoint_survives_delta_log_checkpoint_and_cleanup(h, spark):
    from tests.support.lake import clean_up_delta_log

    h.pipeline(partitions=2, batch_cap=100)
    result = h.produce(300, seed=13, malformed_ratio=0.1)
    for _ in range(3):
        h.drain()
    before = h.checkpoint()
    assert (before.batch, before.found_in) == (3, "commit")
    clean_up_delta_log(spark, str(h.c.target_path(h.p)), before.table_version)
    after = h.checkpoint()
    assert (after.batch, after.found_in) == (3, "rows")
    assert h.resumes_at(after.positions) == before.positions
    more = h.produce(50, seed=13, start=300)  # the pipeline goes on from the recovered checkpoint
    s = h.drain()
    assert (s.outcome, s.batch, s.claimed, s.written) == ("committed", 4, 50, len(h.expect(more).ids))
    h.assert_exactly_once(h.expect(result, more))


@BOTH_TRANSFORMS
def test_rows_the_target_refuses_are_dead_letters_naming_the_constraint_and_come_back_by_replay(h, transform, spark):
    """CHECK and NOT NULL constraints the operator put on the target refuse four messages' rows. The
    run dead-letters exactly those, naming the constraint each broke, and commits the rest: before,
    the batch failed until runs split it, and neighbours used up their retries with the refused rows.
    With the constraints gone, a DLQ replay brings the four back."""
    from delta.tables import DeltaTable
    from pyspark.sql.types import StructField, StructType

    from deltadrain.run.rows import claim_schema, target_rows, transformed

    h.pipeline(partitions=2, transform=transform)
    # The operator created the target before the first run, with quantity NOT NULL (Delta adds that
    # constraint only at creation), and adds CHECK constraints later.
    target = h.c.target_path(h.p)
    schema = transformed(target_rows(spark.createDataFrame([], claim_schema(h.p)), h.p, 0, "setup"), h.p).schema
    (DeltaTable.create(spark).location(str(target))
     .addColumns(StructType([StructField(f.name, f.dataType, f.name != "quantity") for f in schema.fields])).execute())
    first = h.produce(10, seed=62)
    assert h.drain().written == 10
    refused = [f"evt-62-{i:09d}" for i in (17, 33)]
    spark.sql(f"ALTER TABLE delta.`{target}` ADD CONSTRAINT not_these CHECK (event_id NOT IN ('{refused[0]}', "
              f"'{refused[1]}'))")
    spark.sql(f"ALTER TABLE delta.`{target}` ADD CONSTRAINT no_total_40 CHECK (event_id <> 'evt-62-000000040')")
    refused.append("evt-62-000000040")
    more = h.produce(40, seed=62, start=10)
    # Valid to the pipeline's schema (quantity is optional), not to the table's NOT NULL.
    without = {**json.loads(next(generate(h.p, 1, seed=62, start=50)).value), "quantity": None}
    h.send([json.dumps(without).encode()], partition=0)
    refused.append(without["event_id"])
    # A redelivered id the target holds, now without quantity: matched, not inserted, so never refused.
    again = {**json.loads(next(generate(h.p, 1, seed=62, start=0)).value), "quantity": None}
    h.send([json.dumps(again).encode()], partition=1)
    run = h.drain()
    assert (run.outcome, run.claimed, run.written, run.dead_lettered, run.duplicates_skipped, run.acked) == (
        "committed", 42, 37, 4, 1, 42), run.line()
    kept = frozenset(i for i in [*first.valid_ids, *more.valid_ids] if i not in refused)
    dead = {json.loads(bytes(r.original))["event_id"]: r for r in h.dlq_rows()}
    assert sorted(dead) == sorted(refused)
    h.assert_exactly_once(Expected(kept, frozenset((r.partition, r.position) for r in dead.values())))
    assert {(r.error_type, r.state) for r in dead.values()} == {("refused", "DEAD")}
    assert dead[refused[0]].error.startswith("the target table refused its row: CHECK constraint not_these (")
    assert "CHECK constraint no_total_40" in dead[refused[2]].error
    assert dead[refused[3]].error == "the target table refused its row: NOT NULL constraint on column quantity"

    spark.sql(f"ALTER TABLE delta.`{target}` DROP CONSTRAINT not_these")
    spark.sql(f"ALTER TABLE delta.`{target}` DROP CONSTRAINT no_total_40")
    spark.sql(f"ALTER TABLE delta.`{target}` ALTER COLUMN quantity DROP NOT NULL")  # allowed, unlike SET
    back = replay(h.c, spark, ReplayRequest(pipeline=h.p.name, error_contains="target table refused", dry_run=False))
    assert (back.selected, back.replayed) == (4, 4)
    assert h.drain().written == 4
    assert {r.state for r in h.dlq_rows()} == {"REPLAYED"}
    # The dead letters stay, REPLAYED: the DLQ's record of what was sent back.
    h.assert_exactly_once(Expected(kept | {*refused}, frozenset((r.partition, r.position) for r in dead.values())))


def test_a_poison_message_is_isolated_and_dead_after_max_retries(h):
    """One message the transform fails on among 500: the first run publishes every other one and
    leaves it for another attempt (the source still has it as not done); each run after tries it again,
    and after 1 + max_retries attempts it is a dead letter with its bytes and the transform's error."""
    h.pipeline(min_idle_ms=0, max_retries=2, batch_cap=20_000)
    result = h.produce(500, seed=12)
    poison = next(m for m in generate(h.p, 50, seed=99, poison_ratio=1.0) if m.kind == "poison")
    (place,) = h.send([poison.value], partition=1)
    first = h.drain()
    assert (first.outcome, first.written, first.left_pending) == ("committed", 500, 1), first.line()
    assert sorted(h.target_ids()) == sorted(result.valid_ids)
    assert h.unacked() == 1  # lag tools see the held message as lag
    runs = [first]
    while h.unacked():
        runs.append(h.drain())
        assert len(runs) <= h.p.max_retries + 1
    assert len(runs) == h.p.max_retries + 1  # tried by 1 + max_retries runs, then dead
    (dead,) = h.dlq_rows()
    assert (dead.error_type, dead.state, dead.attempts) == ("transform", "DEAD", h.p.max_retries + 1)
    assert "poison message" in dead.error and bytes(dead.original) == poison.value
    assert (dead.partition, dead.position, dead.message_id) == (*place, poison.key)
    assert dead.first_failure_at < dead.last_failure_at
    h.assert_exactly_once(Expected(frozenset(result.valid_ids), frozenset([place])))


# -- kills ----------------------------------------------------------------------------------------------

# (point, transform, batch): the run is killed at `point` of its `batch`-th batch. In the first batch
# "during_merge" kills the write that creates the table, in the second a MERGE into it.
KILLS = [("after_claim", HANDLER, 1), ("during_merge", HANDLER, 1), ("after_commit", IDENTITY, 1),
         ("during_ack", HANDLER, 1), ("during_merge", IDENTITY, 2), ("after_commit", HANDLER, 2)]


def kill_cases():
    """KILLS for every kind whose run has the point."""
    for kind, harness in HARNESSES.items():
        for point, transform, batch in KILLS:
            if point in harness.step_points:
                name = "handler" if transform == HANDLER else "identity"
                yield pytest.param(kind, point, transform, batch, id=f"{kind}-{point}-{name}-batch{batch}")


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "point", "transform", "batch"), list(kill_cases()))
def test_sigkill_at_each_step_boundary_loses_and_duplicates_nothing(h, point, transform, batch, request):
    """A drain SIGKILLed at a step boundary of its `batch`-th batch (a catch-up task of several batches
    when it is the second): the batches before it stay committed and acknowledged, the killed one is
    committed or not as its point says, nothing is acknowledged ahead of the lake, and the next runs
    finish the job with every message once. What the source had not been told was done is read again,
    but for a committed batch of a source without leases: the lake says that one is done."""
    # A kill that must stop a MERGE stops the local driver it runs in; at the other points only the
    # run's process has to die, a client of the session's Connect server.
    remote = point != "during_merge" and connect_client(request)
    # A kill during the acknowledgement must land between its chunks: more than two of them, one partition.
    n = 2 * h.ack_chunk + 1000 if point == "during_ack" else 3000
    cap = n + 1000 if batch == 1 else 1000
    h.pipeline(partitions=1 if point == "during_ack" else 2, min_idle_ms=0, batch_cap=cap, transform=transform)
    result = h.produce(n, seed=31, malformed_ratio=0.05)
    h.kill_at(point, skip=batch - 1, max_batches=3 if batch > 1 else 1, remote=remote)
    before = batch - 1  # batches committed and acknowledged before the killed one
    committed = point in ("after_commit", "during_ack")  # "during_merge": killed before its commit landed
    held = min(cap, n - before * cap)  # the killed batch's messages
    assert h.checkpoint().batch == before + committed
    unacked = h.unacked()
    if point == "during_ack":
        assert 0 < unacked < held  # some chunks acknowledged, the others not
    else:
        assert unacked == n - before * cap
        # Claimed until acknowledged with leases; without, a range the lake has passed claims nothing.
        assert h.claimed() == (0 if committed and not h.holds_claims else held)
    h.after_run()
    summaries = h.drain_until_done()
    read_again = sum(s.claimed for s in summaries)
    assert read_again == unacked - (held if committed and not h.holds_claims else 0), [s.line() for s in summaries]
    if committed and h.holds_claims:
        assert sum(s.duplicates_skipped for s in summaries) > 0  # the killed batch's rows, already in the lake
    h.assert_exactly_once(h.expect(result))


@pytest.mark.slow
def test_two_concurrent_drains_one_reports_the_neighbour(h, request):
    """A run held before its commit while another one commits the same batch number: the held one finds
    the other ahead, commits nothing, acknowledges nothing and hands its claims back."""
    # Both runs are alive: min_idle_ms is long, so neither takes the other for a dead run (whose claims
    # are reclaimed and whose ranges are halved), however slow this machine is today.
    remote = connect_client(request)
    h.pipeline(partitions=3, min_idle_ms=600_000, batch_cap=1000)
    result = h.produce(3000, seed=41, malformed_ratio=0.02)
    release = h.tmp_path / "release"
    slow = h.cli(held_at("before_commit", release), remote=remote)
    # Held before its commit: its batch claimed and read, its dead letters written.
    wait_held(slow, (h.c.dlq_path(h.p) / "_delta_log").exists, 180, "the held run did not read its batch")
    assert h.claimed() == 1000
    fast = h.drain()
    release.touch()  # the slow one commits only now
    out, err = slow.communicate(timeout=600)
    assert slow.returncode == 0, err[-3000:]
    lost = summary_of(out)
    # Both read batch 0; the one that commits second finds the other ahead.
    assert (fast.outcome, fast.batch, fast.acked) == ("committed", 1, 1000), fast.line()
    assert (lost["outcome"], lost["acked"], lost["written"]) == ("ahead", 0, 0), lost
    assert lost["released"] == (1000 if h.holds_claims else 0) and "another writer is ahead" in lost["error"]
    assert h.checkpoint().positions == fast.positions
    h.drain_until_done()
    h.assert_exactly_once(h.expect(result))


def crash_seeds() -> list[int]:
    """Seed 1, or DELTADRAIN_CRASH_SEEDS (e.g. "1-20"; docs/testing.md)."""
    spec = os.environ.get("DELTADRAIN_CRASH_SEEDS", "1")
    lo, _, hi = spec.partition("-")
    return list(range(int(lo), int(hi or lo) + 1))


@pytest.mark.slow
@pytest.mark.parametrize("seed", crash_seeds())
def test_random_sigkills_of_catch_up_drains_dead_letter_only_bad_messages(h, seed):
    """Runs killed for reasons that have nothing to do with their data (a worker restarted, a neighbour's
    out-of-memory kill, a deploy) dead-letter nothing (invariant 6): catch-up drains SIGKILLed at random
    moments over a backlog with malformed and poison messages, then drained to the end, leave every
    valid message once in the target and only the bad ones in the DLQ. The seed is in the test's id and
    in every assertion message."""
    rng = random.Random(seed)
    # Ids from the payload alone, as the example's: a payload without its id is a dead letter too.
    h.pipeline(partitions=2, batch_cap=40, max_retries=2, min_idle_ms=1000, place_ids=False)
    result = h.produce(200, seed=seed, malformed_ratio=0.05, poison_ratio=0.01)
    # Local drivers: a kill at a random moment may land in a MERGE, which must die with it. Most land in a
    # batch: the JVM starts in ~10 s, a batch then takes a few seconds. Every kill leaves its ranges to be
    # retried in halves, so two kills already make the next runs drain pieces of several sizes.
    happened = []
    for _ in range(2):
        proc = h.cli(args=("--max-batches", "50"))
        deadline = time.time() + rng.uniform(8, 24)
        while time.time() < deadline and proc.poll() is None:
            time.sleep(0.1)
        if proc.poll() is None:
            proc.kill()
        _, err = proc.communicate(timeout=120)
        happened.append("killed" if proc.returncode == -9 else f"exited {proc.returncode}: {err[-500:]}")
        time.sleep(h.p.min_idle_ms / 1000 + 0.2)  # the dead run's claims are reclaimable from here on
    assert happened.count("killed") >= 1, f"seed {seed}: no drain was killed: {happened}"
    h.drain_until_done(max_runs=60)
    try:
        h.assert_exactly_once(h.expect(result, bad_kinds=(*MALFORMED_KINDS, "poison")))
    except AssertionError as exc:
        raise AssertionError(f"seed {seed} (kills: {happened}): {exc}") from None


# -- backfill and replay ----------------------------------------------------------------------------------

@pytest.mark.slow
def test_backfill_heals_deleted_rows_once_without_moving_the_checkpoint(h, spark):
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    h.pipeline(max_retries=0)
    began = datetime.now(UTC) - timedelta(seconds=1)
    result = h.produce(300, seed=101, malformed_ratio=0.05, poison_ratio=0.01)
    ended = datetime.now(UTC) + timedelta(seconds=1)
    assert h.probe().new == 300  # what the ingest DAG's sensor sees
    h.drain_until_done()
    assert h.probe().new == 0
    expected = h.expect(result, bad_kinds=(*MALFORMED_KINDS, "poison"))
    assert result.poison_ids and {r.state for r in h.dlq_rows()} == {"DEAD"}
    h.assert_exactly_once(expected)
    lost = sorted(result.valid_ids)[:7]
    DeltaTable.forPath(spark, str(h.c.target_path(h.p))).delete(F.col(h.p.payload_schema.id_field).isin(lost))
    assert not set(lost) & set(h.target_ids())

    before, marks = h.checkpoint(), h.marks()
    # With the transform since fixed, the poison messages decode and transform fine when read again; they
    # are still DEAD dead letters, whose way back is the replay: the backfill leaves them out.
    fixed = h.p.model_copy(update={"transform": IDENTITY})
    s = backfill(h.c, fixed, spark, began, ended)
    assert (s.read, s.skipped_dead_lettered, s.written, s.dead_lettered, s.acked, s.gaps) == (
        300, len(expected.dead), len(lost), 0, 0, []), s
    assert s.duplicates_skipped == len(expected.ids) - len(lost)
    h.assert_exactly_once(expected)
    assert {r.state for r in h.dlq_rows()} == {"DEAD"}
    after = h.checkpoint()
    assert (after.batch, after.positions) == (before.batch, before.positions)
    assert h.marks() == marks  # nothing claimed, nothing acknowledged

    # Twice is harmless, and an interval that holds nothing reads nothing.
    again = backfill(h.c, h.p, spark, began, ended)
    assert (again.written, again.duplicates_skipped) == (0, len(expected.ids))
    assert backfill(h.c, h.p, spark, began - timedelta(days=1), began - timedelta(hours=23)).read == 0
    h.assert_exactly_once(expected)
    # The live pipeline goes on from its own checkpoint.
    more = h.produce(50, seed=102)
    summary = h.drain()
    assert (summary.outcome, summary.batch) == ("committed", before.batch + 1)
    h.assert_exactly_once(expected + h.expect(more))
    with pytest.raises(BackfillError, match="inverted"):
        backfill(h.c, h.p, spark, ended, began)


def test_a_backfill_names_the_history_the_source_removed_as_a_gap(h, spark):
    """Trimming or retention took the oldest messages of the interval: the backfill heals from what is
    left and names the range it could not read, up to the first message left; once every message is
    gone it reads nothing and names all of them."""
    h.pipeline(partitions=1)
    began = datetime.now(UTC) - timedelta(seconds=5)
    msgs = list(generate(h.p, 100, seed=103))
    places = h.send([m.value for m in msgs])
    h.remove_oldest(40)
    s = backfill(h.c, h.p, spark, began, datetime.now(UTC) + timedelta(seconds=1))
    assert (s.read, s.written) == (60, 60), s
    assert sorted(h.target_ids()) == sorted(m.key for m in msgs[40:])
    (gap,) = s.gaps
    at = h.position_key
    assert gap["partition"] == h.partition(0) and at(places[39][1]) <= at(gap["to"]) < at(places[40][1]), gap
    h.remove_oldest(60)
    s = backfill(h.c, h.p, spark, began, datetime.now(UTC) + timedelta(seconds=1))
    assert (s.read, s.written) == (0, 0), s
    assert [(g["partition"], g["to"]) for g in s.gaps] == [(h.partition(0), places[-1][1])], s.gaps


@pytest.mark.slow
def test_reprocess_restores_published_rows_through_the_transform_without_duplicates(h, spark):
    """Three rows of one partition, far apart, corrupted in the target: a reprocess replay reads their
    messages again through the transform and rewrites each row in place, keeping its batch; twice is
    still one row each."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    h.pipeline(partitions=2)
    result = h.produce(200, seed=104)
    h.drain_until_done()
    target = str(h.c.target_path(h.p))
    table = spark.read.format("delta").load(target)
    held = table.where(F.col("_dd_partition") == h.partition(0)).orderBy("_dd_pos_hi", "_dd_pos_lo").collect()
    originals = {r.event_id: r for r in (held[0], held[len(held) // 2], held[-1])}
    victims = sorted(originals)
    DeltaTable.forPath(spark, target).update(F.col("event_id").isin(victims), {"customer": F.lit("corrupted")})

    request = ReplayRequest(pipeline=h.p.name, mode="reprocess", message_ids=victims, dry_run=False)
    for _ in range(2):  # twice: still one row each
        r = replay(h.c, spark, request)
        assert (r.selected, r.written, r.skipped) == (3, 3, []), r
        assert r.batches == sorted({o._dd_batch for o in originals.values()})  # for the replay DAG's quality check
        rows = {x.event_id: x for x in spark.read.format("delta").load(target).where(
            F.col("event_id").isin(victims)).collect()}
        assert sorted(rows) == victims
        for event_id, row in rows.items():
            assert (row.customer, row._dd_batch) == (originals[event_id].customer, originals[event_id]._dd_batch)
            assert row._dd_run_id == r.run_id
    h.assert_exactly_once(h.expect(result))
