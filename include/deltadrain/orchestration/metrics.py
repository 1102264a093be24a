"""A drain task's figures sent where Airflow sends its own metrics (docs/observability.md): through the
Task SDK's stats API, so that StatsD, Datadog or OpenTelemetry receive them as Airflow's `[metrics]`
section says (`statsd_on`, `statsd_datadog_enabled`, `otel_on`), and nothing is sent when none is on.
Which metrics a summary makes is deltadrain.observe.runmetrics' (pure); this module only sends them.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from deltadrain.observe.runmetrics import Metric, drain_metrics

__all__ = ["metrics_on", "send", "send_drain_metrics"]

log = logging.getLogger(__name__)


def metrics_on() -> bool:
    """Whether Airflow sends metrics anywhere: the lag is measured (a read of the source) only then."""
    from airflow.sdk import conf

    return any(conf.getboolean("metrics", key, fallback=False)
               for key in ("statsd_on", "statsd_datadog_enabled", "otel_on"))


def send(metrics: list[Metric]) -> None:
    """Each metric under its tagged name, and under its name with the tags as segments when Airflow's
    `[metrics] legacy_names_on` is (its default), as Airflow sends its own."""
    from airflow.sdk import conf
    from airflow.sdk.observability import stats

    legacy = conf.getboolean("metrics", "legacy_names_on", fallback=True)
    for m in metrics:
        for name, tags in ((m.name, m.tags), *([(m.legacy, {})] if legacy else [])):
            if m.kind == "count":
                stats.incr(name, count=int(m.value), tags=tags)
            elif m.kind == "gauge":
                stats.gauge(name, m.value, tags=tags)
            else:
                stats.timing(name, timedelta(seconds=m.value), tags=tags)


def send_drain_metrics(config: str | None, pipeline: str, summary: dict) -> None:
    """The metrics of a drain task that returned `summary`, with the lag measured after it. Best effort:
    a metric that cannot be sent never fails the task."""
    if not metrics_on():
        return
    try:
        from deltadrain.config import load_config
        from deltadrain.observe.alerts import measure_lag

        cfg = load_config(config)
        lag = measure_lag(cfg, cfg.pipeline(pipeline))
        send(drain_metrics(summary, lag))
    except Exception as exc:
        log.warning("deltadrain: could not send the metrics of %s's drain: %s", pipeline, exc)
