"""The payload schema's own rules, below every format: which column types deltadrain supports and
how a table's columns may evolve (pure decisions: no Spark, no I/O).
"""

__all__ = ["evolution", "types"]
