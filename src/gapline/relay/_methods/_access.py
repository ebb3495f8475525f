"""What contact authorization is judged on: an account's current devices and profile.

``message.send`` (receiving rule 4) and ``device.state.resolve`` ask the protocol library
(``authorize_delivery``, ``public_access``, ``authorize_state_query``) whether a requester
may reach an account; this module supplies the library's inputs from the store. Each
decision re-reads the account's row, so it always sees the current state and profile (a
device removed or public discovery switched off counts at once, in every relay process),
but a state or profile is parsed only once per revision: the read sends its text only
when the revision differs from the parsed one held here.
"""

from __future__ import annotations

from dataclasses import dataclass

from gapline.meshline import (
    AccountDeviceState,
    AccountProfile,
    CurrentDevices,
)
from gapline.relay._methods._core import RelayCore

__all__ = ["Access", "AccessReader"]

_CACHE_LIMIT = 100_000


@dataclass(frozen=True, slots=True)
class Access:
    """One account's authorization inputs, as stored now."""

    state: str  # the AccountDeviceState's canonical JSON
    devices: CurrentDevices
    profile: AccountProfile | None


@dataclass(frozen=True, slots=True)
class _Parsed:
    state_revision: int
    state: str
    devices: CurrentDevices
    profile_revision: int
    profile: AccountProfile | None


class AccessReader:
    def __init__(self, core: RelayCore) -> None:
        self.core = core
        self._parsed: dict[str, _Parsed] = {}

    async def of(self, account: str) -> Access | None:
        """The account's current inputs; None when this relay holds no device state for it."""
        held = self._parsed.get(account)
        row = await self.core.store.profiles.access(
            account,
            state_revision=-1 if held is None else held.state_revision,
            profile_revision=-1 if held is None else held.profile_revision,
        )
        if row is None:
            return None
        if held is not None and row.state is None:
            state, devices = held.state, held.devices
        else:
            assert row.state is not None
            state = row.state
            # Verified when it was accepted: only the device IDs are derived again.
            devices = CurrentDevices.trusted(AccountDeviceState.from_json(state), self.core.context)
        if row.profile_revision is None:
            profile_revision, profile = -1, None
        elif held is not None and row.profile is None:
            profile_revision, profile = held.profile_revision, held.profile
        else:
            assert row.profile is not None
            profile_revision, profile = row.profile_revision, AccountProfile.from_json(row.profile)
        if held is None and len(self._parsed) > _CACHE_LIMIT:
            self._parsed.clear()
        self._parsed[account] = _Parsed(
            row.state_revision, state, devices, profile_revision, profile
        )
        return Access(state, devices, profile)
