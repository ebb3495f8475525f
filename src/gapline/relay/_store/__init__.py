"""The relay's durable state: one store per kind of record, behind one facade.

- ``_accounts``: device states, devices and certificates, challenges, sessions;
- ``_sends``: accepting ``message.send`` (idempotent on (from, message_id)) and its results;
- ``_timeline``: sequences, records and their device visibility, the sync page, retention;
- ``_profiles``: each account's current profile, and the read authorization decisions make;
- ``_routes``: the relay's replica of the account-route DHT keyspace and its version
  information;
- ``_sql_postgres``: PostgreSQL's own forms of rules whose generic form is in a sibling;
- ``_facade``: ``TimelineStore``, the object the server holds; migrations (``_schema``),
  the relay's own settings, and the retention cleanup that spans the stores.

A new kind of record (another table family) gets its own sibling module with a store
class, an ``expire(tx, ...)`` if it has a retention, and an attribute on the facade.
"""

from gapline.relay._store._accounts import (
    DEVICE_STATE_CHANNEL,
    Accounts,
    DeviceEntry,
    NewState,
    Session,
)
from gapline.relay._store._facade import CleanupReport, TimelineStore
from gapline.relay._store._profiles import AccessRow, Profiles, StoredProfile
from gapline.relay._store._routes import ROUTE_CHANNEL, HistoryRow, RecordRow, Routes
from gapline.relay._store._sends import AcceptedSend, DeliveryResult, NewSend, Sends
from gapline.relay._store._timeline import (
    TIMELINE_CHANNEL,
    KeyBox,
    SyncItem,
    SyncPage,
    Timelines,
)

__all__ = [
    "DEVICE_STATE_CHANNEL",
    "ROUTE_CHANNEL",
    "TIMELINE_CHANNEL",
    "AcceptedSend",
    "AccessRow",
    "Accounts",
    "CleanupReport",
    "DeliveryResult",
    "DeviceEntry",
    "HistoryRow",
    "KeyBox",
    "NewSend",
    "NewState",
    "Profiles",
    "RecordRow",
    "Routes",
    "Sends",
    "Session",
    "StoredProfile",
    "SyncItem",
    "SyncPage",
    "TimelineStore",
    "Timelines",
]
