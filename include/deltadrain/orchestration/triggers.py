"""Deferrable triggers: wait for work at a source in the triggerer, not in a worker slot."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent


class SourceWorkTrigger(BaseTrigger):
    """Fires once the pipeline's source has new messages, claims old enough to reclaim, or a gap.

    The probe is a few cheap blocking reads (Valkey XINFO/XPENDING, Kafka watermarks); it runs in a
    thread so the triggerer's event loop keeps serving its other triggers.
    """

    def __init__(self, pipeline: str, config: str | None = None, poll_seconds: float = 10.0,
                 deadline: float | None = None):
        super().__init__()
        self.pipeline, self.config, self.poll_seconds = pipeline, config, poll_seconds
        self.deadline = deadline  # epoch seconds; the trigger ends itself there, whoever runs it

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}",
                {"pipeline": self.pipeline, "config": self.config, "poll_seconds": self.poll_seconds,
                 "deadline": self.deadline})

    def _probe(self) -> dict:
        from deltadrain.observe.probe import probe_named

        return probe_named(self.config, self.pipeline)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        reached, error = False, None
        while True:
            try:
                found = await asyncio.to_thread(self._probe)
            except Exception as exc:  # a source that is down is waited for, not a failed run
                self.log.warning("deltadrain: probing %s failed (%s); retrying", self.pipeline, exc)
                error = f"{type(exc).__name__}: {str(exc)[:300]}"
            else:
                reached = True
                if found["has_work"]:
                    yield TriggerEvent({"status": "work", "probe": found})
                    return
            if self.deadline is not None and time.time() >= self.deadline:
                # Never reached in the whole wait (down, or a refused login): that is not "no work".
                yield TriggerEvent({"status": "timeout"} if reached else {"status": "unreachable", "error": error})
                return
            await asyncio.sleep(self.poll_seconds)
