"""Sensors of the deltadrain DAGs."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue
from airflow.sdk.exceptions import AirflowSensorTimeout, AirflowSkipException

BACKFILL = "backfill"


def is_backfill(context) -> bool:
    run = context.get("dag_run")
    run_type = getattr(run, "run_type", None)
    # The Task SDK's DagRunType is a str Enum whose str() is its name, not its value: compare values.
    return getattr(run_type, "value", run_type) == BACKFILL


class SourceUnreachable(Exception):  # not an AirflowException: soft_fail would make it a skip
    """No probe of the source succeeded during the whole wait."""


class SourceWorkSensor(BaseSensorOperator):
    """Waits (deferred) until the pipeline's source has new messages, reclaimable claims or a gap to meet.

    A backfill run re-reads history instead of waiting for new data, so it passes at once. A source
    that cannot be probed counts as "no work yet": the sensor defers and the trigger keeps trying (or,
    not deferrable, it pokes on). If no probe succeeded by the timeout the run fails with the last
    error (a skip would hide an outage or a wrong password); a timeout with the source reached and
    nothing to do is a skip.
    """

    template_fields = ("pipeline",)

    def __init__(self, *, pipeline: str, config: str | None = None, poll_seconds: float = 10.0,
                 deferrable: bool = True, **kwargs):
        super().__init__(**kwargs)
        self.pipeline, self.config, self.poll_seconds = pipeline, config, poll_seconds
        self.deferrable = deferrable
        self._reached = False  # in mode "poke", whether a probe of this wait reached the source
        self._last_error: str | None = None

    def _probe(self) -> dict:
        from deltadrain.observe.probe import probe_named

        return probe_named(self.config, self.pipeline)

    def poke(self, context) -> PokeReturnValue:
        if is_backfill(context):
            return PokeReturnValue(True, {"status": BACKFILL})
        from deltadrain.errors import ConfigError

        try:
            found = self._probe()
        except ConfigError:
            raise  # waiting would not fix the config: fail the run now
        except Exception as exc:
            # A source that is down is waited for, as the trigger does, not a failed run.
            self.log.warning("deltadrain: probing %s failed (%s); waiting", self.pipeline, exc)
            self._last_error = f"{type(exc).__name__}: {str(exc)[:300]}"
            return PokeReturnValue(False)
        self._reached = True
        self.log.info("deltadrain: %s: %s new, %s reclaimable, %s in gaps", self.pipeline, found["new"],
                      found["reclaimable"], found["gaps"])
        return PokeReturnValue(found["has_work"], {"status": "work", "probe": found})

    def execute(self, context) -> Any:
        if not self.deferrable:
            self._reached, self._last_error = False, None
            try:
                return super().execute(context)
            except (AirflowSensorTimeout, AirflowSkipException):
                # Only in mode "poke" does this instance see every probe of the wait.
                if self._reached or self.mode != "poke":
                    raise
                raise self._unreachable(self._last_error) from None
        first = self.poke(context)
        if first:
            return first.xcom_value
        from deltadrain.orchestration.triggers import SourceWorkTrigger

        deadline = time.time() + self.timeout
        self.defer(trigger=SourceWorkTrigger(self.pipeline, self.config, self.poll_seconds, deadline),
                   method_name="execute_complete", timeout=timedelta(seconds=self.timeout + 60))

    def _unreachable(self, error: str | None) -> SourceUnreachable:
        return SourceUnreachable(f"could not probe the source of {self.pipeline} for {self.timeout:.0f}s; "
                                 f"last error: {error}")

    def execute_complete(self, context, event: dict | None = None) -> Any:
        said = event or {}
        if said.get("status") == "unreachable":
            raise self._unreachable(said.get("error"))
        if said.get("status") == "timeout":
            message = f"no new messages, stuck claims or gaps in {self.pipeline} within {self.timeout:.0f}s"
            if self.soft_fail:
                raise AirflowSkipException(message)
            raise AirflowSensorTimeout(message)
        self.log.info("deltadrain: %s: work found: %s", self.pipeline, said.get("probe"))
        return event


class StuckClaimsSensor(BaseSensorOperator):
    """Done when some Valkey pipeline holds claims older than its min_idle_ms (or consumers that are gone);
    returns those pipelines' names."""

    def __init__(self, *, config: str | None = None, **kwargs):
        super().__init__(**kwargs)
        self.config = config

    def poke(self, context) -> PokeReturnValue:
        from deltadrain.config import load_config
        from deltadrain.observe.probe import probe
        from deltadrain.sources import Reaps, source_of

        cfg = load_config(self.config)
        stuck = []
        for pipeline in cfg.pipelines:
            if isinstance(source_of(pipeline), Reaps):
                try:
                    found = probe(cfg, pipeline)
                except Exception as exc:  # one unreachable source must not stop the others' reaping
                    self.log.warning("deltadrain: probing %s failed (%s); its claims wait for the next run",
                                     pipeline.name, exc)
                    continue
                if found.reclaimable or found.idle_consumers:
                    self.log.info("deltadrain: %s holds %s stuck claims, %s idle consumers", pipeline.name,
                                  found.reclaimable, found.idle_consumers)
                    stuck.append(pipeline.name)
        return PokeReturnValue(bool(stuck), stuck)
