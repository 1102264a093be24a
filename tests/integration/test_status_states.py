"""`deltadrain status`, `dlq list` and `metrics` read the lake with delta-rs and start no JVM (each runs
here with pyspark made unimportable), and the states a pipeline or its source is in read as notes,
in the CLI and in the view's data: a pipeline never run, a stream never written, a topic not created
yet, a server that cannot be reached."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

from deltadrain.config import load_config
from tests.conftest import free_port
from tests.support.lake import dlq_rows, target_ids
from tests.support.pipelines import ROOT
from tests.support.valkey import drain_until_done, make_pipeline

# The CLI with pyspark (and py4j) unimportable: any path that would start a Spark JVM fails instead.
NO_SPARK = ("import sys; sys.modules['pyspark'] = None; sys.modules['py4j'] = None; "
            "from deltadrain.cli import main; sys.exit(main(sys.argv[1:]))")


def cli_without_spark(config: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", NO_SPARK, "--config", str(config), *args], capture_output=True,
                          text=True, env={**os.environ, **(env or {})}, cwd=ROOT, timeout=120)


def as_json(done: subprocess.CompletedProcess):
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.fixture
def fresh(tmp_path):
    """A config with a Valkey pipeline whose streams were never written and a Kafka pipeline whose
    topic does not exist, neither run: (path, cfg, valkey pipeline, kafka pipeline)."""
    data = yaml.safe_load((ROOT / "config" / "pipelines.yaml").read_text())
    tag = uuid.uuid4().hex[:8]
    valkey = next(p for p in data["pipelines"] if p["source"]["kind"] == "valkey")
    kafka = next(p for p in data["pipelines"] if p["source"]["kind"] == "kafka")
    valkey.update(name=f"v_{tag}", target={"path": f"v_{tag}"})
    valkey["source"]["streams"] = [f"v_{tag}:{{0}}", f"v_{tag}:{{1}}"]
    kafka.update(name=f"k_{tag}", target={"path": f"k_{tag}"})
    kafka["source"].update(topic=f"k_{tag}", group=f"k_{tag}-group")
    data["data_dir"] = str(tmp_path / "lake")
    path = tmp_path / "pipelines.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    cfg = load_config(path)
    return path, cfg, cfg.pipeline(f"v_{tag}"), cfg.pipeline(f"k_{tag}")


def states(notes: list[dict]) -> list[str]:
    return [n["state"] for n in notes]


def test_status_dlq_and_metrics_of_pipelines_never_run_say_so_in_notes_without_spark(fresh, valkey_server,
                                                                                     kafka_broker, tmp_path):
    path, _, valkey, kafka = fresh
    st = as_json(cli_without_spark(path, "status", valkey.name, "--json"))
    assert states(st["notes"]) == ["never_run", "never_written"]
    assert (st["PENDING"], st["CLAIMED"], st["PUBLISHED"], st["DEAD"], st["checkpoint"]["batch"]) == (0, 0, 0, 0, 0)
    assert f"streams {valkey.source.streams[0]}, {valkey.source.streams[1]} have never been written" in st["notes"][1]["note"]
    # The command it prints carries the config it ran with: pasted anywhere, it drains this pipeline.
    assert f"deltadrain --config {path} drain {valkey.name}`" in st["notes"][0]["note"]

    st = as_json(cli_without_spark(path, "status", kafka.name, "--json"))
    assert states(st["notes"]) == ["never_run", "no_topic"]
    assert st["notes"][1]["note"].startswith(f"topic '{kafka.source.topic}' does not exist yet")
    assert (st["PENDING"], st["CLAIMED"], st["partitions"]) == (0, 0, {})

    text = cli_without_spark(path, "status", kafka.name)
    assert text.returncode == 0, text.stderr
    assert f"  note: topic '{kafka.source.topic}' does not exist yet" in text.stdout
    assert "KafkaError" not in text.stdout + text.stderr

    assert as_json(cli_without_spark(path, "dlq", "list", valkey.name, "--state", "all", "--json")) == []
    chart = tmp_path / "chart.html"
    runs = as_json(cli_without_spark(path, "metrics", kafka.name, "--chart", str(chart), "--json"))
    assert (runs["runs"], runs["chart"]) == ([], str(chart)) and chart.exists()


def test_a_source_that_is_down_is_a_note_with_its_address_and_the_fix(fresh, tmp_path):
    path, _, valkey, kafka = fresh
    port = free_port()  # nothing listens there
    env = {"DELTADRAIN_VALKEY_PORT": str(port), "DELTADRAIN_KAFKA_PORT": str(port)}
    for pipeline, service in ((valkey, "Valkey"), (kafka, "Kafka")):
        began = time.monotonic()
        done = cli_without_spark(path, "status", pipeline.name, "--json", env=env)
        took = time.monotonic() - began
        st = as_json(done)
        assert states(st["notes"]) == ["never_run", "unreachable"], st["notes"]
        note = st["notes"][1]["note"]
        assert note.startswith(f"cannot reach {service} at 127.0.0.1:{port} for pipeline '{pipeline.name}'"), note
        # The fix names the config (and home) the status ran with: pasted, it starts that config's service.
        assert f"start the embedded {service} with `DELTADRAIN_HOME=" in note
        assert f" deltadrain --config {path} services up`" in note
        assert (st["PENDING"], st["CLAIMED"], st["PUBLISHED"]) == (None, None, 0)
        assert took < 10, f"status of a pipeline on a {service} that is down took {took:.1f} s"
        assert "%3|" not in done.stderr  # the Kafka client's retries are not logged to the terminal
        text = cli_without_spark(path, "status", pipeline.name, env=env)
        assert text.returncode == 0 and f"  note: cannot reach {service} at 127.0.0.1:{port}" in text.stdout
        assert "PENDING            ?" in text.stdout


def test_the_views_data_says_each_state_in_a_note_not_as_a_failure(fresh, valkey_server, kafka_broker):
    from deltadrain.orchestration.view import data

    _, cfg, valkey, kafka = fresh
    for pipeline, state in ((valkey, "never_written"), (kafka, "no_topic")):
        page = data.pipeline_view(cfg, pipeline)
        assert page.get("source_note") is None
        assert states(page["notes"]) == ["never_run", state]
        row = data.pipeline_summary(cfg, pipeline)
        assert (row["source_note"], row["lag"], states(row["notes"])) == (None, 0, ["never_run", state])

    port = free_port()
    down = kafka.model_copy(update={"source": kafka.source.model_copy(
        update={"bootstrap_servers": f"127.0.0.1:{port}"})})
    row = data.pipeline_summary(cfg, down)
    assert (row["source_note"], row["lag"], states(row["notes"])) == (None, None, ["never_run", "unreachable"])
    assert f"cannot reach Kafka at 127.0.0.1:{port}" in row["notes"][1]["note"]


@pytest.mark.slow
def test_status_dlq_and_metrics_read_what_spark_reads_without_a_jvm(tmp_path, spark, valkey_server):
    """A real drain's tables (written by Spark) read the same through delta-rs as through Spark."""
    from deltadrain.dev.produce import produce
    from deltadrain.lake.deadletter import list_dead_letters
    from deltadrain.lake.metrics import last_runs
    from deltadrain.sources.valkey.client import valkey_client

    path, c, p = make_pipeline(tmp_path, max_retries=0, partitions=2)
    client = valkey_client(c, p)
    produce(c, p, 60, seed=3, malformed_ratio=0.1)
    drain_until_done(c, p, spark, client)
    published, dead = len(target_ids(spark, c, p)), len(dlq_rows(spark, c, p))
    assert published and dead

    st = as_json(cli_without_spark(path, "status", p.name, "--json"))
    assert (st["PUBLISHED"], st["DEAD"], st["PENDING"], st["CLAIMED"]) == (published, dead, 0, 0)
    assert st["notes"] == [] and st["checkpoint"]["found_in"] == "commit" and st["last_batch"]["batch"] == 1

    def same(rows):  # JSON as the CLI prints it, times as UTC (Spark collects them without a zone)
        return json.loads(json.dumps(rows, default=lambda v: v.replace(tzinfo=None).isoformat(" ")))

    listed = as_json(cli_without_spark(path, "dlq", "list", p.name, "--limit", "5", "--json"))
    spark_listed = same(list_dead_letters(spark, str(c.dlq_path(p)), limit=5))
    assert [{k: v for k, v in r.items() if not k.endswith("_at")} for r in listed] == \
        [{k: v for k, v in r.items() if not k.endswith("_at")} for r in spark_listed]
    assert [r["last_failure_at"].removesuffix("+00:00") for r in listed] == [r["last_failure_at"] for r in spark_listed]
    error = listed[0]["error"][:12]
    assert as_json(cli_without_spark(path, "dlq", "list", p.name, "--error", error, "--json")) == \
        json.loads(json.dumps(list_dead_letters(spark, str(c.dlq_path(p)), error_contains=error, limit=50),
                              default=lambda v: v.isoformat(" ") + "+00:00"))

    runs = as_json(cli_without_spark(path, "metrics", p.name, "--json"))["runs"]
    assert runs == json.loads(json.dumps(last_runs(spark, c, p, 10), default=str))


def test_the_alerts_check_measures_lag_and_the_oldest_message_at_both_sources_without_spark(
        fresh, valkey_server, kafka_broker):
    """The figures the ingest DAG's alerts task judges, read from a real Valkey and Kafka with nothing
    drained: the lag is every message, the oldest is the first appended (Valkey: the pending list's
    first entry when a consumer holds it, else the first the group has not read; Kafka: the record at
    the lake's checkpoint), and the thresholds decide."""
    from datetime import UTC, datetime, timedelta

    from deltadrain.config import AlertSettings
    from deltadrain.dev.produce import produce
    from deltadrain.observe.alerts import check
    from deltadrain.sources import source_of
    from deltadrain.sources.valkey.client import valkey_client
    from deltadrain.sources.valkey.drain import ensure_groups

    _, cfg, valkey, kafka = fresh
    settings = AlertSettings(max_lag=20, max_pending_age=timedelta(minutes=15), max_dead_rise=0)
    before_ms = int(time.time() * 1000)
    for p in (valkey, kafka):
        assert check(cfg, p.model_copy(update={"alerts": settings}), None)["failure"] is None  # nothing yet
        produce(cfg, p, 30, seed=48)
    after_ms = int(time.time() * 1000)

    client = valkey_client(cfg, valkey)
    ensure_groups(client, valkey.source)
    # A consumer holds stream 1's first entries: the oldest comes from the pending list there.
    held = client.xreadgroup(valkey.source.group, "alerts-probe", {valkey.source.streams[1]: ">"}, count=3)
    firsts = [client.xrange(s, count=1)[0][0] for s in valkey.source.streams]
    assert held[0][1][0][0] == firsts[1]
    expected = {valkey.name: min(int(i.decode().split("-")[0]) for i in firsts)}

    from confluent_kafka import Consumer, TopicPartition

    from deltadrain.sources.kafka.client import kafka_consumer_conf

    counts = source_of(kafka).counts(cfg, kafka, _empty_lake(), quick=True)
    reader = Consumer({**kafka_consumer_conf(cfg, kafka), "group.id": "alerts-test", "enable.auto.commit": False})
    reader.assign([TopicPartition(kafka.source.topic, int(part), 0) for part in counts["partitions"]])
    stamps = [m.timestamp()[1] for m in reader.consume(num_messages=30, timeout=10)]
    reader.close()
    assert len(stamps) == 30
    expected[kafka.name] = min(stamps)
    assert sum(v["pending"] for v in counts["partitions"].values()) == 30

    for p in (valkey, kafka):
        oldest = source_of(p).oldest_pending_ms(cfg, p, source_of(p).counts(cfg, p, _empty_lake(), quick=True))
        assert oldest == expected[p.name] and before_ms - 1000 <= oldest <= after_ms + 1000, (p.name, oldest)
        p = p.model_copy(update={"alerts": settings})
        report = check(cfg, p, datetime.now(UTC), now=datetime.fromtimestamp(oldest / 1000 + 16 * 60, UTC))
        found = {f["check"]: f for f in report["findings"]}
        assert (found["max_lag"]["figure"], found["max_lag"]["breached"]) == (30, True)
        assert (found["max_pending_age"]["figure"], found["max_pending_age"]["breached"]) == (960.0, True)
        assert (found["max_dead_rise"]["figure"], found["max_dead_rise"]["breached"]) == (0, False)
        assert report["failure"].startswith(f"pipeline '{p.name}': 2 alert(s): lag 30 messages above the "
                                            "threshold 20 (alerts.max_lag); oldest pending message appended 16 min ago")
        # Within both: 30 allowed, and the messages are seconds old.
        p = p.model_copy(update={"alerts": AlertSettings(max_lag=30, max_pending_age=timedelta(minutes=15))})
        assert check(cfg, p, None)["failure"] is None


def _empty_lake():
    from deltadrain.lake.checkpoint import Checkpoint
    from deltadrain.sources import LakeSide

    return LakeSide(lambda: Checkpoint(0))
