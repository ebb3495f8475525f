"""One identity's calls to a relay over HTTP or over WebSocket, behind one interface, so a
contract test states each processing rule once and runs it through both transports.

``Channels(r, transport)`` opens channels: ``anonymous()`` (no session), ``device(account,
device)`` (a device session) and ``account(account)`` (an account session). Over HTTP a
channel carries its token in ``X-Meshline-Session``; over WebSocket it is a connection
that authenticated with ``auth.challenge`` and a verify call. ``ok`` returns the result
(None for HTTP 204 / JSON-RPC ``null``); ``code`` returns the spec's string error code,
after checking the transport spelled it as the spec maps it (HTTP status, JSON-RPC code).
"""

from __future__ import annotations

import contextlib
from typing import Any

from gapline.meshline import HTTP_STATUS_BY_CODE, JSONRPC_CODE_BY_CODE
from gapline.meshline.testing import TestAccount, TestDevice
from tests.relay.harness import RelayUnderTest, WsClient

__all__ = ["TRANSPORTS", "Channel", "Channels"]

TRANSPORTS = ("http", "ws")

# bad_request and Invalid Params share -32602: the string code is the one the spec names.
_BY_JSONRPC = {number: code for code, number in reversed(list(JSONRPC_CODE_BY_CODE.items()))}


class Channel:
    async def ok(self, method: str, params: dict[str, Any] | None = None) -> Any:
        raise NotImplementedError

    async def code(self, method: str, params: dict[str, Any] | None = None) -> str:
        raise NotImplementedError


class _Http(Channel):
    def __init__(self, r: RelayUnderTest, token: str | None) -> None:
        self.r = r
        self.token = token

    async def _call(self, method: str, params: dict[str, Any] | None) -> Any:
        # A signed device-state query is a POST; every other call uses its own verb.
        verb = "POST" if method == "device.state.resolve" and "$type" in (params or {}) else None
        return await self.r.call(method, params, token=self.token, verb=verb)

    async def ok(self, method: str, params: dict[str, Any] | None = None) -> Any:
        resp = await self._call(method, params)
        assert resp.status_code in (200, 204), (method, resp.status_code, resp.text)
        return None if resp.status_code == 204 else resp.json()

    async def code(self, method: str, params: dict[str, Any] | None = None) -> str:
        resp = await self._call(method, params)
        body = resp.json()
        code = body["code"]
        assert resp.status_code == HTTP_STATUS_BY_CODE[code], (method, resp.status_code, body)
        assert isinstance(body["message"], str)
        return code


class _Ws(Channel):
    def __init__(self, ws: WsClient) -> None:
        self.ws = ws

    async def ok(self, method: str, params: dict[str, Any] | None = None) -> Any:
        msg = await self.ws.request(method, params)
        assert "result" in msg and "error" not in msg, (method, msg)
        return msg["result"]

    async def code(self, method: str, params: dict[str, Any] | None = None) -> str:
        msg = await self.ws.request(method, params)
        assert "error" in msg and "result" not in msg, (method, msg)
        return _BY_JSONRPC[msg["error"]["code"]]


class Channels:
    """Channels of one transport to ``r``; WebSocket connections close with ``aclose``."""

    def __init__(self, r: RelayUnderTest, transport: str) -> None:
        assert transport in TRANSPORTS
        self.r = r
        self.transport = transport
        self._stack = contextlib.AsyncExitStack()

    async def __aenter__(self) -> Channels:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    async def _connect(self) -> WsClient:
        return await self._stack.enter_async_context(WsClient.connect(self.r.ws_url))

    async def anonymous(self) -> Channel:
        if self.transport == "http":
            return _Http(self.r, None)
        return _Ws(await self._connect())

    async def device(self, account: TestAccount, device: TestDevice | None = None) -> Channel:
        device = device or account.device()
        if self.transport == "http":
            return _Http(self.r, await self.r.login(account, device))
        ws = await self._connect()
        challenge = await ws.result("auth.challenge", {"account": account.account})
        creds = await ws.result(
            "auth.device.verify", self.r.device_verify_params(account, device, challenge["nonce"])
        )
        assert creds["mode"] == "device"
        return _Ws(ws)

    async def account(self, account: TestAccount) -> Channel:
        if self.transport == "http":
            return _Http(self.r, await self.r.account_login(account))
        ws = await self._connect()
        challenge = await ws.result("auth.challenge", {"account": account.account})
        creds = await ws.result(
            "auth.account.verify", self.r.account_verify_params(account, challenge["nonce"])
        )
        assert creds["mode"] == "account"
        return _Ws(ws)
