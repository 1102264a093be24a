"""Shared by the bench scripts: how a list of timings (seconds) is reported."""
from __future__ import annotations

import statistics


def median_ms(xs: list[float], digits: int = 1) -> float:
    """The median of `xs`, in milliseconds."""
    return round(statistics.median(xs) * 1000, digits)
