"""The compare-and-set outcome of a commit (docs/contract.md, "One drain run", step 6), decided from what the table says afterwards."""

from __future__ import annotations

from enum import StrEnum


class Outcome(StrEnum):
    COMMITTED = "committed"  # the table moved from v to v+1 by this run
    ALREADY_COMMITTED = "already_committed"  # this run's batch was in the table already: ack, move on
    AHEAD = "ahead"  # another writer got further (noisy neighbour): ack nothing, release claims
    MISMATCH = "mismatch"  # the table is older than expected: stop with an error
    CONFLICT = "conflict"  # other writers kept conflicting, the table did not move: fail, retry later
    EMPTY = "empty"  # nothing to do


def decide(expected: int, observed: int | None, committed_by_us: bool, wrote_now: bool,
           conflicted: bool = False) -> Outcome:
    """`expected` is the batch sequence read before claiming (v); this run tried to write v+1.

    observed: the pipeline's txn version in the table after the attempt (None: no txn yet).
    committed_by_us: the commit holding version v+1 carries this run's id.
    wrote_now: the attempt itself returned a new commit (not skipped by Delta's txn check).
    conflicted: the last attempt failed on a concurrent commit (all retries used up).
    """
    target = expected + 1
    current = observed if observed is not None else 0
    if conflicted and current == expected:
        # Writers that do not move the batch (a backfill, OPTIMIZE, a quarantine) kept winning: the
        # table is where this run found it, not restored. Nothing landed; a later run can try again.
        return Outcome.CONFLICT
    if current < target:
        # The write did not land and nobody else's did either: the table went backwards or was
        # replaced under us (restore, recreate). Writing on would corrupt the sequence.
        return Outcome.MISMATCH
    if current == target and committed_by_us:
        return Outcome.COMMITTED if wrote_now else Outcome.ALREADY_COMMITTED
    if current > target and committed_by_us:
        # Ours landed as v+1 and someone already went on past it.
        return Outcome.COMMITTED if wrote_now else Outcome.ALREADY_COMMITTED
    return Outcome.AHEAD
