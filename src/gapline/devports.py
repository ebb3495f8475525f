"""Free ports on 127.0.0.1 for the development servers (relay, Synapse, PostgreSQL)
that tests, benchmarks and the demo start: one rule for all of them."""

from __future__ import annotations

import random
import socket

__all__ = ["free_port"]


def _ephemeral_low(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> int | None:
    """The lowest port the kernel hands out for a bind to port 0 (Linux), if known."""
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def free_port() -> int:
    """A port on 127.0.0.1 that was free just now, for a server started later.

    Taken below the kernel's ephemeral range where that is known: a port chosen
    before its server starts (as when a registry names several relays first) must
    not be handed meanwhile to another socket bound to port 0, such as an earlier
    relay's peer listener; a port from the ephemeral range could be.
    """
    low = _ephemeral_low()
    if low is not None and low > 12_000:
        rng = random.SystemRandom()
        for _ in range(64):
            port = rng.randrange(10_000, low)
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue  # taken: try another
                return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
