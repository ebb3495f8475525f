"""The typed error tree of gapline.meshline.

::

    MeshlineError                 code: the spec's error code string
    ├── RelayError                an error a relay answered (any code, incl. unknown ones)
    │   └── RateLimited           rate_limited, carries retry_after
    ├── BadRequest                bad_request: malformed or non-canonical input
    │   ├── WireContextForbidden  a wire object carried the reserved ``$context``
    │   └── RequestTooLarge       request_too_large: an object exceeds its size limit
    ├── InvalidSignature          invalid_signature: a signature or binding check failed
    ├── Forbidden                 forbidden: a valid identity lacks the permission
    ├── ClockSkew                 clock_skew: a creation/update time is too far from ours
    ├── StaleState                stale_state: older than what is stored
    ├── StateConflict             state_conflict: same revision, other content (or no usable state)
    ├── InvalidState              invalid_state: an unresolved same-revision route conflict
    ├── NotFound                  not_found: no such route, profile or object
    ├── DeviceUnknown             device_unknown: no currently valid device to address
    ├── DecryptionFailed          a key box or payload did not authenticate (local only)
    ├── InvalidPage               a sync page broke the response rules (local only)
    └── TransportError            the relay could not be reached or spoke garbage (local only)

Codes are the spec's (``methods/conventions.md``); clients branch on ``code``,
never on HTTP status or message text. Local-only codes never go on the wire.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "HTTP_STATUS_BY_CODE",
    "JSONRPC_CODE_BY_CODE",
    "BadRequest",
    "ClockSkew",
    "DecryptionFailed",
    "DeviceUnknown",
    "Forbidden",
    "InvalidPage",
    "InvalidSignature",
    "InvalidState",
    "MeshlineError",
    "NotFound",
    "RateLimited",
    "RelayError",
    "RequestTooLarge",
    "StaleState",
    "StateConflict",
    "TransportError",
    "WireContextForbidden",
    "error_from_code",
]

# HTTP status for every spec error code (conventions.md "HTTP status").
HTTP_STATUS_BY_CODE: Mapping[str, int] = {
    "bad_request": 400,
    "invalid_signature": 400,
    "device_unknown": 400,
    "clock_skew": 400,
    "stale_state": 400,
    "invalid_state": 400,
    "message_expired": 400,
    "target_not_local": 400,
    "route_stale": 400,
    "unauthorized": 401,
    "forbidden": 403,
    "not_found": 404,
    "route_not_found": 404,
    "state_conflict": 409,
    "request_too_large": 413,
    "rate_limited": 429,
    "internal_error": 503,
    "bad_gateway": 503,
    "temporarily_unavailable": 503,
}

# JSON-RPC error code for every spec error code (conventions.md "WebSocket").
JSONRPC_CODE_BY_CODE: Mapping[str, int] = {
    "bad_request": -32602,
    "method_not_found": -32601,
    "internal_error": -32603,
    "unauthorized": -32001,
    "forbidden": -32003,
    "invalid_signature": -32004,
    "device_unknown": -32005,
    "clock_skew": -32006,
    "not_found": -32010,
    "state_conflict": -32011,
    "stale_state": -32012,
    "invalid_state": -32013,
    "message_expired": -32014,
    "request_too_large": -32015,
    "target_not_local": -32020,
    "route_stale": -32021,
    "route_not_found": -32022,
    "bad_gateway": -32023,
    "rate_limited": -32030,
    "temporarily_unavailable": -32031,
}


class MeshlineError(Exception):
    """Base of every gapline.meshline error; ``code`` is the spec's error code."""

    code: str = "internal_error"

    def __init__(
        self, message: str, *, code: str | None = None, data: Mapping[str, Any] | None = None
    ):
        super().__init__(message)
        if code is not None:
            self.code = code
        self.message = message
        self.data: Mapping[str, Any] | None = data

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, message={self.message!r})"


class BadRequest(MeshlineError):
    code = "bad_request"


class WireContextForbidden(BadRequest):
    """A transmitted object carried ``$context``, which exists only in local inputs."""


class RequestTooLarge(BadRequest):
    code = "request_too_large"


class InvalidSignature(MeshlineError):
    code = "invalid_signature"


class Forbidden(MeshlineError):
    code = "forbidden"


class ClockSkew(MeshlineError):
    code = "clock_skew"


class StaleState(MeshlineError):
    code = "stale_state"


class StateConflict(MeshlineError):
    code = "state_conflict"


class InvalidState(MeshlineError):
    code = "invalid_state"


class NotFound(MeshlineError):
    code = "not_found"


class DeviceUnknown(MeshlineError):
    code = "device_unknown"


class DecryptionFailed(MeshlineError):
    code = "decryption_failed"


class InvalidPage(MeshlineError):
    """A ``message.timeline.sync`` page that must not be applied at all."""

    code = "invalid_page"


class TransportError(MeshlineError):
    code = "transport_error"


class RelayError(MeshlineError):
    """An error answered by a relay, as its ``RelayError`` object said."""

    def __init__(self, code: str, message: str, data: Mapping[str, Any] | None = None):
        super().__init__(message, code=code, data=data)


class RateLimited(RelayError):
    @property
    def retry_after(self) -> int | None:
        value = (self.data or {}).get("retry_after")
        return (
            value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
        )


def error_from_code(code: str, message: str, data: Mapping[str, Any] | None = None) -> RelayError:
    """The typed error for a relay's ``RelayError`` object."""
    if code == "rate_limited":
        return RateLimited(code, message, data)
    return RelayError(code, message, data)
