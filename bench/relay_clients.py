"""The bench's clients of a relay process: raw keep-alive HTTP requests and setup calls.

Used by ``bench/relay.py``. ``RawSender`` keeps the client's cost per request at a few
microseconds (an HTTP client library costs as much CPU per request as the relay on two
cores); ``Relay`` makes the setup calls (state, sessions, profiles) through aiohttp.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
import urllib.parse
from typing import Any

import aiohttp

from gapline.meshline import account_auth_input, device_auth_input, relay_origin, sign_profile
from gapline.meshline.testing import TEST_CONTEXT, TestAccount
from gapline.relay.devserver import RelayProcess

__all__ = ["RawSender", "Relay", "log"]


class RawSender:
    """One keep-alive HTTP/1.1 connection that sends pre-built requests and checks the answers.

    Deliberately minimal (see the module docstring): the relay's cost is the figure, so
    the client spends a few microseconds per request instead of an HTTP library's
    hundreds. It understands exactly what the relay sends back: a status line, headers
    with ``Content-Length``, and a JSON body.
    """

    def __init__(self, url: str, token: str | None = None) -> None:
        parts = urllib.parse.urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.base = parts.path
        self.path = parts.path + "/message/send"
        self.token = token
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    def request(self, body: bytes) -> bytes:
        """A ``message.send`` request (the session's token, ``body`` as its params)."""
        head = (
            f"POST {self.path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Content-Type: application/json\r\nX-Meshline-Session: {self.token}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        return head.encode() + body

    def get(self, method: str, query: dict[str, str] | None = None) -> bytes:
        """A GET request for a method without a session (``relay.info``, route lookups)."""
        target = self.base + "/" + method.replace(".", "/")
        if query:
            target += "?" + urllib.parse.urlencode(query)
        return f"GET {target} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n\r\n".encode()

    async def __aenter__(self) -> RawSender:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.writer is not None
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()

    async def call(self, request: bytes) -> bytes:
        """Send one request; its body, once the answer is a 200."""
        assert self.reader is not None and self.writer is not None
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        length = -1
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        if length < 0:
            raise RuntimeError(f"no Content-Length in {head!r}")
        body = await self.reader.readexactly(length)
        if not head.startswith(b"HTTP/1.1 200 "):
            status = head.split(b"\r\n", 1)[0]
            raise RuntimeError(f"{request.split(b' ', 2)[1]!r}: {status!r} {body!r}")
        return body

    async def send(self, request: bytes) -> None:
        body = await self.call(request)
        if json.loads(body).get("status") != "target_accepted":
            raise RuntimeError(f"message.send: unexpected result {body!r}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process (all its threads) from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class Relay:
    """A minimal HTTP client for one relay process."""

    def __init__(self, proc: RelayProcess, http: aiohttp.ClientSession) -> None:
        self.proc = proc
        self.http = http
        self.url = proc.url
        self.origin = relay_origin(proc.url)
        self.relay_id = proc.relay_id

    async def call(
        self, verb: str, method: str, params: Any = None, token: str | None = None
    ) -> Any:
        headers = {"X-Meshline-Session": token} if token else {}
        url = self.url + "/" + method.replace(".", "/")
        if verb == "GET":
            ctx = self.http.get(url, params=params or {}, headers=headers)
        elif isinstance(params, bytes):
            headers["Content-Type"] = "application/json"
            ctx = self.http.request(verb, url, data=params, headers=headers)
        else:
            ctx = self.http.request(verb, url, json=params, headers=headers)
        async with ctx as resp:
            body = await resp.json(content_type=None)
            if resp.status != 200:
                raise RuntimeError(f"{method}: {resp.status} {body}")
            return body

    async def account_token(self, account: TestAccount) -> str:
        """An account session (challenge, then ``auth.account.verify``)."""
        challenge = await self.call("POST", "auth.challenge", {"account": account.account})
        payload = account_auth_input(
            relay_id=self.relay_id,
            origin=self.origin,
            account=account.account,
            account_public_key=account.key.public_key_b64,
            nonce=challenge["nonce"],
        )
        creds = await self.call(
            "POST",
            "auth.account.verify",
            {
                "nonce": challenge["nonce"],
                "account_public_key": account.key.public_key_b64,
                "account_signature": account.key.sign_object(payload, TEST_CONTEXT, exclude=()),
            },
        )
        return str(creds["token"])

    async def publish(self, account: TestAccount) -> None:
        token = await self.account_token(account)
        await self.call("PUT", "device.state.publish", account.state.to_wire(), token)

    async def publish_profile(self, account: TestAccount, *, public_discovery: bool) -> None:
        """Publish the account's profile: public discovery decides who may write to it."""
        profile = sign_profile(
            account.device().keys,
            account.account,
            TEST_CONTEXT,
            public_discovery=public_discovery,
            updated_at=int(time.time()),
        )
        headers = {"X-Meshline-Session": await self.login(account)}
        url = self.url + "/profile/publish"
        async with self.http.put(url, json=profile.to_wire(), headers=headers) as resp:
            if resp.status != 204:
                raise RuntimeError(f"profile.publish: {resp.status} {await resp.text()}")

    def verify_params(self, account: TestAccount, nonce: str) -> dict[str, Any]:
        device = account.device()
        ts = int(time.time())
        payload = device_auth_input(
            relay_id=self.relay_id,
            origin=self.origin,
            account=account.account,
            device_id=device.device_id,
            nonce=nonce,
            timestamp=ts,
        )
        return {
            "nonce": nonce,
            "timestamp": ts,
            "signer_certificate": device.certificate.to_wire(),
            "device_signature": device.keys.sign_object(payload, TEST_CONTEXT, exclude=()),
        }

    async def login(self, account: TestAccount) -> str:
        challenge = await self.call("POST", "auth.challenge", {"account": account.account})
        creds = await self.call(
            "POST", "auth.device.verify", self.verify_params(account, challenge["nonce"])
        )
        return str(creds["token"])
