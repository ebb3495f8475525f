"""A relay under test, started in-process on 127.0.0.1, and a thin raw-transport client.

The protocol-level tests go through ``gapline.meshline``'s client where it offers
the call; this module keeps the raw HTTP / WebSocket access the malformed-input
tests need (bodies and frames a real client never produces).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

import httpx
import websockets

from gapline.meshline import (
    AccountProfile,
    NetworkContext,
    account_auth_input,
    device_auth_input,
    relay_origin,
    sign_profile,
)
from gapline.meshline.testing import TEST_CONTEXT, TestAccount, TestDevice
from gapline.relay import RelayConfig, RelayServer
from gapline.relay.devserver import RelayProcess

__all__ = ["Clock", "RelayUnderTest", "WsClient", "remote", "start_relay"]


class Clock:
    """A settable clock: retention and expiry are tested by moving time, never by sleeping."""

    def __init__(self, now: int | None = None) -> None:
        self.now = int(time.time()) if now is None else now

    def __call__(self) -> int:
        return self.now

    def advance(self, seconds: int) -> None:
        self.now += seconds


VERBS = {
    "relay.descriptor": "GET",
    "relay.info": "GET",
    "auth.challenge": "POST",
    "auth.device.verify": "POST",
    "auth.account.verify": "POST",
    "device.state.publish": "PUT",
    "device.state.resolve": "GET",
    "profile.publish": "PUT",
    "profile.resolve": "GET",
    "account.route.publish": "PUT",
    "account.route.resolve": "GET",
    "message.send": "POST",
    "message.delivery.status": "GET",
    "message.timeline.sync": "GET",
}


@dataclass
class RelayUnderTest:
    """A relay reached over HTTP: in-process (``server`` set) or a subprocess."""

    url: str
    ws_url: str
    relay_id: str
    clock: Clock
    http: httpx.AsyncClient
    server_: RelayServer | None = None
    context: NetworkContext = TEST_CONTEXT
    tokens: dict[tuple[str, str], str] = field(default_factory=dict)
    # Accounts ``publish`` has published a device state of.
    published: set[str] = field(default_factory=set)

    @property
    def server(self) -> RelayServer:
        assert self.server_ is not None, "not an in-process relay"
        return self.server_

    @property
    def origin(self) -> str:
        return relay_origin(self.url)

    async def call(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        *,
        token: str | None = None,
        verb: str | None = None,
    ) -> httpx.Response:
        """One HTTP method call, encoded as the spec says."""
        verb = verb or VERBS[method]
        headers = {"X-Meshline-Session": token} if token else {}
        path = self.url + "/" + method.replace(".", "/")
        if verb == "GET":
            return await self.http.get(path, params=params or {}, headers=headers)
        content = None if params is None else json.dumps(params).encode()
        if content is not None:
            headers["Content-Type"] = "application/json"
        return await self.http.request(verb, path, content=content, headers=headers)

    async def ok(
        self, method: str, params: dict[str, Any] | None = None, *, token: str | None = None
    ) -> Any:
        resp = await self.call(method, params, token=token)
        assert resp.status_code == 200, (method, resp.status_code, resp.text)
        return resp.json()

    async def error(
        self, method: str, params: dict[str, Any] | None = None, *, token: str | None = None
    ) -> tuple[int, str]:
        resp = await self.call(method, params, token=token)
        assert resp.status_code not in (200, 204), (method, resp.text)
        return resp.status_code, resp.json()["code"]

    def device_verify_params(
        self, account: TestAccount, device: TestDevice, nonce: str
    ) -> dict[str, Any]:
        timestamp = self.clock()
        payload = device_auth_input(
            relay_id=self.relay_id,
            origin=self.origin,
            account=account.account,
            device_id=device.device_id,
            nonce=nonce,
            timestamp=timestamp,
        )
        return {
            "nonce": nonce,
            "timestamp": timestamp,
            "signer_certificate": device.certificate.to_wire(),
            "device_signature": device.keys.sign_object(payload, self.context, exclude=()),
        }

    async def login(self, account: TestAccount, device: TestDevice | None = None) -> str:
        """A device session over HTTP (challenge, then verify)."""
        device = device or account.device()
        challenge = await self.ok("auth.challenge", {"account": account.account})
        creds = await self.ok(
            "auth.device.verify", self.device_verify_params(account, device, challenge["nonce"])
        )
        assert creds["mode"] == "device"
        return creds["token"]

    def account_verify_params(self, account: TestAccount, nonce: str) -> dict[str, Any]:
        payload = account_auth_input(
            relay_id=self.relay_id,
            origin=self.origin,
            account=account.account,
            account_public_key=account.key.public_key_b64,
            nonce=nonce,
        )
        return {
            "nonce": nonce,
            "account_public_key": account.key.public_key_b64,
            "account_signature": account.key.sign_object(payload, self.context, exclude=()),
        }

    async def account_login(self, account: TestAccount) -> str:
        """An account session over HTTP (challenge, then ``auth.account.verify``)."""
        challenge = await self.ok("auth.challenge", {"account": account.account})
        creds = await self.ok(
            "auth.account.verify", self.account_verify_params(account, challenge["nonce"])
        )
        assert creds["mode"] == "account"
        return creds["token"]

    async def publish(
        self,
        account: TestAccount,
        state: Any = None,
        device: TestDevice | None = None,
        *,
        public: bool = True,
    ) -> None:
        """Publish the account's device state (bootstrapping with an account session).

        With ``public`` (the default), the account's first publication through this object
        also publishes a profile with public discovery on, signed by a device valid now, so
        any account may send to it without a grant, as the timeline tests assume.
        """
        state = state if state is not None else account.state
        token = await self.account_login(account)
        result = await self.ok("device.state.publish", state.to_wire(), token=token)
        assert result == {"status": "accepted"}
        first = account.account not in self.published
        self.published.add(account.account)
        if public and first:
            valid = [d for d in account.devices if d.certificate.is_valid_at(self.clock())]
            listed = {c.to_json() for c in state.certificates}
            signer = next((d for d in valid if d.certificate.to_json() in listed), None)
            if signer is not None:
                await self.publish_profile(account, signer, public_discovery=True)

    async def publish_profile(
        self, account: TestAccount, device: TestDevice | None = None, **fields: Any
    ) -> AccountProfile:
        """Sign a profile with ``device`` (default the first) and ``profile.publish`` it."""
        device = device or account.device()
        fields.setdefault("public_discovery", True)
        fields.setdefault("updated_at", self.clock())
        profile = sign_profile(device.keys, account.account, self.context, **fields)
        resp = await self.call(
            "profile.publish", profile.to_wire(), token=await self.login(account, device)
        )
        assert resp.status_code == 204, resp.text
        return profile


@contextlib.asynccontextmanager
async def start_relay(
    dsn: str, *, clock: Clock | None = None, **overrides: Any
) -> AsyncGenerator[RelayUnderTest]:
    clock = clock or Clock()
    settings: dict[str, Any] = {
        "dsn": dsn,
        "retention": 3600,
        "port": 0,
        "network_context": TEST_CONTEXT,
        "clock": clock,
        "cleanup_interval": 3600.0,
        "shutdown_timeout": 2.0,
    }
    settings.update(overrides)
    config = RelayConfig(**settings)
    async with RelayServer.start(config) as server, httpx.AsyncClient(timeout=30) as http:
        yield RelayUnderTest(
            server.url, server.ws_url, server.relay.relay_id, clock, http, server_=server
        )


def remote(proc: RelayProcess, http: httpx.AsyncClient) -> RelayUnderTest:
    """A relay process (``RelayProcess``) reached over HTTP, with the real clock."""
    return RelayUnderTest(proc.url, proc.ws_url, proc.relay_id, Clock(), http)


class WsClient:
    """A raw JSON-RPC WebSocket client that keeps notifications apart from responses."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.notifications: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._responses: dict[Any, asyncio.Future[dict[str, Any]]] = {}
        self._next = 0
        self._reader: asyncio.Task[None] | None = None

    @classmethod
    @contextlib.asynccontextmanager
    async def connect(cls, url: str, **kwargs: Any) -> AsyncGenerator[WsClient]:
        async with websockets.connect(url, max_size=None, **kwargs) as ws:
            client = cls(ws)
            client._reader = asyncio.create_task(client._read())
            try:
                yield client
            finally:
                client._reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await client._reader

    async def _read(self) -> None:
        with contextlib.suppress(websockets.ConnectionClosed):
            async for text in self.ws:
                msg = json.loads(text)
                if "id" in msg and msg["id"] in self._responses:
                    self._responses.pop(msg["id"]).set_result(msg)
                elif "method" in msg:
                    await self.notifications.put(msg)
                else:
                    await self.notifications.put({"unmatched": msg})

    async def request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        self._next += 1
        id_ = self._next
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._responses[id_] = fut
        msg: dict[str, Any] = {"jsonrpc": "2.0", "id": id_, "method": method}
        if params is not None:
            msg["params"] = params
        await self.ws.send(json.dumps(msg))
        return await asyncio.wait_for(fut, 30)

    async def result(self, method: str, params: dict[str, Any] | None = None) -> Any:
        msg = await self.request(method, params)
        assert "result" in msg, msg
        return msg["result"]
