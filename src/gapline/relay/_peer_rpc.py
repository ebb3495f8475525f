"""Relay RPC (``/meshline/relay/1.0.0``): one JSON-RPC request or notification per stream.

The target side reads one frame (framing failures reset the stream, no answer), parses
it strictly, checks the envelope (``jsonrpc``, ``id`` ≤ 128 UTF-8 bytes or a safe
integer, ``method``, ``params`` an object when present), runs the method with the
authenticated peer, and writes one response frame before closing. The source side
correlates the answer with its own stream and checks the echoed ``id``.
"""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from gapline.meshline import MeshlineError, parse_json
from gapline.relay._errors import (
    JSONRPC_INVALID_PARAMS,
    JSONRPC_INVALID_REQUEST,
    JSONRPC_METHOD_NOT_FOUND,
    JSONRPC_PARSE_ERROR,
    RelayFailure,
    failure_from_meshline,
    jsonrpc_code,
)
from gapline.relay._p2p._channel import Buffered
from gapline.relay._p2p._frames import FramingError, encode_frame, read_frame
from gapline.relay._p2p._host import Connection, VerifiedPeer
from gapline.relay._p2p._yamux import YamuxStream

__all__ = [
    "RELAY_PROTOCOL",
    "PeerCallError",
    "PeerMethod",
    "PeerRpcServer",
    "call_peer",
    "call_peer_json",
    "notify_peer",
]

RELAY_PROTOCOL = "/meshline/relay/1.0.0"
_SAFE = 2**53 - 1
_CODE_BY_NUMBER: dict[int, str] = {}

log = logging.getLogger("gapline.relay.peer_rpc")

PeerMethod = Callable[[VerifiedPeer, dict[str, Any]], Awaitable[Any]]


class PeerCallError(Exception):
    """The target relay answered with a JSON-RPC error (``number``, and ``code`` if known)."""

    def __init__(self, number: int, message: str, data: Any = None) -> None:
        super().__init__(f"{number}: {message}")
        self.number, self.message, self.data = number, message, data
        self.code = _code_of(number)


def _code_of(number: int) -> str | None:
    if not _CODE_BY_NUMBER:
        from gapline.meshline import JSONRPC_CODE_BY_CODE

        _CODE_BY_NUMBER.update({v: k for k, v in JSONRPC_CODE_BY_CODE.items()})
    return _CODE_BY_NUMBER.get(number)


def _valid_id(value: object) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return -_SAFE <= value <= _SAFE
    return isinstance(value, str) and len(value.encode()) <= 128


def _error(request_id: object, number: int, message: str, data: Any = None) -> bytes:
    error: dict[str, Any] = {"code": number, "message": message}
    if data is not None:
        error["data"] = data
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "error": error}).encode()


class PeerRpcServer:
    def __init__(self, methods: dict[str, PeerMethod], *, business_limit: int) -> None:
        self._methods = methods
        self._limit = business_limit

    async def handle(self, stream: YamuxStream, incoming: Buffered, peer: VerifiedPeer) -> None:
        try:
            frame = await read_frame(incoming)
        except FramingError as exc:
            log.info("relay RPC stream from %s reset: %s", peer.peer_id_text, exc)
            stream.reset()
            return
        answer = await self._answer(frame, peer)
        if answer is not None:
            await stream.write(encode_frame(answer))
        await stream.close()

    async def _answer(self, frame: bytes, peer: VerifiedPeer) -> bytes | None:
        try:
            request = parse_json(frame)
        except MeshlineError as exc:
            return _error(None, JSONRPC_PARSE_ERROR, exc.message)
        if not isinstance(request, dict):
            return _error(None, JSONRPC_INVALID_REQUEST, "not a request object")
        notification = "id" not in request
        request_id = request.get("id")
        if not notification and not _valid_id(request_id):
            return _error(None, JSONRPC_INVALID_REQUEST, "invalid id")
        method = request.get("method")
        if request.get("jsonrpc") != "2.0" or not isinstance(method, str):
            return None if notification else _error(request_id, JSONRPC_INVALID_REQUEST, "bad")
        params = request.get("params", {})
        if not isinstance(params, dict):
            return None if notification else _error(request_id, JSONRPC_INVALID_PARAMS, "params")
        handler = self._methods.get(method)
        if handler is None:
            return None if notification else _error(request_id, JSONRPC_METHOD_NOT_FOUND, method)
        if len(frame) > self._limit:
            failure = RelayFailure("request_too_large", "params over the business size limit")
            return None if notification else self._failure(request_id, failure)
        try:
            result = await handler(peer, params)
        except RelayFailure as exc:
            return None if notification else self._failure(request_id, exc)
        except MeshlineError as exc:
            return None if notification else self._failure(request_id, failure_from_meshline(exc))
        except Exception:
            log.exception("relay RPC %s from %s failed", method, peer.peer_id_text)
            failure = RelayFailure("internal_error", "the relay failed to process the request")
            return None if notification else self._failure(request_id, failure)
        if notification:
            return None
        return json.dumps({"jsonrpc": "2.0", "id": request_id, "result": result}).encode()

    @staticmethod
    def _failure(request_id: object, exc: RelayFailure) -> bytes:
        return _error(request_id, jsonrpc_code(exc.code), exc.message, exc.data)


_ids = itertools.count(1)


async def notify_peer(conn: Connection, method: str, params: dict[str, Any]) -> None:
    """One notification on a new stream: the frame, then close; no answer is read."""
    body = {"jsonrpc": "2.0", "method": method, "params": params}
    stream, _ = await conn.open(RELAY_PROTOCOL, encode_frame(json.dumps(body).encode()))
    await stream.close()


async def call_peer(conn: Connection, method: str, params: dict[str, Any]) -> Any:
    """One request on a new stream; the result, or ``PeerCallError``."""
    return await call_peer_json(conn, method, json.dumps(params))


async def call_peer_json(conn: Connection, method: str, params: str) -> Any:
    """``call_peer`` with params already JSON text (an object), sent as it is."""
    request_id = next(_ids)
    head = json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method})
    body = head[:-1] + ', "params": ' + params + "}"
    stream, incoming = await conn.open(RELAY_PROTOCOL, encode_frame(body.encode()))
    await stream.close()
    response = parse_json(await read_frame(incoming))
    if not isinstance(response, dict) or response.get("jsonrpc") != "2.0":
        raise PeerCallError(JSONRPC_INVALID_REQUEST, "malformed response")
    if "error" in response:
        error = response["error"]
        if not isinstance(error, dict) or not isinstance(error.get("code"), int):
            raise PeerCallError(JSONRPC_INVALID_REQUEST, "malformed error response")
        if response.get("id") not in (request_id, None):
            raise PeerCallError(JSONRPC_INVALID_REQUEST, "response id is not the request's")
        raise PeerCallError(error["code"], str(error.get("message", "")), error.get("data"))
    if response.get("id") != request_id or "result" not in response:
        raise PeerCallError(JSONRPC_INVALID_REQUEST, "response id is not the request's")
    return response["result"]
