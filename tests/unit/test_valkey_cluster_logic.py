"""Pure parts of the Valkey Cluster support: the embedded cluster's slot ranges, payloads of replies
parsed by a cluster client's nodes."""

from deltadrain.dev.services.valkey_cluster import SLOTS, slot_ranges
from deltadrain.sources.valkey.claim import payload_of


def test_the_slots_are_split_into_contiguous_ranges_that_cover_them_all():
    ranges = slot_ranges(3)
    assert ranges[0][0] == 0 and ranges[-1][1] == SLOTS - 1
    assert all(a[1] + 1 == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
    assert max(hi - lo for lo, hi in ranges) - min(hi - lo for lo, hi in ranges) <= 1


def test_a_payload_is_found_in_raw_and_in_parsed_entry_fields():
    assert payload_of([b"other", b"x", b"data", b"{}"], b"data") == b"{}"
    assert payload_of({b"other": b"x", b"data": b"{}"}, b"data") == b"{}"
    assert payload_of({b"other": b"x"}, b"data") is None and payload_of(None, b"data") is None


def test_a_stream_that_ends_before_the_checkpoint_gets_a_note_and_others_none():
    from deltadrain.sources.valkey.status import BEHIND, behind_notes

    positions = {"a": "100-5", "b": "100-5", "c": "9-0"}
    [note] = behind_notes(positions, {"a": "100-4", "b": "100-5", "c": "10-0", "d": "1-0"})
    assert note["state"] == BEHIND and "stream a ends at 100-4, before the position 100-5" in note["note"]
    assert behind_notes(positions, {"a": "1000-0"}) == []


def test_a_bare_services_up_starts_the_cluster_only_when_a_pipeline_reads_from_the_embedded_one():
    from deltadrain.config import load_config
    from deltadrain.dev import services

    cfg = load_config()
    assert "valkey_cluster" not in services.defaults(cfg)
    valkey = next(p for p in cfg.pipelines if p.source.kind == "valkey")
    clustered = valkey.model_copy(update={"source": valkey.source.model_copy(update={"cluster": True})})
    on_cluster = cfg.model_copy(update={"pipelines": [clustered]})
    assert services.defaults(on_cluster) == ["valkey", "valkey_cluster", "kafka", "spark_connect", "airflow"]
    elsewhere = clustered.model_copy(update={"source": clustered.source.model_copy(update={"url": "valkey://h:7000"})})
    assert "valkey_cluster" not in services.defaults(cfg.model_copy(update={"pipelines": [elsewhere]}))
    assert services.select(["valkey_cluster"]) == ["valkey_cluster"]


def test_the_cluster_demo_config_reads_its_pipeline_from_the_embedded_cluster():
    from pathlib import Path

    from deltadrain.config import load_config
    from deltadrain.dev import services

    cfg = load_config(Path(__file__).resolve().parents[2] / "config" / "pipelines.cluster.yaml")
    source = cfg.pipeline("orders").source
    assert source.cluster and source.url is None and source.connection_id is None
    assert "valkey_cluster" in services.defaults(cfg)
