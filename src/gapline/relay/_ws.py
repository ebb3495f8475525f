"""The WebSocket transport: JSON-RPC 2.0, one object per text frame, no batches.

Frames over the size limit are closed 1009 (by aiohttp's reader, configured with
``max_msg_size``); binary frames are closed 1003. Requests on one connection run
concurrently (at most ``ws_inflight`` at once) and answer out of order.

Time limits: the upgrade response must be written within ``handshake_timeout``; a
connection without a bound session (never authenticated, or its session revoked)
is closed 1008 after ``ws_auth_timeout``; the relay pings every ``ws_heartbeat``
seconds and closes a connection whose pong does not come back. A session-less call
is charged to the connection's address, a bound one to its session and account.

Back-pressure: every outbound message goes through a bounded queue drained by one
writer task. A response waits for room, which holds its request slot, which stops the
reader once ``ws_inflight`` slots are held, so a client that does not read its socket
stops being read. Notifications never wait: they are hints, so each kind is coalesced
to the newest value in one slot per connection.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING, Any

from aiohttp import WSCloseCode, WSMsgType, web

from gapline.meshline import MAX_SAFE_INTEGER, MeshlineError, parse_json
from gapline.relay._bounds import address_key, check_items
from gapline.relay._errors import (
    JSONRPC_INVALID_PARAMS,
    JSONRPC_INVALID_REQUEST,
    JSONRPC_METHOD_NOT_FOUND,
    JSONRPC_PARSE_ERROR,
    RelayFailure,
    jsonrpc_code,
)
from gapline.relay._http import failure_response, refuse
from gapline.relay._methods import Call, SessionMode
from gapline.relay._rpc import invoke, unexpected
from gapline.relay._store import Session

if TYPE_CHECKING:
    from gapline.relay._server import RelayServer

__all__ = ["WsConnection", "ws_handler"]

log = logging.getLogger("gapline.relay")

# How long one outbound message may wait for a slow client before the connection is closed.
SEND_TIMEOUT = 30.0

_NOTIFY = object()
_CLOSE = object()


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def _error(id_: Any, code: int, message: str, data: Any = None) -> str:
    err: dict[str, Any] = {"code": code, "message": message}
    if data:
        err["data"] = data
    return _dumps({"jsonrpc": "2.0", "id": id_, "error": err})


def _valid_id(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return abs(value) <= MAX_SAFE_INTEGER
    if isinstance(value, str):
        return len(value.encode("utf-8", "surrogatepass")) <= 128
    return False


class WsConnection:
    """One WebSocket client: its bound session, outbound queue and notification slots."""

    def __init__(self, server: RelayServer, ws: web.WebSocketResponse, remote: str) -> None:
        self.server = server
        self.ws = ws
        self.remote = remote
        self.session: Session | None = None
        self.token_hash: str | None = None
        self.notify_enabled = False
        self.outbound: asyncio.Queue[Any] = asyncio.Queue(maxsize=server.config.ws_queue)
        self._pending: dict[str, dict[str, Any]] = {}
        self._marker_queued = False
        self._outstanding: set[Any] = set()
        # Set once the connection has gone ws_auth_timeout without a bound session.
        self.auth_lapsed = asyncio.Event()
        self._auth_timeout: float | None = None
        self._auth_timer: asyncio.TimerHandle | None = None

    def bind(self, token_hash: str, session: Session) -> None:
        self.token_hash = token_hash
        self.session = session
        self.server.track(self)
        if self._auth_timer is not None:
            self._auth_timer.cancel()
            self._auth_timer = None

    def unbind(self) -> None:
        self.server.untrack(self)
        self.session = None
        self.token_hash = None
        self.notify_enabled = False
        self.require_auth(self._auth_timeout)

    def require_auth(self, timeout: float | None) -> None:
        """Close (via ``auth_lapsed``) unless a session is bound within ``timeout``; None: stop."""
        self._auth_timeout = timeout
        if self._auth_timer is not None:
            self._auth_timer.cancel()
            self._auth_timer = None
        if timeout is not None and self.session is None:
            self._auth_timer = asyncio.get_running_loop().call_later(timeout, self.auth_lapsed.set)

    def valid_session(self) -> Session | None:
        session = self.session
        if session is not None and session.expires_at <= self.server.config.clock():
            self.unbind()
            return None
        return session

    def notify(self, method: str, params: dict[str, Any]) -> None:
        """Queue a notification hint, coalescing with one not yet sent."""
        if method == "message.timeline.changed":
            if not self.notify_enabled:
                return
            prev = self._pending.get(method)
            if prev is not None and prev["head"] >= params["head"]:
                return
        elif method == "device.state.changed":
            prev = self._pending.get(method)
            if prev is not None and prev["revision"] >= params["revision"]:
                return
        self._pending[method] = params
        if not self._marker_queued:
            try:
                self.outbound.put_nowait(_NOTIFY)
                self._marker_queued = True
            except asyncio.QueueFull:
                pass  # the writer sends pending notifications after its next message

    async def _send(self, text: str) -> None:
        try:
            async with asyncio.timeout(SEND_TIMEOUT):
                await self.ws.send_str(text)
        except TimeoutError:
            # The client has not taken a message for SEND_TIMEOUT seconds: stop holding
            # resources for it ("try again later").
            await self.ws.close(code=WSCloseCode.TRY_AGAIN_LATER, message=b"reader too slow")
            raise ConnectionResetError("websocket reader too slow") from None

    async def writer(self) -> None:
        while True:
            item = await self.outbound.get()
            if item is _CLOSE:
                return
            if item is _NOTIFY:
                self._marker_queued = False
            else:
                await self._send(item)
            if self._pending and not self._marker_queued:
                pending, self._pending = self._pending, {}
                for method, params in pending.items():
                    await self._send(_dumps({"jsonrpc": "2.0", "method": method, "params": params}))
                    self.server.metrics.notifications.labels(method).inc()

    async def answer(self, text: str) -> None:
        await self.outbound.put(text)

    async def finish(self) -> None:
        """Stop the writer once it has sent everything queued before this."""
        await self.outbound.put(_CLOSE)

    async def handle_text(self, text: str) -> None:
        """Parse one frame and answer it; whatever happens, the frame gets one answer."""
        try:
            await self._handle_text(text)
        except Exception:  # noqa: BLE001 - logged with an error id by unexpected()
            failure = unexpected(self.server.metrics, "ws")
            await self.answer(
                _error(None, jsonrpc_code(failure.code), failure.message, failure.data)
            )

    async def _handle_text(self, text: str) -> None:
        server = self.server
        admission = server.admission
        # Every frame is charged, garbage included: to the bound session, else the address.
        session = self.valid_session()
        token = self.token_hash
        if session is not None and token is not None:
            payer, wait = token, admission.charge_verified(token, session.account)
        else:
            session = None
            payer, wait = self.remote, admission.charge_unverified(self.remote)
        id_, msg, problem = _check_frame(text)
        if wait:
            try:
                await refuse(server, payer, wait)
            except RelayFailure as exc:
                await self.answer(_error(id_, jsonrpc_code(exc.code), exc.message, exc.data))
            return
        if msg is None:
            if session is None:
                admission.failed_unverified(self.remote)
            code, message = problem or (JSONRPC_INVALID_REQUEST, "invalid request")
            await self.answer(_error(id_, code, message))
            return
        key = (type(id_).__name__, id_)
        if key in self._outstanding:
            await self.answer(
                _error(id_, JSONRPC_INVALID_REQUEST, "id is already outstanding on this connection")
            )
            return
        self._outstanding.add(key)
        try:
            await self._dispatch(id_, msg["method"], msg, session)
        finally:
            self._outstanding.discard(key)

    async def _dispatch(
        self, id_: Any, name: str, msg: dict[str, Any], session: Session | None
    ) -> None:
        server = self.server
        method = server.relay.methods.get(name)
        params = msg.get("params", {})
        call = Call(connection=self)
        try:
            if method is None:
                raise _ProtocolError(JSONRPC_METHOD_NOT_FOUND, f"no method {name[:100]!r}")
            if not isinstance(params, dict):
                raise _ProtocolError(JSONRPC_INVALID_PARAMS, "params must be an object")
            if method.session is not SessionMode.NONE:
                if session is None or self.token_hash is None:
                    raise RelayFailure("unauthorized", "authenticate this connection first")
                # A session revoked elsewhere (device removed) is gone from the store.
                if await server.session(self.token_hash) is None:
                    self.unbind()
                    raise RelayFailure("unauthorized", "session expired or revoked")
                call.session = session
            result = await invoke(
                method,
                call,
                params,
                server.metrics,
                "ws",
                quota=server.challenges,
                address=self.remote,
            )
        except (RelayFailure, _ProtocolError) as exc:
            if session is None and getattr(exc, "code", None) != "rate_limited":
                server.admission.failed_unverified(self.remote)
            if isinstance(exc, _ProtocolError):
                await self.answer(_error(id_, exc.rpc_code, exc.message))
            else:
                await self.answer(_error(id_, jsonrpc_code(exc.code), exc.message, exc.data))
            return
        except Exception:  # noqa: BLE001 - logged with an error id by unexpected()
            failure = unexpected(server.metrics, "ws", name)
            await self.answer(
                _error(id_, jsonrpc_code(failure.code), failure.message, failure.data)
            )
            return
        await self.answer(_dumps({"jsonrpc": "2.0", "id": id_, "result": result}))
        if name == "auth.device.verify":
            # Timeline notifications start after the first successful device verification,
            # and only after its response is queued.
            self.notify_enabled = True


class _ProtocolError(Exception):
    """A JSON-RPC protocol error (unknown method, params not an object)."""

    def __init__(self, rpc_code: int, message: str) -> None:
        super().__init__(message)
        self.rpc_code = rpc_code
        self.message = message


def _check_frame(text: str) -> tuple[Any, dict[str, Any] | None, tuple[int, str] | None]:
    """(id to answer with, the request object, or the protocol error to answer)."""
    try:
        msg = parse_json(text)
    except MeshlineError as exc:
        return None, None, (JSONRPC_PARSE_ERROR, f"parse error: {exc.message}")
    try:
        check_items(msg, text, "the frame")
    except RelayFailure as exc:
        return None, None, (JSONRPC_INVALID_REQUEST, exc.message)
    if not isinstance(msg, dict):
        return None, None, (JSONRPC_INVALID_REQUEST, "a request is one JSON object; no batches")
    raw_id = msg.get("id")
    if "id" not in msg or not _valid_id(raw_id):
        return (
            None,
            None,
            (
                JSONRPC_INVALID_REQUEST,
                "id: a string of at most 128 bytes or a safe integer is required",
            ),
        )
    if msg.get("jsonrpc") != "2.0" or not isinstance(msg.get("method"), str):
        return raw_id, None, (JSONRPC_INVALID_REQUEST, 'jsonrpc must be "2.0" and method a string')
    return raw_id, msg, None


def _only_disconnects(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return all(_only_disconnects(e) for e in exc.exceptions)
    return isinstance(exc, ConnectionError)


def ws_handler(server: RelayServer):
    config = server.config
    metrics = server.metrics

    async def handle(request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(
            max_msg_size=config.max_request_bytes, autoping=True, heartbeat=config.ws_heartbeat
        )
        address = address_key(request.remote)
        try:
            async with asyncio.timeout(config.handshake_timeout):
                await ws.prepare(request)
        except TimeoutError:
            metrics.timeouts.labels("handshake").inc()
            log.debug("websocket upgrade not written in time; closing", extra={"remote": address})
            request.protocol.force_close()
            return failure_response(RelayFailure("bad_request", "upgrade timed out"))
        conn = WsConnection(server, ws, address)
        metrics.ws_connections.inc()
        server.connections.add(conn)
        slots = asyncio.Semaphore(config.ws_inflight)
        try:
            async with asyncio.TaskGroup() as tg:
                writer = tg.create_task(conn.writer())

                async def run(text: str) -> None:
                    try:
                        await conn.handle_text(text)
                    finally:
                        slots.release()

                async def watch_auth() -> None:
                    await conn.auth_lapsed.wait()
                    metrics.timeouts.labels("ws_auth").inc()
                    log.debug(
                        "websocket not authenticated in time; closing",
                        extra={"remote": address, "timeout": config.ws_auth_timeout},
                    )
                    await ws.close(code=WSCloseCode.POLICY_VIOLATION, message=b"authenticate first")

                watchdog = tg.create_task(watch_auth())
                conn.require_auth(config.ws_auth_timeout)
                async for msg in ws:
                    if msg.type is WSMsgType.TEXT:
                        await slots.acquire()
                        tg.create_task(run(msg.data))
                    elif msg.type is WSMsgType.BINARY:
                        await ws.close(
                            code=WSCloseCode.UNSUPPORTED_DATA,
                            message=b"binary frames are not accepted",
                        )
                        break
                    else:
                        break
                conn.require_auth(None)
                watchdog.cancel()
                # Let in-flight requests finish, then stop the writer.
                for _ in range(config.ws_inflight):
                    await slots.acquire()
                await conn.finish()
                await writer
        except Exception as exc:  # noqa: BLE001 - a disconnect is one line; others unexpected()
            if _only_disconnects(exc):
                log.debug(
                    "websocket client went away",
                    extra={"remote": address, "reason": f"{type(exc).__name__}: {exc}"[:200]},
                )
            else:
                unexpected(metrics, "ws")
        finally:
            conn.require_auth(None)  # so the unbind below arms nothing
            conn.unbind()
            server.connections.discard(conn)
            metrics.ws_connections.dec()
            if not ws.closed:
                await ws.close()
        return ws

    return handle
