"""Token buckets and challenge quotas: the relay's answer to callers that ask too fast."""

from __future__ import annotations

import math
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Admission", "ChallengeQuota", "RateLimiter"]


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

    def debit(self, key: str, cost: float) -> None:
        """Take ``cost`` tokens whatever is left, into debt down to ``-burst``."""
        now = self._clock()
        tokens, last = self._buckets.get(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - last) * self.rate)
        self._store(key, max(-self.burst, tokens - cost), now)

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


UNAUTHENTICATED = "*"
"""The key of the one bucket every unverified call also pays into."""


class Admission:
    """Who pays for a call: only what the relay has verified picks the bucket.

    A session token is only a claim until the relay has found it: a random
    ``X-Meshline-Session`` per request must not buy a fresh bucket per request. So a
    call whose session is verified (known to this process) is charged to the session
    and to its account (an account can open many sessions); every other call is
    charged to its address and then to one bucket all unverified calls share, which
    caps what every address together can make the relay do. A refused first bucket
    leaves the second untouched, so one flooding address does not drain the shared
    bucket for everyone else.

    A refusal still costs the relay a parse and an answer. A caller that heeds
    ``Retry-After`` collects a refusal now and then; one that does not collects more
    than ``REFUSALS`` a second, and each further refusal is held up to
    ``TARPIT_SECONDS`` before it is answered (:meth:`hold`). Over HTTP/1.1 that
    connection then sends nothing else meanwhile, so a flood costs the relay a few
    answers per connection and second instead of as many as it can parse.

    A call without a verified session that fails (anything but ``rate_limited``)
    costs its address ``FAILED_CALL_COST`` calls in all: an honest client rarely
    fails, a flood of invalid requests runs through its address's budget ten times
    as fast. The shared bucket is not charged more, so failures cannot be used to
    drain it for everyone.
    """

    REFUSALS = (5.0, 10)  # refusals per second (rate, burst) before they are held
    TARPIT_SECONDS = 2.0
    FAILED_CALL_COST = 10

    def __init__(
        self,
        *,
        session: tuple[float, int],
        account: tuple[float, int],
        address: tuple[float, int],
        unauthenticated: tuple[float, int],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sessions = RateLimiter(*session, clock=clock)
        self.accounts = RateLimiter(*account, clock=clock)
        self.addresses = RateLimiter(*address, clock=clock)
        self.unauthenticated = RateLimiter(*unauthenticated, clock=clock, max_keys=1)
        self.refusals = RateLimiter(*self.REFUSALS, clock=clock)

    def charge_verified(self, token_hash: str, account: str) -> int:
        """0, or the seconds to wait, for a call made with a verified session."""
        return self.sessions.take(token_hash) or self.accounts.take(account)

    def charge_unverified(self, address: str) -> int:
        """0, or the seconds to wait, for a call without a verified session."""
        return self.addresses.take(address) or self.unauthenticated.take(UNAUTHENTICATED)

    def failed_unverified(self, address: str) -> None:
        """An unverified call of ``address`` failed: charge the rest of its cost."""
        self.addresses.debit(address, self.FAILED_CALL_COST - 1)

    def hold(self, key: str, wait: int) -> float:
        """Seconds to hold a refusal of ``key`` (the address or session charged) before
        answering it: 0 while the caller collects refusals slower than ``REFUSALS``."""
        if not self.refusals.take(key):
            return 0.0
        return min(float(wait), self.TARPIT_SECONDS)


@dataclass(slots=True)
class _Issued:
    address: str
    account: str
    expires_at: int


class ChallengeQuota:
    """Bounds the ``auth.challenge`` rows one address or one account can hold.

    A challenge is a database row from issue until it is used (the first verify
    attempt consumes it, whatever the outcome) or expires; before this bound one
    address could hold rate x TTL of them. Here each address and each account may
    hold at most ``per_address`` / ``per_account`` outstanding nonces, counted in this
    process (several processes on one database each keep their own count, so the
    bound there is per process). ``clock`` is the relay's clock (the one that stamps
    ``expires_at``).
    """

    def __init__(
        self,
        per_address: int,
        per_account: int,
        clock: Callable[[], int],
        max_outstanding: int = 200_000,
    ) -> None:
        self.per_address = per_address
        self.per_account = per_account
        self._clock = clock
        self._max = max_outstanding
        self._by_nonce: dict[str, _Issued] = {}
        self._order: deque[tuple[int, str]] = deque()  # (expires_at, nonce), issue order
        self._addresses: Counter[str] = Counter()
        self._accounts: Counter[str] = Counter()

    def __len__(self) -> int:
        return len(self._by_nonce)

    def check(self, address: str, account: object) -> int:
        """0 when one more challenge may be issued, else the seconds until one expires."""
        now = self._clock()
        self._expire(now)
        full = (
            self._addresses[address] >= self.per_address
            or (isinstance(account, str) and self._accounts[account] >= self.per_account)
            or len(self._by_nonce) >= self._max
        )
        if not full:
            return 0
        # The oldest outstanding nonce expires first (a conservative wait).
        return max(1, self._order[0][0] - now) if self._order else 1

    def issued(self, nonce: str, address: str, account: str, expires_at: int) -> None:
        self._by_nonce[nonce] = _Issued(address, account, expires_at)
        self._order.append((expires_at, nonce))
        self._addresses[address] += 1
        self._accounts[account] += 1

    def consumed(self, nonce: object) -> None:
        """A verify call named ``nonce``: the row is gone whatever the outcome."""
        if isinstance(nonce, str):
            issued = self._by_nonce.pop(nonce, None)
            if issued is not None:
                self._release(issued)
                if len(self._order) > 2 * len(self._by_nonce) + 1024:
                    # Drop the entries of used nonces, so issuing and using them in a
                    # loop cannot grow the queue.
                    self._order = deque(e for e in self._order if e[1] in self._by_nonce)

    def _expire(self, now: int) -> None:
        order = self._order
        while order and (order[0][0] <= now or order[0][1] not in self._by_nonce):
            _, nonce = order.popleft()
            issued = self._by_nonce.pop(nonce, None)
            if issued is not None:
                self._release(issued)

    def _release(self, issued: _Issued) -> None:
        for counter, key in ((self._addresses, issued.address), (self._accounts, issued.account)):
            counter[key] -= 1
            if counter[key] <= 0:
                del counter[key]
