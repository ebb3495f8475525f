"""``Relay``: every base-module method of the client-relay protocol, by family.

Each family (``_info``, ``_auth``, ``_device_state``, ``_profiles``, ``_routes``,
``_messaging``) holds its methods and registers them here; the transports look methods
up in ``Relay.methods`` by name.
"""

from __future__ import annotations

from gapline.meshline import AccountKey
from gapline.relay._config import RelayConfig
from gapline.relay._methods._access import AccessReader
from gapline.relay._methods._auth import AuthMethods
from gapline.relay._methods._base import Method
from gapline.relay._methods._core import RelayCore
from gapline.relay._methods._device_state import DeviceStateMethods
from gapline.relay._methods._info import InfoMethods
from gapline.relay._methods._messaging import MessageMethods
from gapline.relay._methods._profiles import ProfileMethods
from gapline.relay._methods._routes import RouteMethods
from gapline.relay._store import TimelineStore

__all__ = ["Relay"]


class Relay(RelayCore):
    """The relay's methods over one :class:`TimelineStore`."""

    def __init__(self, config: RelayConfig, store: TimelineStore, key: AccountKey) -> None:
        super().__init__(config, store, key)
        access = self.access = AccessReader(self)
        self.routes = RouteMethods(self)
        self.messages = MessageMethods(self, access)
        self.info = InfoMethods(self)
        families = (
            self.info,
            AuthMethods(self),
            DeviceStateMethods(self, access),
            ProfileMethods(self, access),
            self.routes,
            self.messages,
        )
        self.methods: dict[str, Method] = {
            m.name: m for family in families for m in family.methods()
        }
