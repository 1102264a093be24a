"""Positions in a partition, compared as integers: a Valkey stream id `ms-seq` is the pair (ms, seq).

Comparing stream ids as strings is the classic bug ("...-10" sorts before "...-9") that skips
messages; everything in deltadrain goes through these helpers instead.
"""

from __future__ import annotations

from typing import NamedTuple


class StreamId(NamedTuple):
    ms: int
    seq: int

    @classmethod
    def parse(cls, value: str | bytes) -> StreamId:
        text = value.decode() if isinstance(value, bytes) else value
        ms, sep, seq = text.partition("-")
        if not ms.isdigit() or (sep and not seq.isdigit()):
            raise ValueError(f"not a stream id: {text!r}")
        return cls(int(ms), int(seq) if sep else 0)

    def __str__(self) -> str:
        return f"{self.ms}-{self.seq}"


def max_position(ids: list[str | bytes]) -> str | None:
    return str(max(StreamId.parse(i) for i in ids)) if ids else None


def merge_positions(old: dict[str, str], new: dict[str, str]) -> dict[str, str]:
    """Per partition, the later of two positions (integer comparison)."""
    out = dict(old)
    for part, pos in new.items():
        if part not in out or StreamId.parse(pos) > StreamId.parse(out[part]):
            out[part] = pos
    return out
