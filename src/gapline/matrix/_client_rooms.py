"""Room membership and creation, as a mixin of `MatrixClient`.

Glue like the rest of the client: build a `Request`, send it through the client's one
``request`` path, parse the typed answer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol, TypeVar

from . import _api
from ._request import Request
from ._responses import (
    CreateRoomResponse,
    EmptyResponse,
    JoinedMembersResponse,
    JoinResponse,
    RoomMember,
)

__all__ = ["RoomEndpoints"]

T = TypeVar("T")


class _Client(Protocol):
    async def request(self, request: Request, response_type: type[T]) -> T: ...


class RoomEndpoints:
    """Create, join, leave, invite, kick, and list a room's joined members."""

    async def create_room(
        self: _Client,
        *,
        name: str | None = None,
        topic: str | None = None,
        preset: str | None = None,
        visibility: str | None = None,
        invite: Iterable[str] = (),
        is_direct: bool | None = None,
        room_version: str | None = None,
        initial_state: Iterable[Mapping[str, Any]] = (),
        extra: Mapping[str, Any] | None = None,
    ) -> str:
        """Create a room; returns its ID."""
        answer = await self.request(
            _api.create_room(
                name=name,
                topic=topic,
                preset=preset,
                visibility=visibility,
                invite=invite,
                is_direct=is_direct,
                room_version=room_version,
                initial_state=initial_state,
                extra=extra,
            ),
            CreateRoomResponse,
        )
        return answer.room_id

    async def join(self: _Client, room_id_or_alias: str, *, via: Iterable[str] = ()) -> str:
        answer = await self.request(_api.join(room_id_or_alias, via=via), JoinResponse)
        return answer.room_id

    async def leave(self: _Client, room_id: str, *, reason: str | None = None) -> None:
        await self.request(_api.leave(room_id, reason=reason), EmptyResponse)

    async def invite(
        self: _Client, room_id: str, user_id: str, *, reason: str | None = None
    ) -> None:
        await self.request(_api.invite(room_id, user_id, reason=reason), EmptyResponse)

    async def kick(self: _Client, room_id: str, user_id: str, *, reason: str | None = None) -> None:
        await self.request(_api.kick(room_id, user_id, reason=reason), EmptyResponse)

    async def joined_members(self: _Client, room_id: str) -> dict[str, RoomMember]:
        answer = await self.request(_api.joined_members(room_id), JoinedMembersResponse)
        return answer.joined
