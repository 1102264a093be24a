import json
from collections import Counter

import pytest

from deltadrain.dev.produce import MALFORMED_KINDS, generate, partition_for
from deltadrain.transforms import POISON_MARKER


@pytest.fixture(scope="module")
def orders(cfg):
    return cfg.pipeline("orders")


def test_same_seed_same_messages(orders):
    a = list(generate(orders, 500, seed=7, malformed_ratio=0.1, poison_ratio=0.02))
    b = list(generate(orders, 500, seed=7, malformed_ratio=0.1, poison_ratio=0.02))
    assert a == b
    c = list(generate(orders, 500, seed=8, malformed_ratio=0.1, poison_ratio=0.02))
    assert [m.value for m in a] != [m.value for m in c]


def test_any_slice_is_reproducible_alone(orders):
    whole = list(generate(orders, 100, seed=3, malformed_ratio=0.2))
    assert list(generate(orders, 30, seed=3, malformed_ratio=0.2, start=50)) == whole[50:80]


def test_ratios_give_every_bad_kind_and_valid_payloads(orders):
    msgs = list(generate(orders, 4000, seed=1, malformed_ratio=0.1, poison_ratio=0.01))
    kinds = Counter(m.kind for m in msgs)
    assert set(MALFORMED_KINDS) <= set(kinds)
    assert 300 < sum(kinds[k] for k in MALFORMED_KINDS) < 500 and 20 < kinds["poison"] < 70
    for m in msgs:
        if m.kind == "valid":
            payload = json.loads(m.value)
            assert payload["event_id"] == m.key and set(orders.payload_schema.required) <= set(payload)
            assert 150 <= len(m.value) <= 260
        if m.kind == "poison":
            assert json.loads(m.value)["customer"] == POISON_MARKER
    oversized = next(m for m in msgs if m.kind == "oversized")
    assert len(oversized.value) > orders.max_message_bytes
    with pytest.raises(UnicodeDecodeError):
        next(m for m in msgs if m.kind == "invalid_utf8").value.decode()


def test_bad_ratios_are_refused(orders):
    with pytest.raises(ValueError):
        list(generate(orders, 1, malformed_ratio=0.7, poison_ratio=0.5))


def test_partitioning_is_stable():
    # Fixed partitions: a key must land where it landed in every other process and release. Comparing a
    # result with itself in one process would pass with Python's hash(), which each process salts.
    keys = [b"evt-0-000000001", b"evt-0-000000002", b"evt-7-000000042", b"k0", b"k1", b"k2", b"k3", b"k99"]
    assert [partition_for(k, 4) for k in keys] == [2, 0, 3, 3, 1, 3, 1, 1]
    assert [partition_for(k, 3) for k in keys] == [2, 1, 0, 0, 1, 0, 2, 0]
    assert len({partition_for(f"k{i}".encode(), 4) for i in range(100)}) == 4
