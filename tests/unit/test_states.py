"""The notes status and the view show for states that are no failure, and the delta-rs reads behind
`deltadrain status`, `dlq list` and `metrics` (tables written here with delta-rs)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest


def pipelines(cfg):
    valkey = next(p for p in cfg.pipelines if p.source.kind == "valkey")
    kafka = next(p for p in cfg.pipelines if p.source.kind == "kafka")
    return valkey, kafka


def test_a_pipeline_without_a_target_table_is_never_run_and_says_how_to_run_it(cfg):
    from deltadrain.observe.notes import never_run

    valkey, _ = pipelines(cfg)
    assert never_run(valkey, has_target=True) is None
    note = never_run(valkey, has_target=False, config=cfg.source_file)
    assert note["state"] == "never_run"
    # The command carries the home (the suite's own, not the default) it would read.
    assert "deltadrain__orders__ingest" in note["note"] and " deltadrain drain orders`" in note["note"]
    assert "`DELTADRAIN_HOME=" in note["note"]
    other = never_run(valkey, has_target=False, config=cfg.source_file.parent / "pipelines.cluster.yaml")
    assert " deltadrain --config config/pipelines.cluster.yaml drain orders`" in other["note"] or (
        f" deltadrain --config {cfg.source_file.parent}/pipelines.cluster.yaml drain orders`" in other["note"])


def test_a_topic_the_broker_does_not_know_is_nothing_to_drain_unless_the_lake_read_it_before(cfg):
    from deltadrain.sources import SourceNote
    from deltadrain.sources.kafka.status import missing_topic

    _, kafka = pipelines(cfg)
    counts = missing_topic(kafka, {})
    assert (counts["PENDING"], counts["CLAIMED"], counts["partitions"]) == (0, 0, {})
    [note] = counts["notes"]
    assert note["state"] == "no_topic" and note["note"].startswith("topic 'clicks' does not exist yet")
    assert " deltadrain produce clicks --count N`" in note["note"]
    with pytest.raises(SourceNote, match="it was deleted after batches were drained from it"):
        missing_topic(kafka, {"0": "12"})


def test_streams_without_a_key_are_never_written_or_deleted_when_the_checkpoint_holds_them(cfg):
    from deltadrain.sources.valkey.status import stream_notes

    valkey, _ = pipelines(cfg)
    [one] = stream_notes(valkey, ["orders:{1}"], {})
    assert one["state"] == "never_written" and one["note"].startswith("stream orders:{1} has never been written")
    [both] = stream_notes(valkey, ["orders:{0}", "orders:{1}"], {})
    assert both["note"].startswith("streams orders:{0}, orders:{1} have never been written")
    never, gone = stream_notes(valkey, ["orders:{0}", "orders:{1}"], {"orders:{1}": "5-0"})
    assert never["note"].startswith("stream orders:{0} has never been written")
    assert gone["state"] == "stream_gone" and "holds its position 5-0" in gone["note"]
    assert stream_notes(valkey, [], {"orders:{1}": "5-0"}) == []


def test_bootstrap_servers_split_into_hosts_and_ports():
    from deltadrain.sources.kafka.client import split_servers

    assert split_servers("a:1, b:2,,[::1]:9093,c") == [("a", 1), ("b", 2), ("::1", 9093), ("c", 9092)]


def test_a_bootstrap_server_nobody_listens_at_is_the_clients_transport_failure_at_once(cfg):
    import socket
    import time

    from confluent_kafka import KafkaException

    from deltadrain.sources.connections import unreachable
    from deltadrain.sources.kafka.client import check_reachable

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    began = time.monotonic()
    with pytest.raises(KafkaException) as raised:
        check_reachable(f"127.0.0.1:{port}")
    assert time.monotonic() - began < 2
    _, kafka = pipelines(cfg)
    state, line = unreachable(raised.value, cfg, [kafka], with_reason=False)
    assert state == "unreachable" and line.startswith("cannot reach Kafka at 127.0.0.1:") and "(KafkaException)" in line
    with socket.socket() as s:  # one that listens passes
        s.bind(("127.0.0.1", 0))
        s.listen()
        check_reachable(f"127.0.0.1:{port},127.0.0.1:{s.getsockname()[1]}")


def write_dlq(path, rows: list[dict]) -> None:
    import pyarrow as pa
    from deltalake import write_deltalake

    schema = pa.schema([("pipeline", pa.string()), ("partition", pa.string()), ("position", pa.string()),
                        ("pos_hi", pa.int64()), ("pos_lo", pa.int64()), ("message_id", pa.string()),
                        ("original", pa.binary()), ("error", pa.string()), ("state", pa.string()),
                        ("last_failure_at", pa.timestamp("us", tz="UTC"))])
    write_deltalake(str(path), pa.Table.from_pylist(rows, schema=schema), mode="append")


def test_dead_letters_are_filtered_and_ordered_as_the_spark_listing_did(tmp_path):
    from deltadrain.observe.tables import find_dead_letters

    at = datetime(2026, 5, 1, 12, tzinfo=UTC)

    def row(pos: int, error: str, state: str = "DEAD", minutes: int = 0, original: bytes | None = b"x" * 200):
        return {"pipeline": "orders", "partition": "s0", "position": f"{pos}-0", "pos_hi": pos, "pos_lo": 0,
                "message_id": f"m{pos}", "original": original, "error": error, "state": state,
                "last_failure_at": at + timedelta(minutes=minutes)}

    path = tmp_path / "dlq"
    assert find_dead_letters(str(path)) == []
    write_dlq(path, [row(3, "bad 'x'; DROP", minutes=1), row(1, "bad amount", minutes=1), row(2, "no id"),
                     row(4, "bad amount", state="REPLAYED", minutes=5), row(5, "null", original=None)])
    listed = find_dead_letters(str(path))
    assert [r["position"] for r in listed] == ["1-0", "3-0", "2-0", "5-0"]  # newest failure, then place
    assert listed[0]["payload_bytes"] == 200 and listed[0]["payload_preview"] == "x" * 120
    assert (listed[-1]["payload_bytes"], listed[-1]["payload_preview"]) == (0, None)
    assert listed[0]["last_failure_at"] == at + timedelta(minutes=1) and "original" not in listed[0]
    assert [r["position"] for r in find_dead_letters(str(path), error_contains="'x'; DROP")] == ["3-0"]
    assert [r["position"] for r in find_dead_letters(str(path), error_contains="amount", state=None)] == ["4-0", "1-0"]
    assert [r["position"] for r in find_dead_letters(str(path), state="REPLAYED")] == ["4-0"]
    # A time without a zone is UTC; since is inclusive, until exclusive.
    since = datetime(2026, 5, 1, 12, 1)
    assert [r["position"] for r in find_dead_letters(str(path), since=since)] == ["1-0", "3-0"]
    assert [r["position"] for r in find_dead_letters(str(path), until=since)] == ["2-0", "5-0"]
    assert [r["position"] for r in find_dead_letters(str(path), limit=1)] == ["1-0"]


def test_rows_and_dead_letters_per_partition_are_counted_from_the_tables(tmp_path, cfg):
    import pyarrow as pa
    from deltalake import write_deltalake

    from deltadrain.observe import tables as lakeview

    c = cfg.model_copy(update={"data_dir": str(tmp_path)})
    valkey, _ = pipelines(c)
    assert lakeview.rows_per_partition(c, valkey) == {} and lakeview.dead_per_partition(c, valkey) == {}
    write_deltalake(str(c.target_path(valkey)), pa.table({"_dd_partition": ["0", "0", "1"], "v": [1, 2, 3]}))
    at = datetime(2026, 5, 1, tzinfo=UTC)
    write_dlq(c.dlq_path(valkey), [
        {"pipeline": "orders", "partition": "1", "position": "1", "pos_hi": 0, "pos_lo": 1, "state": "DEAD",
         "last_failure_at": at},
        {"pipeline": "orders", "partition": "1", "position": "2", "pos_hi": 0, "pos_lo": 2, "state": "REPLAYED",
         "last_failure_at": at},
        {"pipeline": "other", "partition": "1", "position": "3", "pos_hi": 0, "pos_lo": 3, "state": "DEAD",
         "last_failure_at": at}])
    assert lakeview.rows_per_partition(c, valkey) == {"0": 2, "1": 1}
    assert lakeview.dead_per_partition(c, valkey) == {"1": 1}
