"""Runs that die isolate the message that kills them and convict nobody else (deltadrain.run.isolation),
driven through each source's own pure decisions: Valkey's pending-list splits (valkey.crashes,
claim.retries_run_out) and Kafka's dead-run record and bisection (kafka.crashes). Each world below
plays runs against a source the way the drains do, with messages that kill every run that reads them,
runs that die for reasons of their own, and messages whose transform fails."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from deltadrain.run.isolation import convicted, crash_loop_runs, read_width
from deltadrain.sources.kafka.crashes import DeadRuns, bisect
from deltadrain.sources.valkey.claim import ClaimContext, retries_run_out
from deltadrain.sources.valkey.crashes import RELEASED, REST, choose, kind_of, segments


@dataclass
class Outcome:
    published: set = field(default_factory=set)
    dead: set = field(default_factory=set)
    runs: int = 0
    killer_reads: dict = field(default_factory=dict)  # killer -> widths of the runs that read it


def valkey_world(n: int, cap: int, max_retries: int, killers=(), failing=(), dies=lambda run: False,
                 streams: int = 1) -> Outcome:
    """`n` entries over `streams` streams drained by runs of at most `cap`, min_idle_ms 0. A run dies
    when it reads a killer that is not convicted in its own claim, or when `dies(run)` says so (a
    restart, an eviction: nothing to do with its data). A `failing` entry fails its transform in every
    run that does not die; the culprit stays pending with its failure recorded."""
    ctx = ClaimContext(url="", username=None, password=None, group="g", consumer="", min_idle_ms=0,
                       max_attempts=max_retries + 1, fields={}, id_field="id", required=[], max_bytes=1,
                       failures_key="f")
    order = [(f"s{i % streams}", f"{1000 + i}-0") for i in range(n)]
    order.sort()
    new = list(order)
    pending: dict[tuple[str, str], list] = {}  # entry -> [holder, deliveries]
    failures: dict[tuple[str, str], dict] = {}
    alone: dict[tuple[str, str], int] = {}
    out = Outcome()
    while new or pending:
        out.runs += 1
        run = out.runs
        assert run < 50 * n, "the drains never finish"
        entries = sorted(pending)
        found = segments((s, i, pending[(s, i)][1], kind_of(pending[(s, i)][0], (s, i) in failures))
                         for s, i in entries)
        split = choose(found)
        if split is not None:
            claimed = []
            for stream, start, count in split.read:
                claimed += [e for e in entries if e[0] == stream and e[1] >= start][:count]
            if split.marks_rest:
                seg = split.segment
                for e in entries:
                    inside = any(p.stream == e[0] and p.first <= e[1] <= p.last for p in seg.pieces)
                    if inside and e not in claimed and pending[e][1] == seg.deliveries:
                        pending[e][0] = REST
            if split.alone:
                alone[split.alone] = alone.get(split.alone, 0) + 1
        else:  # an ordinary batch: idle entries reclaimed (culprits, released ones), then new ones
            claimed = entries[:cap]
            take = cap - len(claimed)
            claimed += new[:take]
            del new[:take]
        for e in claimed:
            holder = pending.setdefault(e, [None, 0])
            holder[0], holder[1] = f"drain-{run}", holder[1] + 1
        spent = {e for e in claimed
                 if retries_run_out(ctx, pending[e][1], None, failures.get(e), alone.get(e, 0))}
        for k in killers:
            if k in claimed:
                out.killer_reads.setdefault(k, []).append(len(claimed))
        if dies(run) or any(e in killers and e not in spent for e in claimed):
            continue  # its entries stay pending with a consumer that is gone
        for e in claimed:
            if e in spent:
                out.dead.add(e)
            elif e in failing:
                if pending[e][1] >= ctx.max_attempts:  # Drain.settle_culprits
                    out.dead.add(e)
                else:
                    failures[e] = {"error": "transform failed"}
                    continue  # left pending for another attempt
            else:
                out.published.add(e)
            del pending[e]
            alone.pop(e, None)
            failures.pop(e, None)
    return out


def kafka_world(ends: dict[int, int], cap: int, max_retries: int, killers=(), dies=lambda run: False) -> Outcome:
    """Partitions of `ends` offsets drained by runs of at most `cap` offsets (the earliest partitions
    first), each run's death counted by the next one as the claim notices let it (kafka.crashes)."""
    records = {p: DeadRuns() for p in ends}
    position = dict.fromkeys(ends, 0)
    out = Outcome()
    while any(position[p] < ends[p] for p in ends):
        out.runs += 1
        run = out.runs
        assert run < 50 * sum(ends.values()), "the drains never finish"
        ranges, room = {}, cap
        for p in sorted(ends):
            take = min(room, ends[p] - position[p])
            if take:
                ranges[p] = (position[p], position[p] + take)
                room -= take
        ranges = bisect(ranges, {p: r for p, r in records.items() if r})
        held = [(p, o) for p, (lo, hi) in ranges.items() for o in range(lo, hi)]
        spent = {(p, o) for p, o in held if convicted(records[p].alone_at(o), 0, max_retries)}
        for k in killers:
            if k in held:
                out.killer_reads.setdefault(k, []).append(len(held))
        if dies(run) or any(h in killers and h not in spent for h in held):
            width = len(held)
            for p, (lo, hi) in ranges.items():
                records[p] = records[p].with_dead_run(f"r{run}", lo, hi, run, alone=width == 1)
            continue
        for h in held:
            (out.dead if h in spent else out.published).add(h)
        for p, (_, hi) in ranges.items():
            position[p] = hi
            records[p] = records[p].passed(hi)
    return out


def valkey_all(n: int, streams: int = 1) -> set:
    return {(f"s{i % streams}", f"{1000 + i}-0") for i in range(n)}


def kafka_all(ends: dict[int, int]) -> set:
    return {(p, o) for p, end in ends.items() for o in range(end)}


def test_read_width_halves_what_died_and_reads_the_rest_whole():
    assert [read_width(w, 0, False) for w in (0, 1, 16)] == [0, 1, 16]
    assert [read_width(w, 1, False) for w in (1, 2, 3, 16)] == [1, 1, 1, 8]
    assert read_width(8, 5, inside=True) == 8


def test_only_deaths_alone_convict_and_transform_failures_count_with_them():
    assert not convicted(0, 9, 3)  # runs that died holding it among others: no evidence
    assert not convicted(2, 0, 3) and convicted(3, 0, 3)
    assert not convicted(1, 1, 3) and convicted(1, 2, 3)
    assert crash_loop_runs(16, 3) == 3 + 4 + 1 and crash_loop_runs(10_000, 3) == 3 + 14 + 1
    assert crash_loop_runs(1, 3) == 4


@pytest.mark.parametrize("seed", range(12))
def test_unrelated_deaths_convict_nobody_on_either_source(seed):
    """One run in five dies for reasons of their own: every message is still published. (A message
    alone in max_retries runs that died is dead whatever killed them: that takes ceil(log2(width)) +
    max_retries deaths in a row on its range, which runs that die this often may still reach.)"""
    rng = random.Random(seed)
    deaths = {r for r in range(1, 400) if rng.random() < 0.2}

    valkey = valkey_world(60, 16, 3, dies=deaths.__contains__, streams=3)
    assert valkey.dead == set(), f"seed {seed}"
    assert valkey.published == valkey_all(60, 3)
    ends = {0: 25, 1: 20, 2: 15}
    kafka = kafka_world(ends, 16, 3, dies=deaths.__contains__)
    assert kafka.dead == set(), f"seed {seed}"
    assert kafka.published == kafka_all(ends)


@pytest.mark.parametrize("max_retries", [1, 2, 3])
@pytest.mark.parametrize("at", [0, 7, 15], ids=["start", "middle", "end"])
def test_a_killer_anywhere_in_a_batch_dies_alone_within_the_bound(at, max_retries):
    cap = 16
    killer_v = ("s0", f"{1000 + at}-0")
    valkey = valkey_world(cap, cap, max_retries, killers={killer_v})
    assert valkey.dead == {killer_v}
    assert valkey.published == valkey_all(cap) - {killer_v}
    widths = valkey.killer_reads[killer_v]
    assert len(widths) <= crash_loop_runs(cap, max_retries), widths
    assert widths == sorted(widths, reverse=True)  # each run that reads it no larger than the one before
    assert widths[-max_retries - 1:] == [1] * (max_retries + 1)  # alone in its last ones

    killer_k = (0, at)
    kafka = kafka_world({0: cap}, cap, max_retries, killers={killer_k})
    assert kafka.dead == {killer_k}
    assert kafka.published == kafka_all({0: cap}) - {killer_k}
    widths = kafka.killer_reads[killer_k]
    assert len(widths) <= crash_loop_runs(cap, max_retries), widths
    assert widths == sorted(widths, reverse=True)
    assert widths[-max_retries - 1:] == [1] * (max_retries + 1)


def test_the_bound_holds_for_every_position_and_is_reached():
    for cap in (5, 12, 16, 33):
        reads = []
        for at in range(cap):
            k = ("s0", f"{1000 + at}-0")
            v = valkey_world(cap, cap, 3, killers={k})
            kf = kafka_world({0: cap}, cap, 3, killers={(0, at)})
            assert v.dead == {k} and kf.dead == {(0, at)}, (cap, at)
            reads += [len(v.killer_reads[k]), len(kf.killer_reads[(0, at)])]
        assert max(reads) == crash_loop_runs(cap, 3), cap


def test_two_killers_in_one_batch_are_both_dead_alone():
    killers_v = {("s1", "1003-0"), ("s0", "1012-0")}
    valkey = valkey_world(32, 32, 3, killers=killers_v, streams=2)
    assert valkey.dead == killers_v
    assert valkey.published == valkey_all(32, 2) - killers_v
    killers_k = {(0, 3), (1, 4)}
    ends = {0: 16, 1: 16}
    kafka = kafka_world(ends, 32, 3, killers=killers_k)
    assert kafka.dead == killers_k
    assert kafka.published == kafka_all(ends) - killers_k


@pytest.mark.parametrize("seed", range(8))
def test_a_killer_among_unrelated_deaths_is_the_only_dead_letter(seed):
    rng = random.Random(seed)
    deaths = {r for r in range(1, 400) if rng.random() < 0.2}
    k = ("s1", "1009-0")
    valkey = valkey_world(48, 16, 3, killers={k}, dies=deaths.__contains__, streams=2)
    assert valkey.dead == {k}, f"seed {seed}"
    assert valkey.published == valkey_all(48, 2) - {k}
    ends = {0: 20, 1: 28}
    kafka = kafka_world(ends, 16, 3, killers={(1, 9)}, dies=deaths.__contains__)
    assert kafka.dead == {(1, 9)}, f"seed {seed}"
    assert kafka.published == kafka_all(ends) - {(1, 9)}


def test_a_killer_next_to_a_transform_failure_each_end_as_what_they_are():
    """The culprit fails its own transform max_retries + 1 times and is a transform dead letter; the
    killer dies alone; the messages around them are published."""
    killer, culprit = ("s0", "1004-0"), ("s0", "1005-0")
    out = valkey_world(16, 16, 2, killers={killer}, failing={culprit})
    assert out.dead == {killer, culprit}
    assert out.published == valkey_all(16) - {killer, culprit}


def test_kinds_that_are_no_deaths_are_never_split():
    """Entries a run handed back (a lost race) and transform culprits ride along with new entries."""
    assert choose(segments([("s", "1-0", 3, kind_of(RELEASED, False))])) is None
    assert choose(segments([("s", "1-0", 3, kind_of("drain-x", True))])) is None
    assert choose(segments([("s", "1-0", 1, kind_of("drain-x", False))])).alone == ("s", "1-0")
