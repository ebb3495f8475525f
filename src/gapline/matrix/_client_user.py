"""What a user keeps and shows beside room events, as a mixin of `MatrixClient`.

Read markers and receipts, account data, media, typing, reactions and the display
name. Glue like the rest of the client: build a `Request`, send it through the
client's one ``request`` path, parse the typed answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, TypeVar

from . import _api
from ._errors import MatrixError
from ._request import Request
from ._responses import EmptyResponse, UploadResponse

__all__ = ["UserEndpoints"]

T = TypeVar("T")


class _Client(Protocol):
    @property
    def user_id(self) -> str | None: ...

    async def request(self, request: Request, response_type: type[T]) -> T: ...

    async def request_bytes(self, request: Request) -> bytes: ...

    async def send_event(
        self,
        room_id: str,
        event_type: str,
        content: Mapping[str, Any],
        txn_id: str | None = None,
    ) -> str: ...

    def _me(self) -> str: ...


class UserEndpoints:
    """Markers, receipts, account data, media, typing, reactions, display name."""

    # -- markers and account data ----------------------------------------------------------

    async def set_read_markers(
        self: _Client,
        room_id: str,
        *,
        fully_read: str | None = None,
        read: str | None = None,
        read_private: str | None = None,
    ) -> None:
        await self.request(
            _api.set_read_markers(
                room_id, fully_read=fully_read, read=read, read_private=read_private
            ),
            EmptyResponse,
        )

    async def send_receipt(
        self: _Client,
        room_id: str,
        event_id: str,
        *,
        receipt_type: str = "m.read",
        thread_id: str | None = None,
    ) -> None:
        await self.request(
            _api.send_receipt(room_id, event_id, receipt_type=receipt_type, thread_id=thread_id),
            EmptyResponse,
        )

    def _me(self: _Client) -> str:
        if self.user_id is None:
            raise MatrixError("account data needs a login first")
        return self.user_id

    async def account_data(
        self: _Client, data_type: str, *, room_id: str | None = None
    ) -> dict[str, Any]:
        return await self.request(_api.account_data(self._me(), data_type, room_id=room_id), dict)

    async def put_account_data(
        self: _Client, data_type: str, content: Mapping[str, Any], *, room_id: str | None = None
    ) -> None:
        await self.request(
            _api.put_account_data(self._me(), data_type, content, room_id=room_id),
            EmptyResponse,
        )

    # -- media -----------------------------------------------------------------------------

    async def upload(
        self: _Client,
        data: bytes,
        *,
        content_type: str = "application/octet-stream",
        filename: str | None = None,
    ) -> str:
        """Upload media; returns its ``mxc://`` URI."""
        answer = await self.request(
            _api.upload_media(data, content_type=content_type, filename=filename),
            UploadResponse,
        )
        return answer.content_uri

    async def download(self: _Client, mxc_uri: str) -> bytes:
        """Download media by ``mxc://server/media_id`` (authenticated v1 endpoint)."""
        if not mxc_uri.startswith("mxc://"):
            raise ValueError(f"not an mxc:// URI: {mxc_uri!r}")
        server_name, _, media_id = mxc_uri.removeprefix("mxc://").partition("/")
        if not server_name or not media_id:
            raise ValueError(f"not an mxc:// URI: {mxc_uri!r}")
        return await self.request_bytes(_api.download_media(server_name, media_id))

    # -- timeline: typing, reactions, profile ----------------------------------------------

    async def set_typing(
        self: _Client, room_id: str, *, typing: bool, timeout_ms: int = 30_000
    ) -> None:
        """Tell the room this user is typing (for ``timeout_ms``) or stopped."""
        await self.request(
            _api.typing(room_id, self._me(), typing=typing, timeout_ms=timeout_ms), EmptyResponse
        )

    async def send_reaction(
        self: _Client, room_id: str, event_id: str, key: str, txn_id: str | None = None
    ) -> str:
        """React to ``event_id`` with ``key`` (an ``m.annotation``); returns the reaction's id."""
        content = {"m.relates_to": {"rel_type": "m.annotation", "event_id": event_id, "key": key}}
        return await self.send_event(room_id, "m.reaction", content, txn_id)

    async def set_displayname(self: _Client, displayname: str) -> None:
        await self.request(_api.set_displayname(self._me(), displayname), EmptyResponse)
