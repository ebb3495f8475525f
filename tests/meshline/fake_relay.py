"""A small in-test relay (aiohttp, 127.0.0.1) speaking the base-module wire format.

Enough of the timeline subset to exercise the client end to end over HTTP and
WebSocket, plus fault injection (temporary errors, dropped sockets, expired
sessions, retention gaps). The real relay is ``gapline.relay``; this fake only
exists so the client's tests do not depend on it.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import WSMsgType, web

from gapline.meshline import (
    HTTP_STATUS_BY_CODE,
    JSONRPC_CODE_BY_CODE,
    AccountDeviceState,
    AccountKey,
    DeviceCertificate,
    MeshlineError,
    NetworkContext,
    RelayError,
    SendParams,
    b64u_encode,
    canonical_json,
    parse_json,
    relay_origin,
    verify_account_auth,
    verify_certificate,
    verify_device_auth,
    verify_device_state,
    verify_envelope,
)


@dataclass
class Record:
    sequence: int
    envelope: dict[str, Any]
    boxes: dict[str, dict[str, Any]]
    accepted_at: int
    certificate: DeviceCertificate
    expired: bool = False


@dataclass
class FakeRelay:
    context: NetworkContext
    key: AccountKey = field(default_factory=AccountKey.generate)
    timelines: dict[str, list[Record]] = field(default_factory=dict)
    sessions: dict[str, tuple[str, str]] = field(default_factory=dict)
    certificates: dict[str, DeviceCertificate] = field(default_factory=dict)
    account_sessions: dict[str, str] = field(default_factory=dict)
    states: dict[str, AccountDeviceState] = field(default_factory=dict)
    challenges: dict[str, str] = field(default_factory=dict)
    fail_next: int = 0
    omit_certificates: bool = False
    clock_offset: int = 0  # this relay's clock minus real time
    clock_tolerance: int = 60
    calls: list[str] = field(default_factory=list)
    sockets: list[tuple[web.WebSocketResponse, str]] = field(default_factory=list)
    ws_authenticated: asyncio.Event = field(default_factory=asyncio.Event)
    base: str = ""
    ws_url: str = ""
    _runner: web.AppRunner | None = None
    _pushes: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def relay_id(self) -> str:
        return self.key.relay_id()

    async def start(self) -> FakeRelay:
        app = web.Application()
        app.router.add_route("*", "/meshline/v1/ws", self._ws)
        app.router.add_route("*", "/meshline/v1/{path:.+}", self._http)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.base = f"http://127.0.0.1:{port}/meshline/v1"
        self.ws_url = f"ws://127.0.0.1:{port}/meshline/v1/ws"
        return self

    async def stop(self) -> None:
        for ws, _ in list(self.sockets):
            await ws.close()
        if self._runner is not None:
            await self._runner.cleanup()

    # --- state changes used by tests ---------------------------------------------------------

    def append(self, params: SendParams, certificate: DeviceCertificate) -> None:
        """Accept a message.send as the relay would: recipient record + sent record."""
        env = params.envelope
        now = int(time.time())
        targets = [(env.to, params.recipient_boxes)]
        if params.sender_boxes is not None:
            targets.append((env.from_, params.sender_boxes))
        for account, boxes in targets:
            timeline = self.timelines.setdefault(account, [])
            seq = (timeline[-1].sequence + 1) if timeline else 0
            timeline.append(
                Record(
                    seq, env.to_wire(), {b.device_id: b.to_wire() for b in boxes}, now, certificate
                )
            )
            self._notify(account, seq)

    def expire(self, account: str, sequence: int) -> None:
        for record in self.timelines.get(account, []):
            if record.sequence == sequence:
                record.expired = True

    def drop_sessions(self) -> None:
        self.sessions.clear()

    def _notify(self, account: str, head: int) -> None:
        message = canonical_json(
            {"jsonrpc": "2.0", "method": "message.timeline.changed", "params": {"head": head}}
        ).decode()
        for ws, owner in list(self.sockets):
            if owner == account and not ws.closed:
                task = asyncio.get_running_loop().create_task(ws.send_str(message))
                self._pushes.add(task)  # keep a reference until sent
                task.add_done_callback(self._pushes.discard)

    # --- methods -----------------------------------------------------------------------------

    def _method(self, method: str, params: dict[str, Any], token: str | None, origin: str) -> Any:
        self.calls.append(method)
        if self.fail_next > 0:
            self.fail_next -= 1
            raise RelayError("temporarily_unavailable", "injected fault")
        if method == "relay.info":
            return {
                "relay_id": self.relay_id,
                "name": "fake",
                "server_time": int(time.time()),
                "limits": {"message_retention": 86400},
            }
        if method == "auth.challenge":
            nonce = b64u_encode(os.urandom(32))
            self.challenges[nonce] = params["account"]
            return {
                "nonce": nonce,
                "created_at": int(time.time()) + self.clock_offset,
                "expires_at": int(time.time()) + self.clock_offset + 300,
            }
        if method == "auth.device.verify":
            account = self.challenges.pop(params["nonce"], None)
            if account is None:
                raise RelayError("unauthorized", "unknown nonce")
            if (
                abs(params["timestamp"] - (int(time.time()) + self.clock_offset))
                > self.clock_tolerance
            ):
                raise RelayError("clock_skew", "timestamp outside tolerance")
            cert = DeviceCertificate.from_wire(params["signer_certificate"])
            device_id = verify_certificate(cert, self.context)
            verify_device_auth(
                params["device_signature"],
                signing_public_key=cert.signing_key_bytes,
                context=self.context,
                relay_id=self.relay_id,
                origin=origin,
                account=account,
                device_id=device_id,
                nonce=params["nonce"],
                timestamp=params["timestamp"],
            )
            self.certificates[device_id] = cert
            self.certificates[device_id] = cert
            token = b64u_encode(os.urandom(16))
            self.sessions[token] = (account, device_id)
            return {"token": token, "mode": "device", "expires_at": cert.expires_at}
        if method == "auth.account.verify":
            account = self.challenges.pop(params["nonce"], None)
            if account is None:
                raise RelayError("unauthorized", "unknown nonce")
            verify_account_auth(
                params["account_signature"],
                account_public_key=params["account_public_key"],
                context=self.context,
                relay_id=self.relay_id,
                origin=origin,
                account=account,
                nonce=params["nonce"],
            )
            token = b64u_encode(os.urandom(16))
            self.account_sessions[token] = account
            return {"token": token, "mode": "account", "expires_at": int(time.time()) + 600}
        if method == "device.state.publish" and token in self.account_sessions:
            state = AccountDeviceState.from_wire(params)
            if state.account != self.account_sessions[token]:
                raise RelayError("forbidden", "another account's state")
            verify_device_state(state, self.context)
            self.states[state.account] = state
            return {"status": "accepted"}
        if token not in self.sessions:
            raise RelayError("unauthorized", "no session")
        account, device_id = self.sessions[token]
        if method == "message.timeline.sync":
            return self._sync(
                account, device_id, int(params.get("after", -1)), int(params.get("limit", 100))
            )
        if method == "message.send":
            send = SendParams.from_wire(params)
            env = send.envelope
            if (env.from_, env.from_device_id) != (account, device_id):
                raise RelayError("forbidden", "envelope is not from the session's device")
            cert = self.certificates[device_id]
            verify_envelope(env, cert.signing_key_bytes, self.context)
            self.append(send, cert)
            return {"status": "target_accepted", "accepted_at": int(time.time())}
        raise RelayError("method_not_found", method)

    def _sync(self, account: str, device_id: str, after: int, limit: int) -> dict[str, Any]:
        timeline = self.timelines.get(account, [])
        head = timeline[-1].sequence if timeline else -1
        if not -1 <= after <= head:
            raise RelayError("bad_request", "after out of range")
        visible = [r for r in timeline if r.sequence > after and device_id in r.boxes]
        gap = any(r.expired for r in visible)
        readable = [r for r in visible if not r.expired]
        page = readable[:limit]
        certs: dict[str, dict[str, Any]] = {}
        for r in page:
            certs[r.envelope["from_device_id"]] = r.certificate.to_wire()
        result: dict[str, Any] = {
            "items": [
                {
                    "sequence": r.sequence,
                    "envelope": r.envelope,
                    "key_box": r.boxes[device_id],
                    "accepted_at": r.accepted_at,
                }
                for r in page
            ],
            "certificates": [] if self.omit_certificates else list(certs.values()),
            "has_more": len(readable) > len(page),
        }
        if gap:
            result["has_retention_gap"] = True
        return result

    # --- transports --------------------------------------------------------------------------

    async def _http(self, request: web.Request) -> web.Response:
        method = request.match_info["path"].replace("/", ".")
        try:
            if request.method == "GET":
                params: dict[str, Any] = {
                    k: (int(v) if v.lstrip("-").isdigit() else v) for k, v in request.query.items()
                }
            else:
                body = await request.read()
                params = parse_json(body) if body else {}
            origin = relay_origin(self.base)
            result = self._method(method, params, request.headers.get("X-Meshline-Session"), origin)
        except MeshlineError as exc:
            return web.Response(
                status=HTTP_STATUS_BY_CODE.get(exc.code, 400),
                body=canonical_json({"code": exc.code, "message": exc.message}),
                content_type="application/json",
            )
        if result is None:
            return web.Response(status=204)
        return web.Response(body=canonical_json(result), content_type="application/json")

    async def _ws(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        token: str | None = None
        entry: tuple[web.WebSocketResponse, str] | None = None
        try:
            async for msg in ws:
                if msg.type != WSMsgType.TEXT:
                    await ws.close(code=1003)
                    break
                req = parse_json(msg.data)
                try:
                    result = self._method(
                        req["method"], req.get("params", {}), token, relay_origin(self.ws_url)
                    )
                    if req["method"] == "auth.device.verify":
                        token = result["token"]
                        entry = (ws, self.sessions[token][0])
                        self.sockets.append(entry)
                        self.ws_authenticated.set()
                    reply = {"jsonrpc": "2.0", "id": req["id"], "result": result}
                except MeshlineError as exc:
                    reply = {
                        "jsonrpc": "2.0",
                        "id": req["id"],
                        "error": {
                            "code": JSONRPC_CODE_BY_CODE.get(exc.code, -32603),
                            "message": exc.message,
                        },
                    }
                await ws.send_str(canonical_json(reply).decode())
        finally:
            if entry in self.sockets:
                self.sockets.remove(entry)  # type: ignore[arg-type]
        return ws
