"""A third kind of source that lives in memory, for the unit tests of `Drain.run`'s order only.

`ToyQueue` holds partitions of messages (position 1, 2, ... in each) and what a drain did to them;
`ToyLake` records commits with their batch number, positions and messages, and can be told to answer
the next commit with another outcome (a neighbour ahead, a conflict, a restored table). Two toy drains
supply the steps the way the real kinds do:

- `LeasingDrain` (as Valkey): claims are leases held at the source (`Leases`); it acknowledges the
  messages of the batch one by one, and a culprit stays pending;
- `RangeDrain` (as Kafka): it reads a range from the lake's checkpoint, and acknowledging moves a
  cursor that mirrors the checkpoint (`MirrorsCheckpoint`); a culprit holds its partition.

Both stand in `read_checkpoint`, `publish` and `record_metrics`, the methods that need Spark and the
lake; everything else is the real `Drain.run`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from deltadrain.lake.checkpoint import Checkpoint
from deltadrain.run.commit import CommitResult
from deltadrain.run.drain import Drain
from deltadrain.run.outcome import Outcome
from deltadrain.run.stage import Tally
from deltadrain.run.steps import Gaps, Leases, MirrorsCheckpoint, RunPlan

Key = tuple[str, str]  # (partition, position)


@dataclass
class Commit:
    batch: int
    run_id: str
    positions: dict[str, str]
    keys: list[Key]


@dataclass
class ToyLake:
    """The target table: commits in order, each with the batch it carries."""

    commits: list[Commit] = field(default_factory=list)
    answer: Outcome | None = None  # the next commit's outcome, when not its own
    poison: set[Key] = field(default_factory=set)  # messages whose transform fails (culprits)

    def checkpoint(self) -> Checkpoint:
        if not self.commits:
            return Checkpoint(0)
        last = self.commits[-1]
        return Checkpoint(last.batch, dict(last.positions), found_in="commit")

    def published(self) -> set[Key]:
        return {key for c in self.commits for key in c.keys}

    def commit(self, expected: int, run_id: str, positions: dict[str, str], keys: list[Key]) -> CommitResult:
        answer, self.answer = self.answer, None
        at = self.checkpoint().batch
        if answer == Outcome.AHEAD:  # a neighbour committed this batch first
            self.commits.append(Commit(expected + 1, "neighbour", dict(positions), []))
            return CommitResult(Outcome.AHEAD, expected + 1, len(self.commits), 0)
        if answer in (Outcome.CONFLICT, Outcome.MISMATCH):
            return CommitResult(answer, at, len(self.commits), 0, conflict="toy" if answer == Outcome.CONFLICT else None)
        if at != expected:  # the compare-and-set the real commit makes
            return CommitResult(Outcome.AHEAD if at > expected else Outcome.MISMATCH, at, len(self.commits), 0)
        fresh = [k for k in keys if k not in self.published()]  # the MERGE on the message id
        self.commits.append(Commit(expected + 1, run_id, dict(positions), fresh))
        return CommitResult(answer or Outcome.COMMITTED, expected + 1, len(self.commits), len(fresh))


@dataclass
class ToyBatch:
    """What a toy claim stages: the messages, and what `Drain.run` reads of a staged batch."""

    keys: list[Key]

    @property
    def total(self) -> Tally:
        return Tally(rows=len(self.keys))

    @property
    def positions(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for part, pos in self.keys:
            out[part] = str(max(int(pos), int(out.get(part, 0))))
        return out


class ToyQueue:
    """The source: partition -> message count, and what runs did to the messages."""

    def __init__(self, lake: ToyLake, partitions: dict[str, int]):
        self.lake = lake
        self.sizes = dict(partitions)
        self.claims: dict[Key, str] = {}  # leases: message -> the run holding it
        self.acked: set[Key] = set()  # leases: acknowledged one by one
        self.cursor: dict[str, int] = {}  # ranges: partition -> next position to read, as acknowledged
        self.lost: list[dict] = []  # gaps: ranges deleted before anyone read them
        self.early: list[Key] = []  # acknowledged before a commit held them (invariant 4)
        self.released: list[Key] = []

    def append(self, partition: str, n: int) -> None:
        self.sizes[partition] = self.sizes.get(partition, 0) + n

    def keys(self, partition: str, after: int = 0, upto: int | None = None) -> list[Key]:
        last = self.sizes.get(partition, 0) if upto is None else upto
        return [(partition, str(pos)) for pos in range(after + 1, last + 1)]

    def acknowledge(self, keys: list[Key]) -> None:
        self.early += [k for k in keys if k not in self.lake.published()]
        self.acked |= set(keys)

    def acknowledged(self) -> set[Key]:
        """What the source takes as done: acknowledged leases, or everything below the cursor."""
        return self.acked | {k for part, nxt in self.cursor.items() for k in self.keys(part, 0, nxt - 1)}


class ToyDrain(Drain):
    """What both toy kinds share: the lake and Spark stood in, and the steps every kind must supply."""

    def __init__(self, cfg, pipeline, queue: ToyQueue, run_id: str | None = None):
        super().__init__(cfg, pipeline, spark=None, run_id=run_id)
        self.queue = queue
        self.finished = False
        self.metrics: list[dict] = []

    def read_checkpoint(self) -> Checkpoint:
        return self.queue.lake.checkpoint()

    def publish(self, staged: ToyBatch | None, expected: int):
        keys = list(staged.keys) if staged is not None else []
        culprits = [k for k in keys if k in self.queue.lake.poison]
        _, pending = self.settle_culprits(culprits) if culprits else (None, [])
        keys = self.before_held([k for k in keys if k not in pending])
        result = self.queue.lake.commit(expected, self.run_id, dict(self.summary.positions), keys)
        self.summary.outcome = result.outcome.value
        self.summary.written = result.inserted
        return result, pending

    def record_metrics(self) -> None:
        self.metrics.append({"outcome": self.summary.outcome, "acked": self.summary.acked})

    def gaps(self, plan: RunPlan, staged: ToyBatch | None) -> Gaps:
        lost = self.queue.lost
        return Gaps(list(lost), sum(g["missing"] for g in lost), f"the toy lost {len(lost)} ranges")

    def originals(self, keys: list[Key]) -> dict[Key, bytes]:
        return {k: f"{k[0]}:{k[1]}".encode() for k in keys}

    def finish(self) -> None:
        self.finished = True


class LeasingDrain(Leases, ToyDrain):
    """Claims are leases: a run claims every message not acknowledged, up to the batch cap (another
    run's lease counts as expired at once, as with min_idle_ms 0)."""

    def plan(self, checkpoint: Checkpoint) -> RunPlan:
        free = [k for part in sorted(self.queue.sizes) for k in self.queue.keys(part) if k not in self.queue.acked]
        return RunPlan(start=checkpoint.positions, positions=checkpoint.positions, claims=bool(free),
                       detail=free[:self.pipeline.batch_cap])

    def claim(self, plan: RunPlan) -> ToyBatch:
        for key in plan.detail:
            self.queue.claims[key] = self.run_id
        return ToyBatch(list(plan.detail))

    def acknowledge(self, plan: RunPlan, staged: ToyBatch | None, keep: frozenset[Key]) -> int:
        done = [k for k in (staged.keys if staged is not None else []) if k not in keep]
        self.queue.acknowledge(done)
        for key in done:
            self.queue.claims.pop(key, None)
        return len(done)

    def settle_culprits(self, culprits):
        return [], list(culprits)  # left pending for redelivery, as on Valkey

    def release(self, staged: ToyBatch) -> int:
        mine = [k for k in staged.keys if self.queue.claims.get(k) == self.run_id]
        for key in mine:
            del self.queue.claims[key]
        self.queue.released += mine
        return len(mine)

    def hand_back(self) -> int:
        mine = [k for k, run in self.queue.claims.items() if run == self.run_id]
        return self.release(ToyBatch(mine))


class RangeDrain(MirrorsCheckpoint, ToyDrain):
    """Reads a range per partition from the lake's checkpoint; the cursor mirrors the checkpoint."""

    def plan(self, checkpoint: Checkpoint) -> RunPlan:
        start = {part: checkpoint.positions.get(part, "0") for part in sorted(self.queue.sizes)}
        cap, ranges = self.pipeline.batch_cap, {}
        for part, pos in start.items():
            take = min(cap, self.queue.sizes[part] - int(pos))
            if take > 0:
                ranges[part] = (int(pos), int(pos) + take)
                cap -= take
        ends = {**start, **{part: str(end) for part, (_, end) in ranges.items()}}
        return RunPlan(start=start, positions=ends, claims=bool(ranges), commits_alone=bool(ranges), detail=ranges)

    def claim(self, plan: RunPlan) -> ToyBatch:
        return ToyBatch([k for part, (lo, hi) in plan.detail.items() for k in self.queue.keys(part, lo, hi)])

    def acknowledge(self, plan: RunPlan, staged: ToyBatch | None, keep: frozenset[Key]) -> int:
        before = self.queue.acknowledged()
        self.mirror_checkpoint(self.summary.positions)
        return len(self.queue.acknowledged() - before)

    def mirror_checkpoint(self, positions: dict[str, str]) -> None:
        # Here positions are the last position committed; the cursor is the next one to read.
        moved = {part: int(pos) + 1 for part, pos in positions.items()}
        self.queue.early += [k for part, nxt in moved.items() for k in self.queue.keys(part, 0, nxt - 1)
                             if k not in self.queue.lake.published()]
        self.queue.cursor.update(moved)

    def settle_culprits(self, culprits):
        """A culprit holds its partition: the checkpoint stays before it, nothing from it on commits."""
        s = self.summary
        self.held = {}
        for part, pos in culprits:
            self.held[part] = min(int(pos), self.held.get(part, int(pos)))
            s.positions[part] = str(self.held[part] - 1)
        return [], list(culprits)

    def before_held(self, keys):
        held = getattr(self, "held", {})
        return [k for k in keys if k[0] not in held or int(k[1]) < held[k[0]]]


KINDS = {"leasing": LeasingDrain, "ranges": RangeDrain}
