"""The relay's failures and how each transport spells them.

A method handler raises :class:`RelayFailure` with one of the spec's string
codes (``methods/conventions.md`` "Error Codes"). The HTTP transport answers
it as a ``RelayError`` body with the mapped status; the WebSocket transport as
a JSON-RPC error object with the mapped integer code. Any other exception is
logged and answered ``internal_error``: no traceback reaches a client.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from typing import Any

from gapline.meshline import HTTP_STATUS_BY_CODE, JSONRPC_CODE_BY_CODE, MeshlineError

__all__ = [
    "JSONRPC_INVALID_PARAMS",
    "JSONRPC_INVALID_REQUEST",
    "JSONRPC_METHOD_NOT_FOUND",
    "JSONRPC_PARSE_ERROR",
    "RelayFailure",
    "failure_from_meshline",
    "http_status",
    "internal_failure",
    "jsonrpc_code",
]

# JSON-RPC protocol errors (conventions.md "Protocol Error Codes").
JSONRPC_PARSE_ERROR = -32700
JSONRPC_INVALID_REQUEST = -32600
JSONRPC_METHOD_NOT_FOUND = -32601
JSONRPC_INVALID_PARAMS = -32602


class RelayFailure(Exception):
    """A method failed with a spec error code; ``data`` is the optional machine-readable detail."""

    def __init__(self, code: str, message: str, data: Mapping[str, Any] | None = None) -> None:
        if code not in HTTP_STATUS_BY_CODE and code != "method_not_found":
            raise ValueError(f"not a relay error code: {code!r}")
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = dict(data) if data else None

    def to_relay_error(self) -> dict[str, Any]:
        """The ``RelayError`` object for an HTTP body."""
        body: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data:
            body["data"] = self.data
        return body

    def __repr__(self) -> str:
        return f"RelayFailure({self.code!r}, {self.message!r})"


def http_status(code: str) -> int:
    if code == "method_not_found":
        return 404
    return HTTP_STATUS_BY_CODE.get(code, 400)


def jsonrpc_code(code: str) -> int:
    if code == "method_not_found":
        return JSONRPC_METHOD_NOT_FOUND
    return JSONRPC_CODE_BY_CODE.get(code, JSONRPC_INVALID_PARAMS)


def failure_from_meshline(exc: MeshlineError) -> RelayFailure:
    """A protocol-library validation error, as the failure the relay answers.

    Local-only codes of the library (decryption, page checks) never reach the
    relay's request path; were one to, it is a malformed request.
    """
    code = exc.code if exc.code in HTTP_STATUS_BY_CODE else "bad_request"
    return RelayFailure(code, exc.message, exc.data)


def internal_failure() -> RelayFailure:
    """``internal_error`` with a fresh ``data.error_id``: the one log record of the
    failure carries the same id, so an operator finds it from the client's report."""
    return RelayFailure(
        "internal_error", "unexpected relay failure", {"error_id": secrets.token_hex(8)}
    )
