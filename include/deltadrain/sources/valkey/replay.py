"""Replay to a Valkey source: dead letters' original bytes go back to their streams with XADD,
within the streams' MAXLEN."""

from __future__ import annotations

from deltadrain.config import DeltadrainConfig, PipelineConfig
from deltadrain.errors import ReplayError


def over_maxlen(maxlen: int | None, sending: dict[str, int], unfinished: dict[str, int]) -> list[str]:
    """The streams a replay would push past their MAXLEN: each XADD trims the oldest entries, so the
    copies plus the entries the group has not finished (unread and pending) must fit, or some of them
    would be trimmed before a drain read them (a gap, and copies marked REPLAYED that never landed)."""
    return [f"{s}: {n} copies + {unfinished.get(s, 0)} entries not yet drained > maxlen {maxlen}"
            for s, n in sorted(sending.items()) if maxlen and n + unfinished.get(s, 0) > maxlen]


def send_back(cfg: DeltadrainConfig, pipeline: PipelineConfig, entries: list[dict]) -> None:
    from collections import Counter

    from deltadrain.sources.valkey.client import VALKEY_FIELD, group_counts, valkey_client, valkey_source

    client = valkey_client(cfg, pipeline)
    # The stream's MAXLEN holds for replayed entries as for produced ones (approximate: whole nodes).
    source = valkey_source(pipeline)
    maxlen = source.maxlen
    trim = {"maxlen": maxlen, "approximate": True} if maxlen else {}
    if maxlen:
        sending = Counter(e["partition"] for e in entries)
        # Entries the group has still to read or acknowledge (without the group: every entry).
        unfinished = {s: sum(group_counts(client, s, source.group)) for s in sending}
        full = over_maxlen(maxlen, sending, unfinished)
        if full:
            raise ReplayError(f"replay refused, nothing sent: {'; '.join(full)}. Replay fewer at a time (limit), "
                              "let the drains catch up first, or raise source.maxlen")
    pipe = client.pipeline(transaction=False)
    for e in entries:
        pipe.xadd(e["partition"], {VALKEY_FIELD: e["original"], b"replay_of": e["position"].encode()}, **trim)
    pipe.execute()
