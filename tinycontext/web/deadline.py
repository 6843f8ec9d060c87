"""One scrape item's time limit, checked inside every stage (fetch to ranking), on the monotonic clock.

A stage that would run past ``at`` raises TimeoutError (the item becomes a typed ``timeout``): the
caps bound each stage's work, the checks bound its time even when the machine is slow. Embedding,
the one stage whose work can be left partly undone, stops before ``soft`` instead and ranks what it
has (the rest by BM25); ``cut`` records that it did, for the answer's note. ``soft`` comes early
enough that fusion and the answer still fit before ``at`` on a loaded machine, where the threads
doing page work hold the CPU and asyncio's own timer fires late.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

SOFT_SHARE = 0.8  # of the item's time: embedding stops here


@dataclass
class Deadline:
    at: float = math.inf
    soft: float = math.inf
    cut: bool = False

    @classmethod
    def within(cls, seconds: float) -> "Deadline":
        now = time.monotonic()
        return cls(now + seconds, now + SOFT_SHARE * seconds)

    def check(self) -> None:
        if time.monotonic() > self.at:
            raise TimeoutError

    def soft_passed(self, after: float = 0.0) -> bool:
        """Whether the soft limit has passed, or will have ``after`` seconds from now."""
        return time.monotonic() + after > self.soft
