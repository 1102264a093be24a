"""The alerts check's decisions (pure), its config, and where the ingest DAG puts its task."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from deltadrain.errors import ConfigError
from deltadrain.observe.alerts import (
    AlertBreached,
    age_finding,
    dead_rise_finding,
    lag_finding,
    raise_if_breached,
    verdict,
)
from tests.support.pipelines import alerts_config

NOW_MS = int(datetime(2026, 5, 1, 12, 0, tzinfo=UTC).timestamp() * 1000)


def test_lag_above_the_threshold_fails_with_the_figure_and_at_it_passes():
    over = lag_finding(1201, 1000)
    assert over.breached and (over.figure, over.threshold) == (1201, 1000)
    assert over.text == "lag 1,201 messages above the threshold 1,000 (alerts.max_lag)"
    assert not lag_finding(1000, 1000).breached and not lag_finding(0, 0).breached
    assert lag_finding(1, 0).breached


def test_a_lag_that_cannot_be_measured_fails_and_says_why():
    unknown = lag_finding(None, 10, "Valkey at 127.0.0.1:6399 cannot be reached")
    assert unknown.breached and unknown.figure is None
    assert unknown.text == "lag unknown (threshold 10): Valkey at 127.0.0.1:6399 cannot be reached"


def test_the_oldest_pending_message_older_than_the_threshold_fails():
    limit = timedelta(minutes=15)
    old = age_finding(NOW_MS - 16 * 60_000 - 5_000, NOW_MS, limit, lag=3)
    assert old.breached and (old.figure, old.threshold) == (965.0, 900.0)
    assert old.text.startswith("oldest pending message appended 16 min 5 s ago (2026-05-01 11:43:55 UTC), older than "
                               "the threshold 15 min")
    assert not age_finding(NOW_MS - 15 * 60_000, NOW_MS, limit, lag=3).breached  # at it: within
    # Nothing waiting is age 0 whatever the source said; a clock ahead of ours is no negative age.
    assert not age_finding(None, NOW_MS, limit, lag=0).breached and age_finding(None, NOW_MS, limit, lag=0).figure == 0
    assert age_finding(NOW_MS + 5_000, NOW_MS, limit, lag=1).figure == 0
    unknown = age_finding(None, NOW_MS, limit, lag=None, why_unknown="broker down")
    assert unknown.breached and unknown.text.endswith("broker down")


def test_dead_letters_rising_by_more_than_the_threshold_fail_and_a_replay_lowers_the_count():
    rose = dead_rise_finding(12, 4, 5)
    assert rose.breached and rose.figure == 8
    assert rose.text == ("DEAD dead letters rose by +8 since the previous check (4 -> 12), above the threshold 5 "
                         "(alerts.max_dead_rise)")
    assert not dead_rise_finding(9, 4, 5).breached  # +5: at the threshold
    assert dead_rise_finding(1, 0, 0).breached  # 0: any new dead letter
    replayed = dead_rise_finding(0, 7, 0)
    assert not replayed.breached and replayed.figure == -7 and "changed by -7" in replayed.text


def test_the_verdict_names_every_breached_threshold_and_none_when_all_pass():
    findings = [lag_finding(50, 10), dead_rise_finding(3, 3, 0), age_finding(NOW_MS - 120_000, NOW_MS,
                                                                             timedelta(minutes=1), lag=50)]
    message = verdict("orders", findings)
    assert message.startswith("pipeline 'orders': 2 alert(s): lag 50 messages above the threshold 10")
    assert "older than the threshold 1 min" in message and "DEAD" not in message
    with pytest.raises(AlertBreached, match="2 alert"):
        raise_if_breached({"failure": message})
    assert verdict("orders", [lag_finding(5, 10), dead_rise_finding(3, 3, 0)]) is None
    raise_if_breached({"failure": None})


def test_thresholds_are_typed_per_pipeline_and_off_unless_set(tmp_path):
    cfg = alerts_config(tmp_path, {"max_lag": 5000, "max_pending_age": "PT15M", "max_dead_rise": 0})
    orders, clicks = cfg.pipelines[0], cfg.pipelines[1]
    assert (orders.alerts.max_lag, orders.alerts.max_pending_age, orders.alerts.max_dead_rise) == (
        5000, timedelta(minutes=15), 0)
    assert orders.alerts.enabled and not clicks.alerts.enabled
    for bad, field, why in (({"max_lag": -1}, "alerts.max_lag", "greater than or equal to 0"),
                            ({"max_pending_age": "PT0S"}, "alerts.max_pending_age", "positive duration"),
                            ({"max_dead_rises": 1}, "alerts.max_dead_rises", "Extra inputs")):
        with pytest.raises(ConfigError, match=f"pipeline 'orders', field '{field}': .*{why}"):
            alerts_config(tmp_path, bad)


def test_the_alerts_task_follows_the_drain_whatever_became_of_it_and_only_where_thresholds_are_set(tmp_path):
    from deltadrain.orchestration.factory import ingest_dag

    cfg = alerts_config(tmp_path, {"max_lag": 10})
    dag = ingest_dag(cfg, cfg.pipelines[0])
    alerts = dag.get_task("alerts")
    assert alerts.upstream_task_ids == {"drain"} and alerts.trigger_rule == "all_done"
    assert (alerts.pool, alerts.retries, alerts.pipeline) == ("default_pool", 0, "orders")
    assert "`alerts`, after the drain whatever became of it" in dag.doc_md
    other = ingest_dag(cfg, cfg.pipelines[1])
    assert "alerts" not in other.task_ids and "`alerts`" not in other.doc_md


def test_the_alerts_task_fails_without_retry_naming_the_figures_and_returns_them_when_within(monkeypatch, tmp_path):
    from airflow.sdk.exceptions import AirflowFailException

    from deltadrain.observe import alerts as module
    from deltadrain.orchestration.operators import AlertsOperator

    cfg = alerts_config(tmp_path, {"max_dead_rise": 0})
    started = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
    seen = {}

    def fake_check(c, p, since, now=None):
        seen["since"] = since
        finding = dead_rise_finding(seen["dead"], 1, 0)
        return {"findings": [finding.as_dict()], "failure": verdict(p.name, [finding])}

    monkeypatch.setattr(module, "check", fake_check)
    op = AlertsOperator(task_id="alerts", pipeline="orders", config=str(cfg.source_file))
    ctx = {"dag_run": SimpleNamespace(start_date=started)}
    seen["dead"] = 3
    with pytest.raises(AirflowFailException, match=r"DEAD dead letters rose by \+2 .* above the threshold 0"):
        op.execute(ctx)
    assert seen["since"] == started  # the DLQ as of this run's start: what the previous check saw
    seen["dead"] = 1
    assert op.execute(ctx)["failure"] is None
