"""What contact authorization is judged on: an account's current devices and profile.

``message.send`` (receiving rule 4) and ``device.state.resolve`` ask the protocol library
(``authorize_delivery``, ``public_access``, ``authorize_state_query``) whether a requester
may reach an account; this module supplies the library's inputs from the store, always
the current ones: a device removed or public discovery switched off counts at once.

Where this process is the database's only writer (SQLite), every change to a state or a
profile is made by this relay's own methods, which call ``forget``; the inputs are then
kept in memory until that happens (a read per send halved the send rate), and so is the
absence of any state (a relay sending to accounts homed elsewhere asks for each send's
recipient). Where several
processes share the database (PostgreSQL), each decision re-reads the account's row, and
a state or profile is parsed only once per revision: the read sends its text only when
the revision differs from the parsed one held here.
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
        self._absent: set[str] = set()  # accounts with no device state here (kept only)
        self._kept = core.store.single_writer
        # Changes so far (``forget``), so a read that raced one is not kept.
        self._changes = 0

    def forget(self, account: str) -> None:
        """The account's state or profile changed (called after the commit)."""
        self._parsed.pop(account, None)
        self._absent.discard(account)
        self._changes += 1

    async def of(self, account: str) -> Access | None:
        """The account's current inputs; None when this relay holds no device state for it."""
        held = self._parsed.get(account)
        if self._kept:
            if held is not None:
                return Access(held.state, held.devices, held.profile)
            if account in self._absent:
                return None
        changes = self._changes
        row = await self.core.store.profiles.access(
            account,
            state_revision=-1 if held is None else held.state_revision,
            profile_revision=-1 if held is None else held.profile_revision,
        )
        if row is None:
            if self._kept and self._changes == changes:
                if len(self._absent) > _CACHE_LIMIT:
                    self._absent.clear()
                self._absent.add(account)
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
        if self._changes == changes:
            if held is None and len(self._parsed) > _CACHE_LIMIT:
                self._parsed.clear()
            self._parsed[account] = _Parsed(
                row.state_revision, state, devices, profile_revision, profile
            )
        return Access(state, devices, profile)
