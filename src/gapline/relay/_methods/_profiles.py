"""``profile.publish`` and ``profile.resolve``: the account's device-signed public profile.

The calling device's session names the account and the signing device; its certificate
comes from the account's accepted device state, and is stored with the profile so a reader
can verify the signature later, even after that device has left the state. The checks are
the protocol library's (``check_profile_publish``); publication replaces the stored profile
only if it is still the one the checks ran against, so concurrent publications (two
devices, two relay processes) are each checked against what is really stored.
"""

from __future__ import annotations

from typing import Any

from gapline.meshline import AccountProfile, check_profile_publish
from gapline.relay._errors import RelayFailure
from gapline.relay._methods._access import AccessReader
from gapline.relay._methods._base import (
    CAS_ATTEMPTS,
    Call,
    Method,
    SessionMode,
    require,
    stored,
)
from gapline.relay._methods._core import RelayCore

__all__ = ["ProfileMethods"]


class ProfileMethods:
    def __init__(self, core: RelayCore, access: AccessReader) -> None:
        self.core = core
        self.access = access

    def methods(self) -> list[Method]:
        return [
            Method(
                "profile.publish", "PUT", SessionMode.DEVICE, self.profile_publish, no_content=True
            ),
            Method(
                "profile.resolve",
                "GET",
                SessionMode.DEVICE,
                self.profile_resolve,
                query={"account": "str"},
            ),
        ]

    async def profile_publish(self, call: Call, params: dict[str, Any]) -> None:
        core = self.core
        session = require(call, SessionMode.DEVICE)
        profile = AccountProfile.from_wire(params)  # the 8 KiB limit first
        signer = await core.device_certificate(session.device_id or "")
        canonical = profile.to_json().decode()
        for _ in range(CAS_ATTEMPTS):
            current = await core.store.profiles.current(session.account)
            check_profile_publish(
                profile,
                account=session.account,
                signer=signer,
                context=core.context,
                now=core.now(),
                max_skew=core.config.clock_skew,
                current_updated_at=None if current is None else current.updated_at,
            )
            if await core.store.profiles.replace(
                session.account,
                expected=None if current is None else current.revision,
                updated_at=profile.updated_at,
                canonical=canonical,
                signer_certificate=signer.to_json().decode(),
            ):
                self.access.forget(session.account)
                return None
        raise RelayFailure("state_conflict", "concurrent profile publications; try again")

    async def profile_resolve(self, call: Call, params: dict[str, Any]) -> dict[str, Any]:
        core = self.core
        require(call, SessionMode.DEVICE)
        account = core.account(params.get("account"))
        found = await core.store.profiles.current(account)
        if found is None:
            if core.forwarder is not None and await self.access.of(account) is None:
                return await core.forwarder.profile(account)  # homed elsewhere
            raise RelayFailure("not_found", "no profile for this account")
        return {
            "profile": stored(found.canonical),
            "signer_certificate": stored(found.signer_certificate),
        }
