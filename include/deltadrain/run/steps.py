"""What a source hands a drain run (`RunPlan`, `Gaps`), and the capabilities only some sources have,
as mixins of its `Drain` subclass: `Drain.run` asks `isinstance(self, Leases)` and the like, never
which kind it drains (docs/sources.md, "What a source implements").
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, TypeVar

from deltadrain.formats.registry import failure_line

if TYPE_CHECKING:
    from deltadrain.run.stage import Staged


# The source's own plan (Valkey: quotas per stream; Kafka: offset ranges), which only its steps read.
Detail = TypeVar("Detail")


@dataclass(frozen=True)
class RunPlan(Generic[Detail]):
    """What a source found before claiming (`Drain.plan`); the steps after it only read it."""

    start: dict[str, str]  # where the lake's checkpoint stands, in the source's terms: a run that commits nothing reports it
    # The checkpoint the batch's commit carries before the claim moves it on to the highest position
    # claimed in each partition (Kafka: each range's end, fixed before reading).
    positions: dict[str, str]
    claims: bool  # there is something to claim
    detail: Detail  # the source's own plan (quotas, offset ranges), for its later steps
    # A commit is due even without rows: the positions move without any (Kafka: a range holding no
    # readable record, the first run under `starting_offsets: latest`).
    commits_alone: bool = False


@dataclass(frozen=True)
class Gaps:
    """What the source lost before the pipeline read it (invariant 1), as a run reports it."""

    ranges: list = field(default_factory=list)  # as the summary and the commit metadata list them
    missing: int = 0  # the summary's count
    said: str = ""  # what a run that stops on them (on_gap: fail) says of them
    # The source's own record of them, field -> value as it keeps them (what a RecordsGaps source forgets).
    found: dict[str, str] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.ranges)


def no_message_to_blame(exc: BaseException) -> bool:
    """A claim that failed for a reason outside its messages (the schema registry is out)."""
    return failure_line(exc) is not None


class Leases(abc.ABC):
    """A source whose claims sit at the source until acknowledged (Valkey's pending entries). A run
    that stops without dying hands them back: the next run or the reaper takes them at once."""

    @abc.abstractmethod
    def release(self, staged: Staged) -> int:
        """Hand back what this run staged (an outcome not its own, a gap that stops it); how many."""

    @abc.abstractmethod
    def hand_back(self) -> int:
        """After a claim that failed with no message to blame: hand back every claim this run holds."""


class RecordsGaps(abc.ABC):
    """A source that keeps its gaps recorded at the source until a commit carries them (Valkey)."""

    @abc.abstractmethod
    def forget_gaps(self, gaps: Gaps) -> None:
        """After the commit that carried `gaps` (before anything is acknowledged)."""


class MirrorsCheckpoint(abc.ABC):
    """A source that keeps a copy of the lake's checkpoint for its own tools (Kafka's group offsets, for
    lag tools; never read back as truth). A run that commits nothing still brings it up to the lake:
    a run killed between its commit and its acknowledgement left it behind."""

    @abc.abstractmethod
    def mirror_checkpoint(self, positions: dict[str, str]) -> None:
        """Bring the copy up to `positions`, the lake's checkpoint."""


class Notices(abc.ABC):
    """A source that announces its claims at the source while it reads (Kafka's claim notices on the
    group offsets): they must have landed when a run ends, even as killed, for the next run to count it."""

    @abc.abstractmethod
    def settle_notices(self) -> None:
        """Wait (boundedly) for this run's notices to land."""
