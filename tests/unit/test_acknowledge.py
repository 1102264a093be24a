"""Which staged entries the driver acknowledges, and in what chunks (the XACKs themselves run
against a real Valkey in the integration tests)."""

import pyarrow as pa
import pyarrow.parquet as pq

from deltadrain.sources.valkey.acknowledge import ACK_IDS, READ_ROWS, staged_entries


def write(path, rows):
    """rows: (stream, position, attempts); other staged columns are there too and must not be read."""
    streams, positions, attempts = zip(*rows, strict=True)
    table = pa.table({"_dd_partition": list(streams), "_dd_position": list(positions),
                      "_dd_attempts": pa.array(attempts, pa.int32()), "payload": ["x" * 50] * len(rows)})
    pq.write_table(table, path, row_group_size=1_000)
    return str(path)


def test_every_staged_entry_is_listed_once_per_stream_in_bounded_chunks(tmp_path):
    n = 2 * READ_ROWS + 7
    one = write(tmp_path / "a.parquet", [(f"s{i % 3}", f"1-{i}", 1 + i % 2) for i in range(n)])
    two = write(tmp_path / "b.parquet", [("s0", "2-0", 4)])
    chunks = list(staged_entries([one, two]))
    assert all(0 < len(positions) <= ACK_IDS for _, positions, _ in chunks)
    assert sum(len(positions) == ACK_IDS for _, positions, _ in chunks) >= 3  # full pieces, across reads
    listed = [(stream, position) for stream, positions, _ in chunks for position in positions]
    expected = [(f"s{i % 3}", f"1-{i}") for i in range(n)] + [("s0", "2-0")]
    assert sorted(listed) == sorted(expected) and len(listed) == len(set(listed))
    # Delivered or read before (attempts other than 1): their recorded failures are forgotten too.
    again = sorted((stream, position) for stream, _, positions in chunks for position in positions)
    assert again == sorted([(f"s{i % 3}", f"1-{i}") for i in range(n) if i % 2] + [("s0", "2-0")])
    assert all(set(a) <= set(p) for _, p, a in chunks)


def test_entries_kept_pending_are_left_out(tmp_path):
    staged = write(tmp_path / "a.parquet", [("s0", "1-1", 1), ("s0", "1-2", 3), ("s1", "1-2", 1), ("s1", "1-3", 0)])
    chunks = list(staged_entries([staged], keep=frozenset({("s0", "1-2")})))
    assert sorted((s, p) for s, positions, _ in chunks for p in positions) == [("s0", "1-1"), ("s1", "1-2"), ("s1", "1-3")]
    # A gap marker (attempts 0) is one to forget; the kept culprit is not touched.
    assert [(s, p) for s, _, again in chunks for p in again] == [("s1", "1-3")]
