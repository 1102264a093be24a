"""Valkey streams: the source package (source.py answers the `Source` interface; one module per step:
claim, acknowledge, crashes, gaps, reap, replay, status)."""

__all__ = ["acknowledge", "acl", "claim", "client", "crashes", "drain", "gaps", "history", "probe", "reap",
           "replay", "source", "status"]
