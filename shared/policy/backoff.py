"""Backoff: task retries (exponential with jitter, capped) and the worker loops' retries after
failures. See docs/reference.md#environment for the defaults."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class BackoffPolicy:
    """``delay(n) = min(cap, base * factor**(n-1))``, then "equal jitter": a uniform draw in
    ``[delay/2, delay]`` so retries of a burst of failures spread out but never fire at once.

    base: seconds before the first retry (default 1 s). factor: growth per attempt (default 2).
    cap: the largest delay in seconds (default 300 s).
    """

    base: float = 1.0
    factor: float = 2.0
    cap: float = 300.0

    def delay(self, attempt: int, rand: Callable[[], float] = random.random) -> float:
        """Seconds to wait before retrying after failed attempt number ``attempt`` (1-based)."""
        if attempt < 1:
            raise ValueError("attempt is 1-based")
        try:
            ceiling = min(self.cap, self.base * self.factor ** (attempt - 1))
        except OverflowError:  # factor**n past float range: the cap has long won
            ceiling = self.cap
        return ceiling / 2 + (ceiling / 2) * rand()


@dataclass
class LoopBackoff:
    """The delay before a loop's next try after consecutive failures (a database blip, an
    outage): ``base`` doubling per failure up to ``cap``, with equal jitter. ``reset()`` after a
    success. Stateful, but no I/O: the loop sleeps the delay this returns.
    """

    base: float = 0.05
    cap: float = 5.0
    failures: int = 0

    def next(self, rand: Callable[[], float] = random.random) -> float:
        self.failures += 1
        delay = min(self.cap, self.base * 2.0 ** min(self.failures - 1, 20))
        return delay / 2 + rand() * delay / 2

    def reset(self) -> None:
        self.failures = 0
