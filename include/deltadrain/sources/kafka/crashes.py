"""Kafka: the runs that died reading a range (invariant 6; the rule itself is `isolation`'s).

Valkey counts a delivery for every entry a run claims; Kafka has no delivery count. What a dead run
leaves is its claim notice on the group offset (`kafka.offsets.announce_claims`): its run id, the
range it read, since when, and how many offsets the whole run read (`width`). The next run counts
it: every offset of that range at or after the lake's checkpoint gets one dead run, and where the run
read that one offset and nothing else, one death alone. The count is kept per partition as segments
[start, end, runs, first_ms] plus the alone deaths per offset, in the next run's notices and in its
commit metadata next to the checkpoint, so it survives any number of dead runs and no side file holds
it. From it:

- bisection (`bisect`): a run whose start in a partition lies in a segment reads only that partition,
  as `isolation.read_width` says: from the segment's start its first half, from inside it (a first
  half committed) the rest of it. Other partitions wait for the next run, so that a run that dies is
  narrowed to the one range it read;
- a message is dead for dying only as `isolation.convicted` says: alone in max_retries runs that
  died (its transform failures count with them). It is then a `max_retries` dead letter, not decoded.
  Runs that died holding it among others never count.

A notice younger than min_idle_ms may be a slow run's, not a dead one's (the Valkey reaper's rule
for idle entries): it is carried in this run's notice as `earlier` and counted by a later run once it
is old enough and the lake has not passed it. Everything here is pure.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from deltadrain.run.isolation import death_reason, read_width

COUNTED_KEPT = 8  # run ids remembered per partition, so that a notice is never counted twice
EARLIER_KEPT = 4  # young notices carried forward per partition


@dataclass(frozen=True)
class DeadRuns:
    """One partition's record: disjoint [start, end) segments, each read by `runs` runs that died
    (the first of them announced at `first_ms`); `alone`: (offset, deaths) of the offsets runs died
    reading alone; and the ids of the runs counted."""

    segments: tuple[tuple[int, int, int, int], ...] = ()
    counted: tuple[str, ...] = ()
    alone: tuple[tuple[int, int], ...] = ()

    def as_json(self, earlier: list[dict] | None = None) -> dict:
        out = {"seg": [list(s) for s in self.segments], "counted": list(self.counted)}
        if self.alone:
            out["alone"] = [list(a) for a in self.alone]
        if earlier:
            out["earlier"] = earlier
        return out

    @classmethod
    def from_json(cls, data) -> DeadRuns:
        """A record as as_json() wrote it; anything else (another version's, damaged) is no record."""
        try:
            segments = tuple(sorted((int(a), int(b), int(n), int(f)) for a, b, n, f in data.get("seg", [])))
            alone = tuple(sorted((int(o), int(n)) for o, n in data.get("alone", []) if int(n) > 0))
            return cls(tuple(s for s in segments if s[0] < s[1] and s[2] > 0),
                       tuple(str(r) for r in data.get("counted", [])), alone)
        except (AttributeError, TypeError, ValueError):
            return cls()

    def __bool__(self) -> bool:
        return bool(self.segments)

    def at(self, offset: int) -> tuple[int, int, int, int] | None:
        return next((s for s in self.segments if s[0] <= offset < s[1]), None)

    def runs_at(self, offset: int) -> int:
        seg = self.at(offset)
        return seg[2] if seg else 0

    def alone_at(self, offset: int) -> int:
        return dict(self.alone).get(offset, 0)

    def with_dead_run(self, run: str, start: int, end: int, since_ms: int, alone: bool = False) -> DeadRuns:
        """One more run that died reading [start, end): each offset there counts one more; `alone`:
        that run read the one offset `start` and nothing else (in no other partition either)."""
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
        deaths = dict(self.alone)
        if alone and end - start == 1:
            deaths[start] = deaths.get(start, 0) + 1
        return DeadRuns(tuple(pieces), (*self.counted, run)[-COUNTED_KEPT:], tuple(sorted(deaths.items())))

    def merged(self, other: DeadRuns) -> DeadRuns:
        """Both records' knowledge: per offset the larger count (a dead run is never counted twice)."""
        counts = dict(self.alone)
        for offset, n in other.alone:
            counts[offset] = max(n, counts.get(offset, 0))
        alone = tuple(sorted(counts.items()))
        if not other.segments:
            return DeadRuns(self.segments, _union(self.counted, other.counted), alone)
        cuts = sorted({x for s in (*self.segments, *other.segments) for x in s[:2]})
        pieces = []
        for lo, hi in zip(cuts, cuts[1:], strict=False):
            got = [s for s in (self.at(lo), other.at(lo)) if s]
            if got:
                best = max(got, key=lambda s: (s[2], -s[3]))
                pieces.append((lo, hi, best[2], min(s[3] for s in got)))
        return DeadRuns(tuple(pieces), _union(self.counted, other.counted), alone)

    def passed(self, position: int) -> DeadRuns:
        """Without the segments wholly behind the checkpoint: their messages are published or dead, and
        their deaths are forgotten. A segment the checkpoint is inside of stays whole, so that a later
        run knows it starts inside."""
        kept = tuple(s for s in self.segments if s[1] > position)
        alone = tuple(a for a in self.alone if a[0] >= position)
        return DeadRuns(kept, self.counted if kept else (), alone if kept else ())


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
            width = int(cand.get("width") or 0)
        except (KeyError, TypeError, ValueError):
            continue
        lo = max(lo, position)
        if run in record.counted or run in earlier or hi <= lo or run == committed_by:
            continue
        if now_ms - since >= idle:
            record = record.with_dead_run(run, lo, hi, since, alone=width == 1)
        else:
            earlier[run] = {"run": run, "range": [lo, hi], "since_ms": since, "width": width}
    return Settled(record.passed(position), list(earlier.values())[:EARLIER_KEPT])


def bisect(ranges: dict[int, tuple[int, int]], records: dict[int, DeadRuns]) -> dict[int, tuple[int, int]]:
    """The ranges a run reads. Where no dead run read before, all of them. Else only the first partition
    (in partition order) whose start lies in a segment, as `isolation.read_width` says: from the
    segment's start its first half, from inside it (a first part committed) the rest of it. Reading
    nothing else, a run that dies is counted against that one range, and one that reads a single
    offset and dies is a death alone."""
    for part, (start, end) in sorted(ranges.items()):
        seg = records.get(part, DeadRuns()).at(start)
        if seg is None:
            continue
        lo, hi, runs, _ = seg
        width = min(end, hi) - start
        return {part: (start, start + read_width(width, runs, inside=start > lo))}
    return dict(ranges)


def suspects(records: dict[int, DeadRuns]) -> list[dict]:
    """The ranges under suspicion, for the run summary, status and the view: per segment its offsets,
    the runs that died reading it, and the most deaths alone of one of its offsets."""
    return [{"partition": q, "offsets": [lo, hi], "runs": n, "alone": max((a for o, a in r.alone if lo <= o < hi),
                                                                          default=0)}
            for q, r in sorted(records.items()) for lo, hi, n, _ in r.segments]


def transform_attempts(attempts: int, dead_runs: int) -> int:
    """What a culprit's retry record keeps: its attempts without the dead runs among them. The record
    next to the checkpoint still holds those runs (the partition is held at the culprit, so its
    segment is carried) and the next read adds them again; kept in both, each would count twice."""
    return max(0, attempts - dead_runs)


def dead_run_reason(alone_deaths: int, max_retries: int, offset: int, partition: int) -> str:
    return death_reason(alone_deaths, max_retries, f"partition {partition} offset {offset}")
