"""deltadrain: exactly-once drains of Valkey streams and Kafka topics into Delta Lake tables."""

__version__ = "0.1.0"

__all__ = ["__version__"]
