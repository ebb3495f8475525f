"""`Parts`: the sub-machines and keys that the routing and sharing machines both call."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ._account import AccountMachine
from ._devices import DeviceTracker
from ._inbound import InboundGroupSessions
from ._olm import OlmSessions
from ._secrets import CryptoKeys

__all__ = ["Parts"]


@dataclass(frozen=True, slots=True)
class Parts:
    account: AccountMachine
    devices: DeviceTracker
    olm: OlmSessions
    inbound: InboundGroupSessions
    keys: CryptoKeys
    clock: Callable[[], int]
