"""Large messages: a preview body plus the full text as an attachment.

A reply longer than the configured limit is sent with a short preview in
``body`` and the whole text uploaded as ``text/plain`` media, referenced under
:data:`SIDECAR_KEY` (``url``, ``size``, ``sha256``). Any Matrix client shows
the preview; a gapline reader resolves the attachment. In an encrypted room the
upload is an encrypted attachment (`_attachment`): ``file`` (the spec's
``EncryptedFile``: URL, JWK key, IV, ciphertext hash) replaces ``url``, and the key
reaches only the room's members, inside the Megolm-encrypted event.

The projection stores only the resolved full text: the preview belongs to no
revision anyone wrote. Resolution happens before admission (ingress,
hydration, refetch); when it fails the event is admitted *unresolved* and the
store records a refresh debt, exactly as for a redacted visible revision, so
a strict read refetches rather than serve the preview.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gapline.journal._attachment import (
    AttachmentInvalid,
    EncryptedFile,
    decrypt_attachment,
    encrypt_attachment,
)

__all__ = [
    "DEFAULT_SIDECAR_LIMIT",
    "SIDECAR_KEY",
    "SidecarRef",
    "SidecarUnresolved",
    "Uploader",
    "attach_sidecar",
    "resolve_sidecar",
    "sidecar_ref",
    "split_large_body",
]

SIDECAR_KEY = "io.gapline.sidecar"
# Well under the 64 KiB event limit once JSON escaping and the edit's duplicate body are counted.
DEFAULT_SIDECAR_LIMIT = 16_000
PREVIEW_CHARS = 500

Uploader = Callable[[bytes, str], Awaitable[str]]  # (data, content_type) -> mxc URI
Downloader = Callable[[str], Awaitable[bytes]]  # mxc URI -> bytes


class SidecarUnresolved(Exception):
    """The attachment could not be fetched or did not match its digest."""


@dataclass(frozen=True, slots=True)
class SidecarRef:
    """Where the full text is (``url``), its size and SHA-256 (of the text itself), and,
    for an encrypted attachment, what decrypts it."""

    url: str
    size: int
    sha256: str
    file: EncryptedFile | None = None

    def as_content(self) -> dict[str, Any]:
        if self.file is not None:
            return {"file": self.file.as_content(), "size": self.size, "sha256": self.sha256}
        return {"url": self.url, "size": self.size, "sha256": self.sha256}


def split_large_body(text: str, limit: int) -> tuple[str, bytes] | None:
    """``(preview, full_bytes)`` when ``text`` is over ``limit`` characters, else None."""
    if len(text) <= limit:
        return None
    preview = text[: min(PREVIEW_CHARS, limit)].rstrip() + "… (full text attached)"
    return preview, text.encode("utf-8")


async def attach_sidecar(
    text: str, limit: int, upload: Uploader, *, encrypted: bool = False
) -> tuple[str, dict[str, Any]]:
    """The body to send and the extra content keys (empty when no sidecar is needed).
    ``encrypted``: the room is, so only ciphertext is uploaded."""
    split = split_large_body(text, limit)
    if split is None:
        return text, {}
    preview, data = split
    digest = hashlib.sha256(data).hexdigest()
    if not encrypted:
        url = await upload(data, "text/plain; charset=utf-8")
        return preview, {SIDECAR_KEY: SidecarRef(url, len(data), digest).as_content()}
    ciphertext, file = encrypt_attachment(data)
    url = await upload(ciphertext, "application/octet-stream")
    file = dataclasses.replace(file, url=url)
    return preview, {SIDECAR_KEY: SidecarRef(url, len(data), digest, file).as_content()}


def sidecar_ref(content: Mapping[str, Any]) -> SidecarRef | None:
    """The sidecar a visible content names, or None. Malformed references count as none."""
    raw = content.get(SIDECAR_KEY)
    if not isinstance(raw, Mapping):
        return None
    file: EncryptedFile | None = None
    if "file" in raw:
        try:
            file = EncryptedFile.from_content(raw["file"])
        except AttachmentInvalid:
            return None
    url, size, digest = (file.url if file else raw.get("url")), raw.get("size"), raw.get("sha256")
    if not (isinstance(url, str) and url.startswith("mxc://")):
        return None
    if not (isinstance(size, int) and isinstance(digest, str)):
        return None
    return SidecarRef(url=url, size=size, sha256=digest, file=file)


async def resolve_sidecar(ref: SidecarRef, download: Downloader) -> str:
    """The full text behind ``ref``, verified against its size and digest."""
    try:
        data = await download(ref.url)
    except Exception as exc:  # any transport failure is the same debt
        raise SidecarUnresolved(f"cannot fetch {ref.url}: {exc}") from exc
    if ref.file is not None:
        try:
            data = decrypt_attachment(data, ref.file)
        except AttachmentInvalid as exc:
            raise SidecarUnresolved(f"{ref.url}: {exc}") from exc
    if len(data) != ref.size or hashlib.sha256(data).hexdigest() != ref.sha256:
        raise SidecarUnresolved(f"{ref.url} does not match its size or digest")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SidecarUnresolved(f"{ref.url} is not UTF-8 text") from exc
