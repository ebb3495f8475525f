"""Media: ``POST /_matrix/media/v3/upload`` and authenticated ``/_matrix/client/v1/media/download``."""

from __future__ import annotations

import secrets

from ._model import EndpointFamily, HomeserverModel
from ._wire import Call, HTTPError, Reply

__all__ = ["MediaEndpoints"]


class MediaEndpoints(EndpointFamily):
    def __init__(self, model: HomeserverModel) -> None:
        super().__init__(model)
        self._media: dict[str, tuple[bytes, str]] = {}  # media ID -> (bytes, content type)

    async def upload(self, call: Call) -> Reply:
        self.model._auth(call.request)
        media_id = secrets.token_urlsafe(12)
        self._media[media_id] = (
            call.request.content,
            call.request.headers.get("content-type", "application/octet-stream"),
        )
        return Reply(200, {"content_uri": f"mxc://{self.model.server_name}/{media_id}"})

    async def download(self, call: Call, server_name: str, media_id: str) -> Reply:
        self.model._auth(call.request)
        found = self._media.get(media_id) if server_name == self.model.server_name else None
        if found is None:
            raise HTTPError(404, "M_NOT_FOUND", "Not found")
        return Reply(200, raw=found[0], headers={"content-type": found[1]})
