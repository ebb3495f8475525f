"""Encrypted attachments (the spec's ``EncryptedFile``) for an encrypted room's sidecars:
gapline's and matrix-nio's encryption read each other's; a changed byte, a wrong key or a
malformed ``file`` object never yields text; a sidecar in an encrypted room uploads only
ciphertext and resolves to the whole text."""

from __future__ import annotations

import base64
import copy
from typing import Any

import pytest
from nio.crypto import attachments as nio_attachments

from gapline.journal._attachment import (
    AttachmentInvalid,
    EncryptedFile,
    decrypt_attachment,
    encrypt_attachment,
)
from gapline.journal._sidecar import (
    SIDECAR_KEY,
    SidecarUnresolved,
    attach_sidecar,
    resolve_sidecar,
    sidecar_ref,
)

TEXT = ("the whole answer, longer than any preview. " * 50).encode()


def test_nio_decrypts_what_gapline_encrypts() -> None:
    ciphertext, file = encrypt_attachment(TEXT, "mxc://example.org/abc")
    assert TEXT[:20] not in ciphertext and len(ciphertext) == len(TEXT)
    wire = file.as_content()
    assert wire["url"] == "mxc://example.org/abc" and wire["v"] == "v2"
    assert wire["key"] == {
        "kty": "oct", "key_ops": ["encrypt", "decrypt"], "alg": "A256CTR",
        "k": wire["key"]["k"], "ext": True,
    }  # fmt: skip
    assert base64.b64decode(wire["iv"] + "==")[8:] == bytes(8)  # the counter half is zero
    plain = nio_attachments.decrypt_attachment(
        ciphertext, wire["key"]["k"], wire["hashes"]["sha256"], wire["iv"]
    )
    assert plain == TEXT


def test_gapline_decrypts_what_nio_encrypts() -> None:
    ciphertext, info = nio_attachments.encrypt_attachment(TEXT)
    file = EncryptedFile.from_content({**info, "url": "mxc://example.org/n"})
    assert decrypt_attachment(ciphertext, file) == TEXT


def test_a_changed_byte_is_refused() -> None:
    ciphertext, file = encrypt_attachment(TEXT)
    damaged = bytes([ciphertext[0] ^ 1]) + ciphertext[1:]
    with pytest.raises(AttachmentInvalid, match="sha256"):
        decrypt_attachment(damaged, file)


def _wire() -> dict[str, Any]:
    return encrypt_attachment(TEXT, "mxc://example.org/abc")[1].as_content()


@pytest.mark.parametrize(
    "damage",
    [
        lambda f: f.update(url="https://example.org/abc"),
        lambda f: f.update(v="v1"),
        lambda f: f["key"].update(alg="A128CTR"),
        lambda f: f["key"].update(k="not base64!"),
        lambda f: f["key"].update(k="AAAA"),
        lambda f: f.update(iv=None),
        lambda f: f.pop("hashes"),
        lambda f: f["hashes"].update(sha256="AAAA"),
    ],
)
def test_a_malformed_file_object_is_refused(damage: Any) -> None:
    wire = copy.deepcopy(_wire())
    damage(wire)
    with pytest.raises(AttachmentInvalid):
        EncryptedFile.from_content(wire)
    assert sidecar_ref({SIDECAR_KEY: {"file": wire, "size": 1, "sha256": "00"}}) is None


async def test_an_encrypted_sidecar_uploads_ciphertext_and_resolves_the_text() -> None:
    uploads: dict[str, tuple[bytes, str]] = {}

    async def upload(data: bytes, content_type: str) -> str:
        url = f"mxc://example.org/{len(uploads)}"
        uploads[url] = (data, content_type)
        return url

    text = TEXT.decode()
    preview, extra = await attach_sidecar(text, 100, upload, encrypted=True)
    assert len(preview) < len(text)
    ((url, (data, content_type)),) = uploads.items()
    assert content_type == "application/octet-stream" and TEXT[:20] not in data
    assert "url" not in extra[SIDECAR_KEY] and extra[SIDECAR_KEY]["file"]["url"] == url
    ref = sidecar_ref(extra)
    assert ref is not None and ref.file is not None and ref.url == url

    async def download(mxc: str) -> bytes:
        return uploads[mxc][0]

    assert await resolve_sidecar(ref, download) == text

    async def tampered(mxc: str) -> bytes:
        return b"x" + uploads[mxc][0][1:]

    with pytest.raises(SidecarUnresolved, match="sha256"):
        await resolve_sidecar(ref, tampered)


async def test_a_plaintext_rooms_sidecar_is_unchanged() -> None:
    async def upload(data: bytes, content_type: str) -> str:
        assert data == TEXT and content_type.startswith("text/plain")
        return "mxc://example.org/plain"

    _preview, extra = await attach_sidecar(TEXT.decode(), 100, upload)
    assert extra[SIDECAR_KEY]["url"] == "mxc://example.org/plain"
    assert "file" not in extra[SIDECAR_KEY]
