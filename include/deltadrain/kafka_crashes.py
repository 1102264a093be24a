"""Kafka: the runs that died reading a range, counted as attempts (DESIGN.md invariant 6).

Valkey counts a delivery for every entry a run claims, so a message that kills its run (a crash, a
hang that Airflow stops at the task's execution_timeout, running out of memory) reaches max_retries
like any other. Kafka has no delivery count. What a dead run leaves is its claim notice on the group
offset (`kafka_offsets.announce_claims`): its run id, the range it read and since when. The next run
counts it: every offset of that range at or after the lake's checkpoint gets one dead run. The count
is kept per partition as segments [start, end, runs, first_ms] in the next run's notices and in its
commit metadata, next to the checkpoint, so it survives any number of dead runs and no side file
holds it. From it:

- a message's attempt is 1 + the dead runs that read it (+ the runs its transform failed in); past
  max_retries + 1 it becomes a `max_retries` dead letter without being decoded;
- bisection: a run that starts where the dead runs' range starts reads its first half only; one
  that starts inside it (a first half committed) reads the rest of it. A message that kills every
  run that reads it is read by max_retries + 1 of them, each in at most half the range of the one
  before, and takes at most range / 2**max_retries messages with it into the DLQ instead of a
  whole batch. A crash that had nothing to do with the data costs two smaller runs.

A notice younger than min_idle_ms may be a slow run's, not a dead one's (the Valkey reaper's rule
for idle entries): it is carried in this run's notice as `earlier` and counted by a later run once it
is old enough and the lake has not passed it. Everything here is pure.
"""

from __future__ import annotations

from dataclasses import dataclass, field

COUNTED_KEPT = 8  # run ids remembered per partition, so that a notice is never counted twice
EARLIER_KEPT = 4  # young notices carried forward per partition


@dataclass(frozen=True)
class DeadRuns:
    """One partition's record: disjoint [start, end) segments, each read by `runs` runs that died
    (the first of them announced at `first_ms`), and the ids of the runs counted."""

    segments: tuple[tuple[int, int, int, int], ...] = ()
    counted: tuple[str, ...] = ()

    def as_json(self, earlier: list[dict] | None = None) -> dict:
        out = {"seg": [list(s) for s in self.segments], "counted": list(self.counted)}
        if earlier:
            out["earlier"] = earlier
        return out

    @classmethod
    def from_json(cls, data) -> DeadRuns:
        """A record as as_json() wrote it; anything else (another version's, damaged) is no record."""
        try:
            segments = tuple(sorted((int(a), int(b), int(n), int(f)) for a, b, n, f in data.get("seg", [])))
            return cls(tuple(s for s in segments if s[0] < s[1] and s[2] > 0),
                       tuple(str(r) for r in data.get("counted", [])))
        except (AttributeError, TypeError, ValueError):
            return cls()

    def __bool__(self) -> bool:
        return bool(self.segments)

    def at(self, offset: int) -> tuple[int, int, int, int] | None:
        return next((s for s in self.segments if s[0] <= offset < s[1]), None)

    def runs_at(self, offset: int) -> int:
        seg = self.at(offset)
        return seg[2] if seg else 0

    def with_dead_run(self, run: str, start: int, end: int, since_ms: int) -> DeadRuns:
        """One more run that died reading [start, end): each offset there counts one more."""
        cuts = sorted({start, end, *(x for s in self.segments for x in s[:2])})
        pieces = []
        for lo, hi in zip(cuts, cuts[1:], strict=False):
            seg = self.at(lo)
            runs, first = (seg[2], seg[3]) if seg else (0, since_ms)
            if start <= lo < end:
                runs, first = runs + 1, min(first, since_ms)
            if runs:
                pieces.append((lo, hi, runs, first))
        # Pieces are never coalesced: every cut is where a dead run started or ended. A later run
        # that starts at a cut reads half of the piece after it, one that starts inside a piece (its
        # first half committed) the rest of it (bisect).
        return DeadRuns(tuple(pieces), (*self.counted, run)[-COUNTED_KEPT:])

    def merged(self, other: DeadRuns) -> DeadRuns:
        """Both records' knowledge: per offset the larger count (a dead run is never counted twice)."""
        if not other.segments:
            return DeadRuns(self.segments, _union(self.counted, other.counted))
        cuts = sorted({x for s in (*self.segments, *other.segments) for x in s[:2]})
        pieces = []
        for lo, hi in zip(cuts, cuts[1:], strict=False):
            got = [s for s in (self.at(lo), other.at(lo)) if s]
            if got:
                best = max(got, key=lambda s: (s[2], -s[3]))
                pieces.append((lo, hi, best[2], min(s[3] for s in got)))
        return DeadRuns(tuple(pieces), _union(self.counted, other.counted))

    def passed(self, position: int) -> DeadRuns:
        """Without the segments wholly behind the checkpoint: their messages are published or dead.
        A segment the checkpoint is inside of stays whole, so that a later run knows it starts inside."""
        kept = tuple(s for s in self.segments if s[1] > position)
        return DeadRuns(kept, self.counted if kept else ())


def _union(a: tuple[str, ...], b: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(dict.fromkeys((*a, *b)))[-COUNTED_KEPT:]


@dataclass
class Settled:
    """What a run knows at its start about one partition: the record, and young notices to carry."""

    record: DeadRuns = field(default_factory=DeadRuns)
    earlier: list[dict] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.record) or bool(self.earlier)

    def carried(self, position: int) -> dict | None:
        """What a commit whose checkpoint is `position` keeps of it (None: nothing)."""
        record = self.record.passed(position)
        earlier = [e for e in self.earlier if e["range"][1] > position]
        return record.as_json(earlier) if record or earlier else None


def settle(lake: DeadRuns, lake_earlier: list[dict], notice: dict | None, position: int, now_ms: int,
           min_idle_ms: int, notice_after_ms: int | None = None, committed_by: str | None = None) -> Settled:
    """The record a run starts with on one partition: the lake's, what the notice on the group offset
    carries, and that notice's run (and the young ones carried by it or by the lake) counted as dead
    when older than min_idle_ms and not behind the checkpoint `position`. A run behind it committed,
    or another run committed its range. `notice_after_ms`: another age for the notice's own run
    (status counts it only once Airflow would have killed it: it may be a long batch still running).
    `committed_by`: the run whose commit is the checkpoint. It did not die, whatever its notice says
    (killed after its commit, or its group commit and notice withdrawal both failed); with its
    partition held at a culprit, the notice's range reaches past the checkpoint."""
    record = lake
    candidates = list(lake_earlier)
    if notice:
        record = record.merged(DeadRuns.from_json(notice.get("crashes") or {}))
        candidates = [notice, *(notice.get("earlier") or []), *candidates]
    earlier: dict[str, dict] = {}
    for cand in candidates:
        idle = notice_after_ms if cand is notice and notice_after_ms is not None else min_idle_ms
        try:
            run, (lo, hi), since = str(cand["run"]), (int(x) for x in cand["range"]), int(cand["since_ms"])
        except (KeyError, TypeError, ValueError):
            continue
        lo = max(lo, position)
        if run in record.counted or run in earlier or hi <= lo or run == committed_by:
            continue
        if now_ms - since >= idle:
            record = record.with_dead_run(run, lo, hi, since)
        else:
            earlier[run] = {"run": run, "range": [lo, hi], "since_ms": since}
    return Settled(record.passed(position), list(earlier.values())[:EARLIER_KEPT])


def bisect(ranges: dict[int, tuple[int, int]], records: dict[int, DeadRuns],
           max_retries: int) -> dict[int, tuple[int, int]]:
    """The ranges a run reads, narrowed where dead runs read before: from a dead run's start, the
    first half of its segment; from inside one, the rest of it; from a segment whose messages have
    used up their attempts, that segment (they only become dead letters, nothing else is read)."""
    out = {}
    for part, (start, end) in ranges.items():
        seg = records.get(part, DeadRuns()).at(start)
        if seg is not None:
            lo, hi, runs, _ = seg
            if runs > max_retries or start > lo:
                end = min(end, hi)
            else:
                end = min(end, start + max(1, (hi - start) // 2))
        out[part] = (start, end)
    return out


def used_up(runs: int, earlier_attempts: int, max_retries: int) -> bool:
    """Whether a message read by `runs` dead runs (and failed `earlier_attempts` times in the transform)
    has had its max_retries + 1 attempts: this run's read would be one more (Valkey: delivered more
    than max_retries + 1 times)."""
    return runs > 0 and runs + earlier_attempts + 1 > max_retries + 1


def transform_attempts(attempts: int, dead_runs: int) -> int:
    """What a culprit's retry record keeps: its attempts without the dead runs among them. The record
    next to the checkpoint still holds those runs (the partition is held at the culprit, so its
    segment is carried) and the next read adds them again; kept in both, each would count twice and
    the message would reach the DLQ before its max_retries + 1 attempts."""
    return max(0, attempts - dead_runs)


def dead_run_reason(runs: int, max_retries: int, segment: tuple[int, int, int, int], partition: int) -> str:
    lo, hi = segment[:2]
    return (f"read by {runs} drain runs that died or failed before committing (max_retries={max_retries}); a "
            f"message in partition {partition} offsets [{lo}, {hi}) stops every run that reads it (a crash, a hang "
            f"stopped at the task's execution_timeout, out of memory, a batch failure no single message explains)")
