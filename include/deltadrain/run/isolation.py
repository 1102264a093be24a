"""Runs that die: find the message that kills them without convicting its neighbours (invariant 6).

A run that dies (SIGKILL, out of memory, a hang stopped at the task's execution_timeout, a worker
restarted) says nothing about which of its messages, if any, killed it: most such deaths have nothing
to do with the data. So a death is never evidence against one message. It only makes the runs after
it read less of what it read, until a range that keeps dying holds a single message:

- a range no run died on is read whole;
- a range a run died on is read half at a time from its start: the first half, then (once that
  committed) the rest whole; a rest that dies again is halved in turn;
- a message is dead for dying only when it was *alone* in `max_retries` runs that died (runs that
  read that one message and nothing else). Runs that died holding it among others never count.
- a run that commits clears the deaths of everything it committed: unrelated deaths spread over
  time never add up.

A message that kills every run that reads it is therefore read by at most
`crash_loop_runs(batch_cap, max_retries)` runs, each no larger than the one before: at most
ceil(log2(batch_cap)) that die holding it among others (every one of them half the one before),
`max_retries` that die holding it alone, and one that writes it to the dead-letter table unread.

Valkey keeps the deaths in the pending list (a dead run's entries stay pending with their delivery
count) and in one counter per entry of the runs that read it alone; Kafka keeps them as segments of
offsets next to the checkpoint. Both ask the functions here. Everything here is pure.
"""

from __future__ import annotations

import math


def read_width(width: int, deaths: int, inside: bool) -> int:
    """How many of the `width` messages of a range, from where the run starts in it, the run reads.
    `deaths`: runs that died reading the range; `inside`: a narrower run committed the range's first
    part, so the run starts inside it. A range no run died on, or the rest of one, is read whole; a
    range that died is read half at a time (one message at least)."""
    if width <= 0:
        return 0
    if deaths <= 0 or inside:
        return width
    return max(1, width // 2)


def convicted(alone_deaths: int, failures: int, max_retries: int) -> bool:
    """Whether a message is dead for dying: runs that read it alone died `alone_deaths` times, and its
    own transform failed it `failures` times (each an attempt that was its own). Runs that died holding
    it among other messages are no evidence and never count."""
    return alone_deaths > 0 and alone_deaths + failures >= max_retries


def crash_loop_runs(batch_cap: int, max_retries: int) -> int:
    """The most runs that read a message which kills every run that reads it, the run that writes it
    to the dead-letter table included (see the module's docstring)."""
    return max_retries + math.ceil(math.log2(max(1, batch_cap))) + 1


def death_reason(alone_deaths: int, max_retries: int, where: str) -> str:
    """A dead letter's reason for a message convicted by `convicted`."""
    return (f"every run that read this message alone died before committing: {alone_deaths} runs "
            f"(max_retries={max_retries}), after runs holding it among others had narrowed down to it; {where}. "
            f"It stops the runs that read it (a crash, a hang stopped at the task's execution_timeout, out of "
            f"memory); the messages read next to it were published")
