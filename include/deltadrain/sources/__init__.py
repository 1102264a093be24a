"""The sources deltadrain drains: one package per kind, each behind the `Source` base below and the
capabilities only some kinds have (docs/sources.md says what a new one implements).

The shared steps (decode, stage, dead letters, the commit and its outcome, culprits, quality,
metrics, status, the view, replay and backfill) ask `source_of(pipeline)` and never which kind it
is. A kind's package is imported only when a pipeline of that kind is met: this module imports
nothing of them, and a sensor that asks a Valkey source never loads Kafka's client.
"""

from __future__ import annotations

import abc
import importlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from functools import cache, cached_property
from typing import TYPE_CHECKING

from deltadrain.errors import DeltadrainError

if TYPE_CHECKING:
    from pathlib import Path

    from deltadrain.config import DeltadrainConfig, PipelineConfig
    from deltadrain.config.lakeurl import LakeUrl
    from deltadrain.lake.checkpoint import Checkpoint
    from deltadrain.run.summary import RunSummary

__all__ = ["KINDS", "LakeSide", "NamesPartitions", "Probe", "Reaps", "Source", "SourceNote", "SuggestsGrants",
           "all_sources", "for_kind", "reaper_of", "source_of"]

# kind (the `source.kind` of the YAML) -> the module whose SOURCE implements it.
KINDS = {
    "valkey": "deltadrain.sources.valkey.source",
    "kafka": "deltadrain.sources.kafka.source",
}


class SourceNote(DeltadrainError):
    """The source answered, and what it says is for the operator to read rather than a failure to
    reach it (a topic not created yet, or recreated under the lake's checkpoint)."""


def _none() -> dict[str, int]:
    return {}


class LakeSide:
    """What the lake holds of a pipeline that a source's counts may read, each read only when asked
    for: the checkpoint (as the newest batch commit keeps it, or rebuilt from rows) and rows per
    partition (`status` counts them with Spark; the view, which reads with delta-rs, does not)."""

    def __init__(self, checkpoint: Callable[[], Checkpoint], published: Callable[[], dict[str, int]] = _none,
                 dead: Callable[[], dict[str, int]] = _none):
        self._checkpoint = checkpoint
        self.published = published  # target rows per partition
        self.dead = dead  # DEAD dead letters per partition

    @cached_property
    def checkpoint(self) -> Checkpoint:
        return self._checkpoint()


@dataclass
class Probe:
    """What a probe found at the source (deltadrain.observe.probe): is there work for a drain?"""

    pipeline: str
    new: int = 0
    reclaimable: int = 0
    idle_consumers: int = 0  # consumers with nothing pending, unseen for min_idle_ms: the reaper removes them
    partitions: dict = field(default_factory=dict)
    # A Kafka pipeline under `starting_offsets: latest` that no run has started yet: its first run
    # reads nothing but commits where the pipeline starts, so it must run before anything is "new".
    unstarted: bool = False
    gaps: int = 0

    @property
    def has_work(self) -> bool:
        return self.new > 0 or self.reclaimable > 0 or self.unstarted or self.gaps > 0

    def as_dict(self) -> dict:
        return {**asdict(self), "has_work": self.has_work}


class Source(abc.ABC):
    """One kind of source: what every kind answers. Every method takes the pipeline whose `source:`
    block is of this kind. What only some kinds can do is a capability below (`Reaps`,
    `NamesPartitions`, `SuggestsGrants`): a caller asks `isinstance(source, Reaps)`, never the kind."""

    kind: str  # the YAML's `source.kind`
    service: str  # its name in messages to the operator
    address_field: str  # the `source:` field naming its server (unset: the embedded service)
    ca_field: str  # the config key of the CA file its client trusts over TLS

    @abc.abstractmethod
    def reads(self, pipeline: PipelineConfig) -> list[str]:
        """What the pipeline reads, as the operator names it (stream keys, the topic)."""

    @abc.abstractmethod
    def address(self, cfg: DeltadrainConfig, pipeline: PipelineConfig) -> str:
        """host:port of the server, without anything else of its URL."""

    @abc.abstractmethod
    def connection_failure(self, exc: BaseException) -> tuple[str, str] | None:
        """(kind, the reason) when `exc` itself is a failure to reach this kind of server ("unreachable"),
        to log in to it ("login_refused"), a certificate it does not trust ("untrusted") or a command or
        resource its ACL denies the login ("denied");
        None for anything else."""

    @abc.abstractmethod
    def drain(self, cfg: DeltadrainConfig, pipeline: PipelineConfig, spark, run_id: str | None) -> RunSummary:
        """One drain run: the kind's `run.drain.Drain` subclass, whose `run` keeps the contract's order."""

    @abc.abstractmethod
    def read_interval(self, spark, cfg: DeltadrainConfig, pipeline: PipelineConfig, start: datetime,
                      end: datetime, scratch: Path | LakeUrl):
        """(claim-shaped rows of what the source retains of [start, end), [gaps it found]), claiming
        and acknowledging nothing (backfill)."""

    @abc.abstractmethod
    def read_places(self, spark, cfg: DeltadrainConfig, pipeline: PipelineConfig, places: list[tuple[str, str]],
                    scratch: Path | LakeUrl):
        """Claim-shaped rows of the retained messages at these (partition, position) (reprocess)."""

    @abc.abstractmethod
    def send_back(self, cfg: DeltadrainConfig, pipeline: PipelineConfig, entries: list[dict]) -> None:
        """Append dead letters' original bytes to their partitions, with the identity their copies
        need to land on the original's row (replay). Raises ReplayError when it sends nothing."""

    @abc.abstractmethod
    def replay_problem(self, pipeline: PipelineConfig, partition: str | None, positions: dict[str, str]
                       ) -> str | None:
        """What is wrong with a replay request's partition and positions (field name -> value) for this
        source, if anything."""

    @abc.abstractmethod
    def probe(self, cfg: DeltadrainConfig, pipeline: PipelineConfig) -> Probe:
        """Cheap reads only (no Spark, no claims): is there work for a drain?"""

    @abc.abstractmethod
    def counts(self, cfg: DeltadrainConfig, pipeline: PipelineConfig, lake: LakeSide, until: float | None = None,
               quick: bool = False) -> dict:
        """The lifecycle counts at the source (PENDING, CLAIMED, claimed_by, oldest_claim_idle_ms,
        partitions, gaps, and the ranges under suspicion as dead_runs or splits). `until`
        (time.monotonic()) bounds the calls together; `quick` gives up on a silent server in seconds."""

    @abc.abstractmethod
    def oldest_pending_ms(self, cfg: DeltadrainConfig, pipeline: PipelineConfig, counts: dict) -> int | None:
        """When the oldest message not in the lake yet was appended (epoch ms; None: none waits). `counts`:
        what `counts` just answered. Cheap reads only (the alerts check)."""

    @abc.abstractmethod
    def stale_after_ms(self, pipeline: PipelineConfig) -> int:
        """How long a claim (Valkey: a pending entry; Kafka: a claim notice) may sit before its run is
        taken for gone."""

    @abc.abstractmethod
    def stale_reason(self, after_ms: int) -> str:
        """Why a claim older than `after_ms` is stale, and what becomes of it."""

    @abc.abstractmethod
    def status_lines(self, status: dict) -> list[str]:
        """`deltadrain status`'s lines of this source's own (partitions, gaps, ranges under suspicion)."""


class Reaps(abc.ABC):
    """A source whose claims sit at the source until acknowledged (Valkey's pending list), so that the
    claims of runs that are gone wait for a reaper. A Kafka range is no lease: the next drain reads a
    failed run's offsets again, and there is nothing to reap."""

    @abc.abstractmethod
    def reap(self, cfg: DeltadrainConfig, pipeline: PipelineConfig) -> dict:
        """Take over the claims of runs that are gone, and remove consumers with nothing pending."""


class NamesPartitions(abc.ABC):
    """A source whose config names the partitions a message may come from (Valkey's stream keys; a
    topic's partition numbers are known to the broker only)."""

    @abc.abstractmethod
    def partition_names(self, pipeline: PipelineConfig) -> list[str]:
        """The partitions the pipeline's config names."""


class SuggestsGrants(abc.ABC):
    """A source whose denials do not name the grant that fixes them (a Kafka authorization error names
    the resource; a Valkey NOPERM answer names the command, which is fix enough)."""

    @abc.abstractmethod
    def acl_to_add(self, pipeline: PipelineConfig, reason: str) -> str | None:
        """For a "denied" reason, the grant that lets the pipeline's login do it, as the server's own
        tool takes it; None when it cannot tell."""


@cache
def for_kind(kind: str) -> Source:
    return importlib.import_module(KINDS[kind]).SOURCE


def source_of(pipeline: PipelineConfig) -> Source:
    return for_kind(pipeline.source.kind)


def all_sources() -> list[Source]:
    return [for_kind(kind) for kind in KINDS]


def reaper_of(pipeline: PipelineConfig) -> Reaps:
    """The pipeline's source, which must hold claims a reaper takes over (`Reaps`)."""
    source = source_of(pipeline)
    if not isinstance(source, Reaps):
        reaped = " and ".join(s.service for s in all_sources() if isinstance(s, Reaps))
        raise DeltadrainError(f"pipeline '{pipeline.name}' reads {source.service}; reap is for {reaped} pipelines "
                              f"only (a {source.service} drain holds no claims at the source: a failed run's "
                              "messages are read again by the next drain)")
    return source
