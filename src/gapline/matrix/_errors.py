"""The exceptions `gapline.matrix` raises.

Every failure that crosses the package boundary is one of these, so callers
catch a small, closed set instead of httpx or msgspec internals::

    MatrixError                      base of everything below
    ├── MatrixHTTPError              the server answered with an error status
    │   │                            (status, errcode, error, retry_after_ms)
    │   ├── UnknownToken             M_UNKNOWN_TOKEN: the access token is dead; log in again
    │   ├── Forbidden                M_FORBIDDEN / 403: not allowed (not joined, bad password...)
    │   ├── NotFound                 M_NOT_FOUND / 404 (unknown event, room, ...)
    │   └── RateLimited              M_LIMIT_EXCEEDED / 429 still refused after retries
    ├── MatrixUnavailable            no usable answer: timeout, connection refused or reset,
    │                                5xx after the bounded retries were spent
    └── MatrixProtocolError          the answer was not what the spec promises
                                     (not JSON, truncated, wrong shape)

Why a tree rather than result unions (as matrix-nio has): a forgotten check on
a ``Response | Error`` silently carries on; a forgotten ``except`` fails loudly.
"""

from __future__ import annotations

__all__ = [
    "Forbidden",
    "MatrixError",
    "MatrixHTTPError",
    "MatrixProtocolError",
    "MatrixUnavailable",
    "NotFound",
    "RateLimited",
    "UnknownToken",
]


class MatrixError(Exception):
    """Base class of every error raised by `gapline.matrix`."""


class MatrixHTTPError(MatrixError):
    """The homeserver answered with a non-2xx status and (usually) a Matrix error body."""

    def __init__(
        self,
        status: int,
        errcode: str | None = None,
        error: str | None = None,
        retry_after_ms: int | None = None,
    ) -> None:
        self.status = status
        self.errcode = errcode
        self.error = error
        self.retry_after_ms = retry_after_ms
        parts = [f"HTTP {status}"]
        if errcode:
            parts.append(errcode)
        if error:
            parts.append(error)
        super().__init__(": ".join(parts))

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(status={self.status!r}, errcode={self.errcode!r}, "
            f"error={self.error!r}, retry_after_ms={self.retry_after_ms!r})"
        )


class UnknownToken(MatrixHTTPError):
    """``M_UNKNOWN_TOKEN``: the access token was revoked or never existed.

    ``soft_logout`` is the server's ``soft_logout`` flag: true when only the token
    expired and the device (its keys, its sync position) waits for a new login with the
    same device ID; false when the device itself is gone.
    """

    def __init__(
        self,
        status: int,
        errcode: str | None = None,
        error: str | None = None,
        retry_after_ms: int | None = None,
        *,
        soft_logout: bool = False,
    ) -> None:
        super().__init__(status, errcode, error, retry_after_ms)
        self.soft_logout = soft_logout


class Forbidden(MatrixHTTPError):
    """``M_FORBIDDEN`` (or a bare 403): the server refuses this user this action."""


class NotFound(MatrixHTTPError):
    """``M_NOT_FOUND`` (or a bare 404)."""


class RateLimited(MatrixHTTPError):
    """``M_LIMIT_EXCEEDED`` / 429 that outlasted the client's retry policy."""


class MatrixUnavailable(MatrixError):
    """No usable answer: timeout, connection failure, or 5xx after the retries ran out.

    ``status`` is the last HTTP status seen (``None`` when no response came back).
    """

    def __init__(self, message: str, *, status: int | None = None) -> None:
        self.status = status
        super().__init__(message)


class MatrixProtocolError(MatrixError):
    """The server's answer broke the spec: not JSON, truncated, or the wrong shape."""


def error_for_status(
    status: int,
    errcode: str | None,
    error: str | None,
    retry_after_ms: int | None,
    *,
    soft_logout: bool = False,
) -> MatrixHTTPError:
    """Pick the most specific `MatrixHTTPError` subclass for an error answer."""
    cls: type[MatrixHTTPError] = MatrixHTTPError
    if errcode == "M_UNKNOWN_TOKEN":
        return UnknownToken(status, errcode, error, retry_after_ms, soft_logout=soft_logout)
    if errcode == "M_LIMIT_EXCEEDED" or status == 429:
        cls = RateLimited
    elif errcode == "M_NOT_FOUND" or (status == 404 and errcode is None):
        cls = NotFound
    elif errcode == "M_FORBIDDEN" or (status == 403 and errcode is None):
        cls = Forbidden
    return cls(status, errcode, error, retry_after_ms)
