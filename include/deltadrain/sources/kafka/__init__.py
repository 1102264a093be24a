"""Kafka topics: the source package (source.py answers the `Source` interface; one module per step)."""
