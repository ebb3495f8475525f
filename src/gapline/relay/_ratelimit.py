"""Per-session token buckets: the relay's answer to callers that ask too fast."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

__all__ = ["RateLimiter"]


class RateLimiter:
    """``rate`` tokens per second up to ``burst``, one bucket per key (session or address).

    ``take(key)`` returns 0 when the call may proceed, else the whole seconds to wait,
    which the transports send as ``data.retry_after`` and ``Retry-After``.
    """

    def __init__(
        self,
        rate: float,
        burst: int,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int = 100_000,
    ) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("rate must be positive and burst at least 1")
        self.rate = rate
        self.burst = float(burst)
        self._clock = clock
        self._max_keys = max_keys
        self._buckets: dict[str, tuple[float, float]] = {}

    def take(self, key: str) -> int:
        now = self._clock()
        tokens, last = self._buckets.get(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - last) * self.rate)
        if tokens >= 1.0:
            self._store(key, tokens - 1.0, now)
            return 0
        self._store(key, tokens, now)
        return max(1, math.ceil((1.0 - tokens) / self.rate))

    def _store(self, key: str, tokens: float, now: float) -> None:
        if key not in self._buckets and len(self._buckets) >= self._max_keys:
            # Full buckets carry no state worth keeping; drop them first, then the oldest half.
            full = [
                k
                for k, (t, last) in self._buckets.items()
                if t + (now - last) * self.rate >= self.burst
            ]
            for k in full:
                del self._buckets[k]
            if len(self._buckets) >= self._max_keys:
                for k in list(self._buckets)[: self._max_keys // 2]:
                    del self._buckets[k]
        self._buckets[key] = (tokens, now)
