"""The end-to-end encryption endpoints of `MatrixClient`, kept beside it as a mixin.

Each method is glue like the rest of the client (build a `Request`, send it through
the client's one ``request`` path, parse the typed answer), so retries, rate limits
and the ``Authorization`` header follow the same policy. `gapline.e2ee` builds most
of these requests itself and sends them with ``MatrixClient.request``; these methods
are for callers (tests, tools) that talk to the key endpoints directly.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol, TypeVar

from . import _api
from ._request import Request
from ._responses import (
    EmptyResponse,
    KeysChangesResponse,
    KeysClaimResponse,
    KeysQueryResponse,
    KeysUploadResponse,
)

__all__ = ["KeysEndpoints"]

T = TypeVar("T")


class _Requester(Protocol):
    async def request(self, request: Request, response_type: type[T]) -> T: ...


class KeysEndpoints:
    """``/keys/upload``, ``/keys/query``, ``/keys/claim``, ``/keys/changes``, ``/sendToDevice``."""

    async def keys_upload(
        self: _Requester,
        *,
        device_keys: Mapping[str, Any] | None = None,
        one_time_keys: Mapping[str, Any] | None = None,
        fallback_keys: Mapping[str, Any] | None = None,
    ) -> KeysUploadResponse:
        return await self.request(
            _api.keys_upload(
                device_keys=device_keys, one_time_keys=one_time_keys, fallback_keys=fallback_keys
            ),
            KeysUploadResponse,
        )

    async def keys_query(
        self: _Requester, device_keys: Mapping[str, Iterable[str]], *, timeout_ms: int | None = None
    ) -> KeysQueryResponse:
        return await self.request(
            _api.keys_query(device_keys, timeout_ms=timeout_ms), KeysQueryResponse
        )

    async def keys_claim(
        self: _Requester,
        one_time_keys: Mapping[str, Mapping[str, str]],
        *,
        timeout_ms: int | None = None,
    ) -> KeysClaimResponse:
        return await self.request(
            _api.keys_claim(one_time_keys, timeout_ms=timeout_ms), KeysClaimResponse
        )

    async def keys_changes(self: _Requester, from_: str, to: str) -> KeysChangesResponse:
        return await self.request(_api.keys_changes(from_, to), KeysChangesResponse)

    async def send_to_device(
        self: _Requester,
        event_type: str,
        messages: Mapping[str, Mapping[str, Mapping[str, Any]]],
        txn_id: str,
    ) -> None:
        """Send to-device messages; a stable ``txn_id`` makes a resend after a crash
        deliver once."""
        await self.request(_api.send_to_device(event_type, messages, txn_id), EmptyResponse)
