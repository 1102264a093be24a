"""Which staged entries the driver acknowledges, and in what chunks (the XACKs themselves run
against a real Valkey in the integration tests)."""

import pyarrow as pa
import pyarrow.parquet as pq

from deltadrain.sources.valkey.acknowledge import ACK_CHUNK, staged_entries


def write(path, rows):
    """rows: (stream, position, attempts); other staged columns are there too and must not be read."""
    streams, positions, attempts = zip(*rows, strict=True)
    table = pa.table({"_dd_partition": list(streams), "_dd_position": list(positions),
                      "_dd_attempts": pa.array(attempts, pa.int32()), "payload": ["x" * 50] * len(rows)})
    pq.write_table(table, path, row_group_size=1_000)
    return str(path)


def test_every_staged_entry_is_listed_once_per_stream_in_bounded_chunks(tmp_path):
    n = 2 * ACK_CHUNK + 7
    one = write(tmp_path / "a.parquet", [(f"s{i % 3}", f"1-{i}", 1 + i % 2) for i in range(n)])
    two = write(tmp_path / "b.parquet", [("s0", "2-0", 4)])
    chunks = list(staged_entries([one, two]))
    assert all(0 < len(entries) <= ACK_CHUNK for _, entries in chunks)
    listed = [(stream, position, attempts) for stream, entries in chunks for position, attempts in entries]
    expected = [(f"s{i % 3}", f"1-{i}", 1 + i % 2) for i in range(n)] + [("s0", "2-0", 4)]
    assert sorted(listed) == sorted(expected) and len(listed) == len(set(listed))


def test_entries_kept_pending_are_left_out(tmp_path):
    staged = write(tmp_path / "a.parquet", [("s0", "1-1", 1), ("s0", "1-2", 3), ("s1", "1-2", 1)])
    listed = [(s, p) for s, entries in staged_entries([staged], keep=frozenset({("s0", "1-2")})) for p, _ in entries]
    assert sorted(listed) == [("s0", "1-1"), ("s1", "1-2")]
