"""WebSocket transport: JSON-RPC 2.0, one JSON object per text frame.

Responses may arrive out of order and interleaved with notifications
(requests without ``id``); a reader task owned by the transport matches
responses to pending calls and queues notifications. The session is bound to
the connection by authenticating on it, so ``call`` ignores tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import websockets
from websockets.asyncio.client import ClientConnection

from gapline.meshline._canonical import canonical_json, parse_json
from gapline.meshline._errors import MeshlineError, TransportError, error_from_code

__all__ = ["Notification", "WebSocketTransport"]

MAX_FRAME = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Notification:
    method: str
    params: Mapping[str, Any]


class WebSocketTransport:
    def __init__(self, connection: ClientConnection):
        self._ws = connection
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self.notifications: asyncio.Queue[Notification | None] = asyncio.Queue()
        self._reader = asyncio.create_task(self._read(), name="meshline-ws-reader")

    @classmethod
    async def connect(cls, url: str, *, open_timeout: float = 10.0) -> WebSocketTransport:
        try:
            connection = await websockets.connect(
                url, max_size=MAX_FRAME, open_timeout=open_timeout
            )
        except (OSError, TimeoutError, websockets.exceptions.WebSocketException) as exc:
            raise TransportError(f"cannot connect to {url}: {exc}") from exc
        return cls(connection)

    async def call(
        self, method: str, params: Mapping[str, Any] | None = None, *, session: str | None = None
    ) -> Any:
        if self._reader.done():
            raise TransportError("WebSocket connection closed")
        request_id = next(self._ids)
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = dict(params)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        try:
            await self._ws.send(canonical_json(message).decode())
            return await future
        except websockets.exceptions.ConnectionClosed as exc:
            raise TransportError(f"WebSocket closed: {exc}") from exc
        finally:
            self._pending.pop(request_id, None)

    async def _read(self) -> None:
        error: MeshlineError = TransportError("WebSocket connection closed")
        try:
            async for frame in self._ws:
                if isinstance(frame, bytes):
                    error = TransportError("relay sent a binary frame")
                    break
                self._dispatch(parse_json(frame))
        except websockets.exceptions.ConnectionClosed as exc:
            error = TransportError(f"WebSocket closed: {exc}")
        except MeshlineError as exc:
            error = TransportError(f"relay sent invalid JSON: {exc.message}")
        finally:
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(error)
            self.notifications.put_nowait(None)  # wakes a waiting consumer: connection over

    def _dispatch(self, message: Any) -> None:
        if not isinstance(message, dict):
            return
        if "id" not in message:
            if isinstance(message.get("method"), str):
                params = message.get("params")
                self.notifications.put_nowait(
                    Notification(message["method"], params if isinstance(params, dict) else {})
                )
            return
        future = self._pending.get(message["id"]) if isinstance(message["id"], int) else None
        if future is None or future.done():
            return
        if "error" in message and isinstance(message["error"], dict):
            err = message["error"]
            data = err.get("data") if isinstance(err.get("data"), dict) else None
            code = _CODE_BY_RPC.get(err.get("code"), "internal_error")
            future.set_exception(error_from_code(code, str(err.get("message", "")), data))
        else:
            future.set_result(message.get("result"))

    async def aclose(self) -> None:
        with contextlib.suppress(Exception):
            await self._ws.close()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader


def _rpc_codes() -> dict[int, str]:
    from gapline.meshline._errors import JSONRPC_CODE_BY_CODE

    codes = {rpc: code for code, rpc in JSONRPC_CODE_BY_CODE.items()}
    codes.update({-32700: "bad_request", -32600: "bad_request"})  # our frame was refused
    return codes


_CODE_BY_RPC = _rpc_codes()
