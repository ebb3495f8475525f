"""Authentication: ``auth.challenge``, ``auth.device.verify`` and ``auth.account.verify``.

A challenge is consumed on the first verify attempt, whatever its outcome. A WebSocket
connection keeps one identity: a later verification may renew it, never change it.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from typing import Any

from gapline.meshline import (
    DeviceCertificate,
    b64u_encode,
    verify_account_auth,
    verify_device_auth,
)
from gapline.relay._errors import RelayFailure
from gapline.relay._methods._base import (
    Call,
    Method,
    SessionMode,
    int_param,
    text_param,
    token_hash,
)
from gapline.relay._methods._core import RelayCore
from gapline.relay._store import Session

__all__ = ["AuthMethods"]


class AuthMethods:
    def __init__(self, core: RelayCore) -> None:
        self.core = core

    def methods(self) -> list[Method]:
        return [
            Method("auth.challenge", "POST", SessionMode.NONE, self.auth_challenge),
            Method("auth.device.verify", "POST", SessionMode.NONE, self.auth_device_verify),
            Method("auth.account.verify", "POST", SessionMode.NONE, self.auth_account_verify),
        ]

    async def auth_challenge(self, call: Call, params: dict[str, Any]) -> dict[str, Any]:
        core = self.core
        account = core.account(params.get("account"))
        now = core.now()
        nonce = b64u_encode(os.urandom(32))
        expires_at = now + core.config.challenge_ttl
        await core.store.accounts.add_challenge(nonce, account, expires_at)
        return {"nonce": nonce, "created_at": now, "expires_at": expires_at}

    async def _consume(self, params: Mapping[str, Any]) -> tuple[str, str]:
        nonce = params.get("nonce")
        if not isinstance(nonce, str) or not 0 < len(nonce) <= 256:
            raise RelayFailure("bad_request", "nonce: expected a challenge nonce")
        found = await self.core.store.accounts.consume_challenge(nonce)
        if found is None or found[1] <= self.core.now():
            raise RelayFailure("unauthorized", "challenge missing, expired or already used")
        return nonce, found[0]

    def _check_rebind(self, call: Call, account: str, mode: str, device_id: str | None) -> None:
        conn = call.connection
        if conn is None or conn.session is None:
            return
        bound = conn.session
        if (bound.account, bound.mode, bound.device_id) != (account, mode, device_id):
            raise RelayFailure("forbidden", "this connection is bound to another identity")

    async def _issue(self, call: Call, session: Session) -> dict[str, Any]:
        token = secrets.token_urlsafe(32)
        digest = token_hash(token)
        await self.core.store.accounts.add_session(digest, session)
        if call.connection is not None:
            call.connection.bind(digest, session)
        return {"token": token, "mode": session.mode, "expires_at": session.expires_at}

    async def auth_device_verify(self, call: Call, params: dict[str, Any]) -> dict[str, Any]:
        core = self.core
        nonce, account = await self._consume(params)
        timestamp = int_param(params, "timestamp", minimum=0)
        now = core.now()
        if abs(timestamp - now) > core.config.clock_skew:
            raise RelayFailure("clock_skew", "timestamp is outside the relay's clock tolerance")
        cert = DeviceCertificate.from_wire(params.get("signer_certificate"))
        device_id = core.verify_certificate(cert)
        if cert.account != account:
            raise RelayFailure("bad_request", "signer_certificate account is not the challenge's")
        signature = params.get("device_signature")
        if not isinstance(signature, str):
            raise RelayFailure("bad_request", "device_signature: expected a string")
        verify_device_auth(
            signature,
            signing_public_key=cert.signing_key_bytes,
            context=core.context,
            relay_id=core.relay_id,
            origin=core.origin,
            account=account,
            device_id=device_id,
            nonce=nonce,
            timestamp=timestamp,
        )
        window = await core.store.accounts.device_window(account, device_id)
        if window is None or not window[0] <= now < window[1]:
            raise RelayFailure(
                "device_unknown", "the device is not currently valid for the account"
            )
        self._check_rebind(call, account, "device", device_id)
        # Capped by this device's certificate in the account's authoritative state.
        expires_at = min(now + core.config.session_ttl, window[1])
        return await self._issue(
            call, Session(account, "device", device_id, core.origin, expires_at)
        )

    async def auth_account_verify(self, call: Call, params: dict[str, Any]) -> dict[str, Any]:
        core = self.core
        nonce, account = await self._consume(params)
        public_key = text_param(params, "account_public_key")
        signature = text_param(params, "account_signature")
        verify_account_auth(
            signature,
            account_public_key=public_key,
            context=core.context,
            relay_id=core.relay_id,
            origin=core.origin,
            account=account,
            nonce=nonce,
        )
        self._check_rebind(call, account, "account", None)
        expires_at = core.now() + core.config.session_ttl
        return await self._issue(call, Session(account, "account", None, core.origin, expires_at))
