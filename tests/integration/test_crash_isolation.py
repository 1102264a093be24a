"""Runs killed for reasons that have nothing to do with their data (a worker restarted, a neighbour's
out-of-memory kill, a deploy) dead-letter nothing: catch-up drains SIGKILLed at random moments over a
backlog with malformed and poison messages, on both sources, then drained to the end. Read back from
the Delta tables: every valid message exactly once in the target, and only the malformed and poison
messages in the DLQ (invariant 6).

Seeded: the seed is in the test's id and in every assertion message. The suite runs seed 1 on each
source; DELTADRAIN_CRASH_SEEDS (e.g. "1-20") runs more (docs/testing.md)."""

from __future__ import annotations

import os
import random
import time

import pytest

from deltadrain.dev.produce import MALFORMED_KINDS, produce
from deltadrain.sources.valkey.client import valkey_client
from tests.integration.helpers import (
    assert_exactly_once,
    cli_drain,
    drain_until_done,
    make_pipeline,
)

BAD_KINDS = {*MALFORMED_KINDS, "poison"}
KILLS = 3


def seeds() -> list[int]:
    spec = os.environ.get("DELTADRAIN_CRASH_SEEDS", "1")
    lo, _, hi = spec.partition("-")
    return list(range(int(lo), int(hi or lo) + 1))


def kill_at_random_moments(path, name: str, rng: random.Random, min_idle_ms: int) -> list[str]:
    """KILLS catch-up drains, each SIGKILLed at a random moment of its life (most land in a batch: the
    JVM starts in ~10 s, a batch then takes a few seconds). What happened to each, for the messages."""
    happened = []
    for _ in range(KILLS):
        proc = cli_drain(path, name, args=("--max-batches", "50"))
        deadline = time.time() + rng.uniform(8, 24)
        while time.time() < deadline and proc.poll() is None:
            time.sleep(0.1)
        if proc.poll() is None:
            proc.kill()
        out, err = proc.communicate(timeout=120)
        happened.append("killed" if proc.returncode == -9 else f"exited {proc.returncode}: {err[-500:]}")
        time.sleep(min_idle_ms / 1000 + 0.2)  # the dead run's claims are reclaimable from here on
    return happened


@pytest.mark.slow
@pytest.mark.parametrize("seed", seeds())
def test_random_sigkills_of_valkey_catch_up_drains_dead_letter_only_bad_messages(seed, tmp_path, cfg, spark,
                                                                                valkey_server):
    rng = random.Random(seed)
    path, c, p = make_pipeline(tmp_path, partitions=2, batch_cap=40, max_retries=2, min_idle_ms=1000)
    client = valkey_client(c, p)
    result = produce(c, p, 320, seed=seed, malformed_ratio=0.05, poison_ratio=0.01)
    happened = kill_at_random_moments(path, p.name, rng, p.min_idle_ms)
    assert happened.count("killed") >= 1, f"seed {seed}: no drain was killed: {happened}"
    drain_until_done(c, p, spark, client, max_runs=60)
    try:
        assert_exactly_once(spark, c, p, client, result.valid_ids, result.bad_places(BAD_KINDS))
    except AssertionError as exc:
        raise AssertionError(f"seed {seed} (kills: {happened}): {exc}") from None


@pytest.mark.slow
@pytest.mark.parametrize("seed", seeds())
def test_random_sigkills_of_kafka_catch_up_drains_dead_letter_only_bad_messages(seed, tmp_path, cfg, spark,
                                                                               kafka_broker):
    from tests.integration.test_kafka_drain import assert_exactly_once as kafka_exactly_once
    from tests.integration.test_kafka_drain import drain_until_done as kafka_drain_until_done
    from tests.integration.test_kafka_drain import make_kafka_pipeline

    rng = random.Random(seed)
    # id_from: field, as the example: a payload without its id is a dead letter too.
    path, c, p = make_kafka_pipeline(tmp_path, partitions=2, batch_cap=40, max_retries=2, min_idle_ms=1000,
                                     source={"id_from": "field"})
    result = produce(c, p, 320, seed=seed, malformed_ratio=0.05, poison_ratio=0.01)
    happened = kill_at_random_moments(path, p.name, rng, p.min_idle_ms)
    assert happened.count("killed") >= 1, f"seed {seed}: no drain was killed: {happened}"
    kafka_drain_until_done(c, p, spark, max_runs=60)
    try:
        kafka_exactly_once(spark, c, p, result.valid_ids, set(), result.bad_places(BAD_KINDS))
    except AssertionError as exc:
        raise AssertionError(f"seed {seed} (kills: {happened}): {exc}") from None
