"""The key backup and cross-signing endpoints of `MatrixClient`, kept beside it as a mixin.

Glue like `_client_keys.py`: each builds a request (`_api_crypto`), sends it through
the client's one ``request`` path and parses the typed answer. `gapline.e2ee`
builds the bodies (encrypted sessions, signed keys); these methods carry them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, TypeVar

from . import _api_crypto as api
from ._api_crypto import (
    BackupVersionCreated,
    BackupVersionResponse,
    RoomKeysResponse,
    RoomKeysUpdateResponse,
    SignaturesUploadResponse,
)
from ._errors import NotFound
from ._request import Request
from ._responses import EmptyResponse

__all__ = ["BackupEndpoints"]

T = TypeVar("T")


class _Requester(Protocol):
    @property
    def user_id(self) -> str | None: ...

    async def request(self, request: Request, response_type: type[T]) -> T: ...


class BackupEndpoints:
    """``/room_keys/version``, ``/room_keys/keys``, ``/keys/device_signing/upload``,
    ``/keys/signatures/upload``."""

    async def backup_version_create(
        self: _Requester, algorithm: str, auth_data: Mapping[str, Any]
    ) -> str:
        """Create a backup version; its ID."""
        answer = await self.request(
            api.room_keys_version_create(algorithm, auth_data), BackupVersionCreated
        )
        return answer.version

    async def backup_version(
        self: _Requester, version: str | None = None
    ) -> BackupVersionResponse | None:
        """The current (or named) backup version, or ``None`` when there is none."""
        try:
            return await self.request(api.room_keys_version_get(version), BackupVersionResponse)
        except NotFound:
            return None

    async def backup_version_delete(self: _Requester, version: str) -> None:
        await self.request(api.room_keys_version_delete(version), EmptyResponse)

    async def room_keys_put(
        self: _Requester, version: str, rooms: Mapping[str, Mapping[str, Mapping[str, Any]]]
    ) -> RoomKeysUpdateResponse:
        return await self.request(api.room_keys_put(version, rooms), RoomKeysUpdateResponse)

    async def room_keys_get(self: _Requester, version: str) -> RoomKeysResponse:
        return await self.request(api.room_keys_get(version), RoomKeysResponse)

    async def device_signing_upload(
        self: _Requester, keys: Mapping[str, Mapping[str, Any]], *, password: str | None = None
    ) -> None:
        """Publish cross-signing keys, authenticating with the account password.

        The password stage is offered at once (no session first): the server opens the
        user-interactive session itself and finishes it with this one stage."""
        auth = None
        if password is not None:
            if self.user_id is None:
                raise ValueError("the client is not logged in")
            auth = api.password_auth(self.user_id, password)
        await self.request(api.device_signing_upload(keys, auth=auth), EmptyResponse)

    async def signatures_upload(
        self: _Requester, signed: Mapping[str, Mapping[str, Mapping[str, Any]]]
    ) -> SignaturesUploadResponse:
        return await self.request(api.signatures_upload(signed), SignaturesUploadResponse)
