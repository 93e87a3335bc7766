"""Retry backoff (docs/reference.md#worker-runtime): exponential with jitter, capped."""

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
