"""Kafka topics: the source package (source.py answers the `Source` interface; one module per step)."""

__all__ = ["acl", "client", "consume", "crashes", "drain", "history", "keys", "offsets", "probe",
           "replay", "source", "status"]
