"""Triggers: wait for work at a source in the triggerer, not in a worker slot. `SourceWorkTrigger` resumes
the ingest DAG's deferred sensor (cron, `@continuous`); `SourceDataTrigger` is the AssetWatcher's of an
`on_data` pipeline, which marks the source's Assets when there is work."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Hashable
from typing import Any

from airflow.triggers.base import BaseEventTrigger, BaseTrigger, TriggerEvent


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


def work_seen(probe: dict, watch: list[str] | None = None) -> str | None:
    """The work a probe found in the watched partitions (all of them when `watch` is None), as a value that
    changes whenever that work does (new messages, a drain taking some, claims going stale); None when there
    is none. Gaps and a start not made yet belong to the whole pipeline, so every watcher sees them."""
    parts = probe.get("partitions") or {}
    keys = sorted(parts) if watch is None else [k for k in watch if k in parts]
    mine = {k: parts[k] for k in keys}
    pipeline_wide = {"gaps": probe.get("gaps", 0), "unstarted": bool(probe.get("unstarted"))}
    if watch is None:
        has = bool(probe.get("has_work"))
    else:
        has = any(p.get("new", 0) or p.get("reclaimable", 0) for p in mine.values()) \
            or pipeline_wide["gaps"] > 0 or pipeline_wide["unstarted"]
    return json.dumps({"partitions": mine, **pipeline_wide}, sort_keys=True) if has else None


def should_wake(seen: str | None, last: str | None, last_at: float | None, now: float,
                again_after: float) -> bool:
    """Whether the watcher marks the source's Asset now. Only for work it has not woken the DAG for yet: the
    same work seen again is the run already queued or draining it, and one event for it is enough (more
    events while a run goes on make at most one more run anyway: Airflow queues one per DAG and Asset).
    The same work still there `again_after` seconds later is a run that failed or never came: wake again."""
    if seen is None:
        return False
    if seen != last or last_at is None:
        return True
    return now - last_at >= again_after


class SourceDataTrigger(BaseEventTrigger):
    """An AssetWatcher's trigger (`schedule: on_data`): marks the source's Asset when the pipeline has work
    in the partitions it watches (`watch`: probe keys, such as a Valkey stream; None: all), once per change
    of that work (`should_wake`). It never ends: the watcher lives as long as the DAG schedules on it.

    Asset events only wake the ingest DAG; what a run drains comes from the lake's checkpoint and the source,
    never from an event. Its kwargs name the pipeline and the config file, never a login: the probe takes
    the credentials from the connections the config names, in the triggerer. The watchers of one pipeline
    share one probe loop (`shared_stream_key`), so a pipeline with many streams is probed once per poll."""

    def __init__(self, pipeline: str, config: str | None = None, poll_seconds: float = 10.0,
                 again_seconds: float = 240.0, watch: list[str] | None = None):
        super().__init__()
        self.pipeline, self.config, self.poll_seconds = pipeline, config, poll_seconds
        self.again_seconds, self.watch = again_seconds, watch

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}",
                {"pipeline": self.pipeline, "config": self.config, "poll_seconds": self.poll_seconds,
                 "again_seconds": self.again_seconds, "watch": self.watch})

    def shared_stream_key(self) -> Hashable | None:
        return ("deltadrain-probe", self.pipeline, self.config, self.poll_seconds)

    @classmethod
    async def open_shared_stream(cls, kwargs: dict[str, Any]) -> AsyncIterator[Any]:
        """One probe of the pipeline per poll, for every watcher of it: a probe's dict, or its failure."""
        from deltadrain.observe.probe import probe_named

        while True:
            try:
                yield await asyncio.to_thread(probe_named, kwargs["config"], kwargs["pipeline"])
            except Exception as exc:  # a source that is down is waited for; the next poll tries again
                yield {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            await asyncio.sleep(kwargs["poll_seconds"])

    async def filter_shared_stream(self, shared_stream: AsyncIterator[Any]) -> AsyncIterator[TriggerEvent]:
        last: str | None = None
        last_at: float | None = None
        async for found in shared_stream:
            if "error" in found:
                self.log.warning("deltadrain: probing %s failed (%s); retrying", self.pipeline, found["error"])
                continue
            seen, now = work_seen(found, self.watch), time.time()
            if should_wake(seen, last, last_at, now, self.again_seconds):
                last, last_at = seen, now
                # What the Asset event carries (its extra): counts, never a message or a login.
                yield TriggerEvent({"pipeline": self.pipeline, "watch": self.watch, "new": found.get("new", 0),
                                    "reclaimable": found.get("reclaimable", 0), "gaps": found.get("gaps", 0)})
            elif seen is None:
                last = None  # the work is done: the next work wakes the DAG at once

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Without the triggerer's shared streams (a test, an older triggerer): a probe loop of its own."""
        async for event in self.filter_shared_stream(type(self).open_shared_stream(self.serialize()[1])):
            yield event
