"""gapline.relay: a Meshline Protocol 1.0 relay that keeps per-account message timelines.

Run it with `gapline relay serve`, or in-process::

    async with RelayServer.start(RelayConfig(dsn="relay.db", retention=86400, port=0)) as server:
        print(server.url)
"""

from gapline.relay._config import DEFAULT_NETWORK_CONTEXT, RelayConfig
from gapline.relay._errors import RelayFailure
from gapline.relay._server import RelayServer
from gapline.relay._store import TimelineStore

__all__ = ["DEFAULT_NETWORK_CONTEXT", "RelayConfig", "RelayFailure", "RelayServer", "TimelineStore"]
