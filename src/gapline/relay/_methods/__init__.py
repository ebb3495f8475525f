"""The relay's base-module methods, independent of transport (one module per family).

- ``_base``: the method record, calls, session modes, parameter helpers;
- ``_core``: the relay's identity and what every family shares;
- ``_info``, ``_auth``, ``_device_state``, ``_profiles``, ``_routes``, ``_messaging``: the
  method families of the client-relay method index;
- ``_access``: the inputs of contact authorization (current devices and profile);
- ``_route_dht``: the route DHT seam over this relay's own replica;
- ``_relay``: ``Relay``, which assembles the families into one method table.
"""

from gapline.relay._methods._base import (
    CAS_ATTEMPTS,
    Call,
    Connection,
    Method,
    MethodTable,
    SessionMode,
    token_hash,
)
from gapline.relay._methods._relay import Relay
from gapline.relay._methods._route_dht import LocalRouteDht

__all__ = [
    "CAS_ATTEMPTS",
    "Call",
    "Connection",
    "LocalRouteDht",
    "Method",
    "MethodTable",
    "Relay",
    "SessionMode",
    "token_hash",
]
