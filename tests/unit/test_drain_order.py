"""The run's order, as `Drain.run` holds it for every kind: a kind that supplies its steps gets the
guarantees without writing them (docs/sources.md, "What a source implements").

Each test runs the real `Drain.run` over the in-memory kinds of tests/support/toy_source.py, one
with leases (as Valkey) and one with ranges mirrored by a cursor (as Kafka), with a fake publish and
commit (no Spark): acknowledgement only after a committed (or already committed) batch, of exactly
what that batch holds (invariants 4 and 5); another writer's outcome acknowledges nothing and releases
the claims; a killed run acknowledges and cleans up nothing; the batch published is the checkpoint's
next one; an empty run commits nothing.
"""

from __future__ import annotations

import re
from collections import Counter

import pytest

from deltadrain import failpoints
from deltadrain.lake.checkpoint import Checkpoint
from deltadrain.run.drain import Drain, DrainError, go_on_past
from deltadrain.run.outcome import Outcome
from tests.support.toy_source import KINDS, Commit, LeasingDrain, ToyLake, ToyQueue

EVERY = {("p0", str(n)) for n in range(1, 6)} | {("p1", str(n)) for n in range(1, 4)}


class World:
    """One toy source and its lake; `drain()` makes the next run of the kind under test."""

    def __init__(self, cfg, kind: str):
        self.cfg, self.kind = cfg, kind
        self.lake = ToyLake()
        self.queue = ToyQueue(self.lake, {"p0": 5, "p1": 3})
        self.pipeline = cfg.pipeline("orders").model_copy(update={"transform": None, "batch_cap": 100})

    def drain(self, on_gap: str | None = None, kind=None):
        p = self.pipeline
        if on_gap is not None:
            p = p.model_copy(update={"source": p.source.model_copy(update={"on_gap": on_gap})})
        return (kind or KINDS[self.kind])(self.cfg, p, self.queue)

    def published_once(self) -> bool:
        return all(n == 1 for n in Counter(k for c in self.lake.commits for k in c.keys).values())


@pytest.fixture(params=sorted(KINDS))
def world(request, cfg) -> World:
    return World(cfg, request.param)


def test_a_committed_batch_is_acknowledged_after_its_commit_and_exactly_what_it_holds(world):
    run = world.drain()
    s = run.run()
    assert (s.outcome, s.batch, s.claimed, s.written, s.acked) == ("committed", 1, 8, 8, 8)
    assert [c.batch for c in world.lake.commits] == [1] and world.lake.published() == EVERY
    assert world.queue.acknowledged() == EVERY and world.queue.early == []
    assert run.finished and run.metrics == [{"outcome": "committed", "acked": 8}]
    assert {"checkpoint", "claim", "ack"} <= set(s.timings)


def test_an_already_committed_batch_is_acknowledged_as_a_committed_one(world):
    world.lake.answer = Outcome.ALREADY_COMMITTED
    s = world.drain().run()
    assert s.outcome == "already_committed" and s.acked == 8
    assert world.queue.acknowledged() == world.lake.published() == EVERY and world.queue.early == []


def test_the_batch_published_is_the_one_after_the_checkpoint(world):
    world.lake.commits.append(Commit(4, "earlier", {}, []))
    s = world.drain().run()
    assert s.batch == 5 and [c.batch for c in world.lake.commits] == [4, 5]
    world.queue.append("p1", 2)
    assert world.drain().run().batch == 6 and world.lake.commits[-1].batch == 6


@pytest.mark.parametrize("outcome", [Outcome.AHEAD, Outcome.CONFLICT, Outcome.MISMATCH])
def test_an_outcome_not_its_own_acknowledges_nothing_and_releases_the_claims(world, outcome):
    world.lake.answer = outcome
    run = world.drain()
    if outcome == Outcome.AHEAD:
        s = run.run()
        assert "another writer is ahead" in s.error
    else:
        with pytest.raises(DrainError, match="conflicted" if outcome == Outcome.CONFLICT else "restored"):
            run.run()
        s = run.summary
    assert s.outcome == outcome.value and s.acked == 0
    assert world.queue.acknowledged() == set() and world.queue.early == []
    # Leases go back for the next run at once; a range is no lease, there is nothing to release.
    assert (s.released, sorted(world.queue.released)) == ((8, sorted(EVERY)) if world.kind == "leasing" else (0, []))
    assert world.queue.claims == {} and run.finished and len(run.metrics) == 1


@pytest.mark.parametrize("point", ["after_claim", "after_commit"])
def test_a_killed_run_acknowledges_and_cleans_up_nothing(world, point, monkeypatch):
    def hit(name: str, pid=None) -> None:
        if name == point:
            raise RuntimeError(f"{failpoints.ABANDON}: killed at {name}")

    monkeypatch.setattr(failpoints, "hit", hit)
    run = world.drain()
    with pytest.raises(failpoints.Abandoned):
        run.run()
    assert world.queue.acknowledged() == set() and world.queue.released == []
    assert not run.finished and run.metrics == []  # no cleanup, no metrics row: as after a SIGKILL
    assert set(world.queue.claims.values()) <= {run.run_id}  # its leases stay for the next run to take over
    assert [c.batch for c in world.lake.commits] == ([1] if point == "after_commit" else [])
    monkeypatch.undo()
    # The next run: the dead run's batch once in the lake, and all of it acknowledged after that.
    after = world.drain().run()
    assert after.outcome in ("committed", "empty")
    assert world.lake.published() == world.queue.acknowledged() == EVERY
    assert world.published_once() and world.queue.early == []


def test_an_empty_run_commits_nothing(world):
    world.queue.sizes = {}
    first = world.drain().run()
    assert (first.outcome, first.batch, first.claimed, first.acked) == ("empty", 0, 0, 0)
    assert world.lake.commits == []
    world.queue.append("p0", 3)
    assert world.drain().run().outcome == "committed"
    again = world.drain()
    s = again.run()
    assert (s.outcome, s.batch, s.acked) == ("empty", 1, 0) and len(world.lake.commits) == 1
    assert again.finished and len(again.metrics) == 1


def test_a_culprit_is_left_for_another_attempt_and_neither_published_nor_acknowledged(world):
    world.lake.poison = {("p0", "3")}
    s = world.drain().run()
    assert s.outcome == "committed"
    assert ("p0", "3") not in world.lake.published()
    assert world.queue.acknowledged() == world.lake.published() and world.queue.early == []
    if world.kind == "leasing":  # it stays pending, the rest of its partition goes on
        assert world.lake.published() == EVERY - {("p0", "3")} and s.acked == 7
    else:  # it holds its partition at its place
        assert world.lake.published() == EVERY - {("p0", "3"), ("p0", "4"), ("p0", "5")}
        assert world.lake.commits[-1].positions["p0"] == "2"


def test_a_gap_stops_a_run_under_on_gap_fail_before_it_claims_and_is_carried_under_continue(world):
    world.queue.lost = [{"partition": "p0", "from": "0", "to": "0", "missing": 2}]
    stopped = world.drain(on_gap="fail")
    with pytest.raises(DrainError, match=re.escape(f"the toy lost 1 ranges. {go_on_past(stopped.cfg, stopped.pipeline)}")):
        stopped.run()
    assert (stopped.summary.batch, stopped.summary.gaps, stopped.summary.claimed) == (0, 2, 0)
    assert world.lake.commits == [] and world.queue.acknowledged() == set()
    assert world.queue.claims == {} and world.queue.released == []  # nothing was claimed
    carried = world.drain(on_gap="continue")
    s = carried.run()
    assert s.outcome == "committed" and s.gaps == 2 and carried.commit_extra["gaps"] == world.queue.lost
    assert world.queue.acknowledged() == world.lake.published() == EVERY


def test_a_claim_that_fails_with_no_message_to_blame_hands_the_leases_back(cfg):
    from deltadrain.formats.registry import RegistryUnavailable

    world = World(cfg, "leasing")

    class Outage(LeasingDrain):
        def claim(self, plan):
            super().claim(plan)  # some claims landed before the registry stopped answering
            raise RegistryUnavailable("the schema registry is out")

    run = world.drain(kind=Outage)
    with pytest.raises(RegistryUnavailable):
        run.run()
    assert run.summary.released == 8 and world.queue.claims == {} and world.lake.commits == []


def test_a_source_supplies_steps_and_cannot_reorder_the_run():
    with pytest.raises(TypeError, match="overrides Drain.run"):
        type("Reordered", (LeasingDrain,), {"run": lambda self: None})

    class Partial(Drain):  # a kind that forgot how to acknowledge
        def plan(self, checkpoint: Checkpoint):
            raise AssertionError

    with pytest.raises(TypeError, match="abstract"):
        Partial(None, None, None)
    assert {"plan", "claim", "gaps", "acknowledge", "settle_culprits", "originals", "finish"} == Drain.__abstractmethods__
    assert ToyLake().checkpoint().batch == 0 and ToyQueue(ToyLake(), {}).acknowledged() == set()
