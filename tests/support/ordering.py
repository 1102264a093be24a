"""The order the suite's tests are handed out in, so that its minutes-long tests start early on every worker.

pytest-xdist's `worksteal` gives each of its W workers a contiguous share of the collection (the first
N // W tests to one, the next share to the next, ...), and a worker that runs dry takes half of the
longest queue from its end. A long test therefore starts when its own worker reaches it: put five of them
at the head of one share and the last starts after the other four, alone at the end of the run. Here each
share starts with its part of the long tests, dealt longest first to the share with the least so far."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


def share_sizes(n: int, workers: int) -> list[int]:
    """How worksteal splits `n` tests among `workers` idle workers at the start."""
    sizes, left = [], n
    for i in range(workers):
        size = left // (workers - i)
        sizes.append(size)
        left -= size
    return sizes


def long_first(items: Sequence[T], group_of: Callable[[T], str], seconds: dict[str, float],
               workers: int) -> list[T]:
    """`items` reordered so that each worker's share begins with long groups (files, by `group_of`),
    their known `seconds` balanced across the shares; the other items keep their order. A group stays
    in one share. When the long ones do not fit (a small selection), they simply go first."""
    groups: dict[str, list[T]] = {}
    rest: list[T] = []
    for item in items:
        key = group_of(item)
        (groups.setdefault(key, []) if key in seconds else rest).append(item)
    workers = max(workers, 1)
    heads: list[list[T]] = [[] for _ in range(workers)]
    load = [0.0] * workers
    for key in sorted(groups, key=lambda k: -seconds[k]):
        i = load.index(min(load))
        heads[i] += groups[key]
        load[i] += seconds[key]
    sizes = share_sizes(len(items), workers)
    if any(len(head) > size for head, size in zip(heads, sizes, strict=True)):
        return [item for key in sorted(groups, key=lambda k: -seconds[k]) for item in groups[key]] + rest
    ordered, taken = [], 0
    for head, size in zip(heads, sizes, strict=True):
        fill = size - len(head)
        ordered += head + rest[taken:taken + fill]
        taken += fill
    return ordered
