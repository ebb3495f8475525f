"""How a failure reads to a user: one line saying what failed and, where it helps, what to do.

The engine answers ``Failed(message)`` and publishes failed outcomes with these
lines; the homeserver's and the store's own exceptions never reach a user raw.
"""

from __future__ import annotations

from gapline.matrix import MatrixHTTPError, MatrixProtocolError, MatrixUnavailable, UnknownToken
from gapline.storage import StorageError

__all__ = ["describe"]


def describe(exc: BaseException) -> str:
    """A readable one-line message for a failure a user may see."""
    if isinstance(exc, UnknownToken):
        if exc.soft_logout:
            return (
                f"the session expired ({exc}); log in again (`gapline login`): "
                "the same device resumes"
            )
        return f"the homeserver no longer accepts this session ({exc}); log in again"
    if isinstance(exc, MatrixUnavailable):
        return f"the homeserver is unavailable: {exc}"
    if isinstance(exc, MatrixProtocolError):
        return f"the homeserver sent an answer gapline cannot read: {exc}"
    if isinstance(exc, MatrixHTTPError):
        return f"the homeserver refused the request: {exc}"
    if isinstance(exc, StorageError):
        return f"the history store failed: {exc}"
    return f"{type(exc).__name__}: {exc}"
