"""What a run reports: its summary line (printed by the callers, one row of the metrics table) and its id."""

from __future__ import annotations

import json
import os
import socket
import uuid
from dataclasses import asdict, dataclass, field

from deltadrain.run.outcome import Outcome


@dataclass
class RunSummary:
    pipeline: str
    run_id: str
    batch: int | None = None
    outcome: str = Outcome.EMPTY.value
    claimed: int = 0
    reclaimed: int = 0
    written: int = 0
    duplicates_skipped: int = 0
    dead_lettered: int = 0
    left_pending: int = 0
    # Valid messages the pipeline's transform kept no row for (it filtered them out): acknowledged,
    # in no table. So that claimed = written + duplicates_skipped + dead_lettered + left_pending + filtered
    # (on Valkey, plus entries deleted while pending; see filtered_out for a transform that explodes).
    filtered: int = 0
    acked: int = 0
    released: int = 0
    gaps: int = 0
    # Kafka: offsets retention deleted before they were read. Valkey: entries removed before the group
    # read them or while pending, as recorded and not yet carried by a commit (deltadrain.sources.valkey.gaps).
    gap_ranges: list = field(default_factory=list)
    # Kafka: offsets read by runs that died before committing, and how many (deltadrain.sources.kafka.crashes).
    # Valkey: the segment of entries runs died on that this run reads part of (valkey.crashes).
    # This run reads less there, and a message past max_retries + 1 attempts is a dead letter.
    dead_runs: list = field(default_factory=list)
    seconds: float = 0.0
    positions: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)  # seconds per step
    error: str | None = None

    def line(self) -> str:
        return json.dumps(asdict(self), default=str)


def new_run_id() -> str:
    return f"{socket.gethostname()[:20]}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
