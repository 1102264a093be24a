"""The sources deltadrain drains: one package per kind, each behind the `Source` interface below
(docs/sources.md says what a new one implements).

The shared steps (decode, stage, dead letters, the commit and its outcome, culprits, quality,
metrics, status, the view, replay and backfill) ask `source_of(pipeline)` and never which kind it
is. A kind's package is imported only when a pipeline of that kind is met: this module imports
nothing of them, and a sensor that asks a Valkey source never loads Kafka's client.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from functools import cache, cached_property
from typing import TYPE_CHECKING, Protocol

from deltadrain.errors import DeltadrainError

if TYPE_CHECKING:
    from pathlib import Path

    from deltadrain.config import DeltadrainConfig, PipelineConfig
    from deltadrain.lake.checkpoint import Checkpoint
    from deltadrain.run.drain import RunSummary

__all__ = ["KINDS", "LakeSide", "Probe", "Source", "SourceNote", "all_sources", "for_kind", "source_of"]

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


class Source(Protocol):
    """One kind of source. Every method takes the pipeline whose `source:` block is of this kind."""

    kind: str  # the YAML's `source.kind`
    service: str  # its name in messages to the operator
    address_field: str  # the `source:` field naming its server (unset: the embedded service)
    ca_field: str  # the config key of the CA file its client trusts over TLS
    holds_claims: bool  # claims sit at the source until acknowledged, so a reaper has work

    def reads(self, pipeline: PipelineConfig) -> list[str]:
        """What the pipeline reads, as the operator names it (stream keys, the topic)."""

    def partition_names(self, pipeline: PipelineConfig) -> list[str] | None:
        """The partitions a message may come from, when the config names them (None: not known
        from the config, as a topic's partition numbers)."""

    def address(self, cfg: DeltadrainConfig, pipeline: PipelineConfig) -> str:
        """host:port of the server, without anything else of its URL."""

    def connection_failure(self, exc: BaseException) -> tuple[str, str] | None:
        """(kind, the reason) when `exc` itself is a failure to reach this kind of server ("unreachable"),
        to log in to it ("login_refused"), a certificate it does not trust ("untrusted") or a command or
        resource its ACL denies the login ("denied");
        None for anything else."""

    def acl_to_add(self, pipeline: PipelineConfig, reason: str) -> str | None:
        """For a "denied" reason, the grant that lets the pipeline's login do it, as the server's own
        tool takes it; None when the reason names it well enough (a Valkey ACL's command)."""

    def drain(self, cfg: DeltadrainConfig, pipeline: PipelineConfig, spark, run_id: str | None) -> RunSummary:
        """One drain run: claim a batch, the shared publish, acknowledge."""

    def read_interval(self, spark, cfg: DeltadrainConfig, pipeline: PipelineConfig, start: datetime,
                      end: datetime, scratch: Path):
        """(claim-shaped rows of what the source retains of [start, end), [gaps it found]), claiming
        and acknowledging nothing (backfill)."""

    def read_places(self, spark, cfg: DeltadrainConfig, pipeline: PipelineConfig, places: list[tuple[str, str]],
                    scratch: Path):
        """Claim-shaped rows of the retained messages at these (partition, position) (reprocess)."""

    def send_back(self, cfg: DeltadrainConfig, pipeline: PipelineConfig, entries: list[dict]) -> None:
        """Append dead letters' original bytes to their partitions, with the identity their copies
        need to land on the original's row (replay). Raises ReplayError when it sends nothing."""

    def replay_problem(self, pipeline: PipelineConfig, partition: str | None, positions: dict[str, str]
                       ) -> str | None:
        """What is wrong with a replay request's partition and positions (field name -> value) for this
        source, if anything."""

    def probe(self, cfg: DeltadrainConfig, pipeline: PipelineConfig) -> Probe:
        """Cheap reads only (no Spark, no claims): is there work for a drain?"""

    def counts(self, cfg: DeltadrainConfig, pipeline: PipelineConfig, lake: LakeSide, until: float | None = None,
               quick: bool = False) -> dict:
        """The lifecycle counts at the source (PENDING, CLAIMED, claimed_by, oldest_claim_idle_ms,
        partitions, gaps, and the ranges under suspicion as dead_runs or splits). `until`
        (time.monotonic()) bounds the calls together; `quick` gives up on a silent server in seconds."""

    def oldest_pending_ms(self, cfg: DeltadrainConfig, pipeline: PipelineConfig, counts: dict) -> int | None:
        """When the oldest message not in the lake yet was appended (epoch ms; None: none waits). `counts`:
        what `counts` just answered. Cheap reads only (the alerts check)."""

    def stale_after_ms(self, pipeline: PipelineConfig) -> int:
        """How long a claim may sit before its run is taken for gone."""

    def stale_reason(self, after_ms: int) -> str:
        """Why a claim older than `after_ms` is stale, and what becomes of it."""

    def status_lines(self, status: dict) -> list[str]:
        """`deltadrain status`'s lines of this source's own (partitions, gaps, ranges under suspicion)."""

    def reap(self, cfg: DeltadrainConfig, pipeline: PipelineConfig) -> dict:
        """Take over claims of runs that are gone (holds_claims sources); others explain why not."""


@cache
def for_kind(kind: str) -> Source:
    return importlib.import_module(KINDS[kind]).SOURCE


def source_of(pipeline: PipelineConfig) -> Source:
    return for_kind(pipeline.source.kind)


def all_sources() -> list[Source]:
    return [for_kind(kind) for kind in KINDS]
