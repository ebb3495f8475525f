"""Business objects inside envelopes: type selection, ``DirectMessage``,
``MessageBody``, ``ContentReference`` (encrypted attachments) and ``ni:`` references.

Type selection matches the complete case-sensitive ``$type``; an unknown type
is kept as ``UnknownContent`` and never drives a state change.
"""

from __future__ import annotations

import enum
import hashlib
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import unquote_to_bytes

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from gapline.meshline._base64 import b64u_decode, b64u_encode
from gapline.meshline._canonical import MAX_SAFE_INTEGER, canonical_json, parse_json
from gapline.meshline._errors import BadRequest, DecryptionFailed, MeshlineError
from gapline.meshline._fields import extensions, object_of

__all__ = [
    "BodyFormat",
    "BusinessContent",
    "ContentEncryption",
    "ContentReference",
    "DeviceStateChanged",
    "DirectMessage",
    "MessageBody",
    "ReferenceStatus",
    "UnknownContent",
    "UnsupportedType",
    "body_references",
    "check_hash_text",
    "decrypt_attachment",
    "encrypt_attachment",
    "ni_uri",
    "parse_content",
    "resolve_reference",
    "select_type",
]

T = TypeVar("T")

_WHITESPACE = frozenset(
    [chr(c) for c in range(0x09, 0x0E)]
    + ["\u0020", "\u0085", "\u00a0", "\u1680"]
    + [chr(c) for c in range(0x2000, 0x200B)]
    + ["\u2028", "\u2029", "\u202f", "\u205f", "\u3000"]
)
_TOKEN = r"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
_MEDIA_TYPE_RE = re.compile(
    rf"({_TOKEN})/({_TOKEN})((?:[ \t]*;[ \t]*{_TOKEN}=(?:{_TOKEN}|\"(?:[^\"\\]|\\.)*\"))*)[ \t]*"
)
_PARAM_RE = re.compile(rf";[ \t]*({_TOKEN})=({_TOKEN}|\"(?:[^\"\\]|\\.)*\")")
_HASH_RE = re.compile(r"sha256:[A-Za-z0-9_-]{43}")


class UnsupportedType(MeshlineError):
    """``reason`` is ``unsupported_type`` (a string we do not know) or ``invalid_type``."""

    code = "bad_request"

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def select_type(obj: object, supported: Mapping[str, T]) -> T:
    """Pick the handler for an object's complete, case-sensitive ``$type``."""
    if not isinstance(obj, Mapping) or not isinstance(obj.get("$type"), str):
        raise UnsupportedType("invalid_type", "object has no string $type")
    try:
        return supported[obj["$type"]]
    except KeyError:
        raise UnsupportedType("unsupported_type", f"unknown $type {obj['$type']!r}") from None


def is_whitespace_only(text: str) -> bool:
    return all(ch in _WHITESPACE for ch in text)


def parse_media_type(value: str) -> tuple[str, dict[str, str]]:
    """``type/subtype`` lower-cased and parameters (names lower-cased, values unquoted)."""
    match = _MEDIA_TYPE_RE.fullmatch(value)
    if match is None:
        raise BadRequest(f"malformed media type {value!r}")
    params: dict[str, str] = {}
    for name, raw in _PARAM_RE.findall(match.group(3)):
        if raw.startswith('"'):
            raw = re.sub(r"\\(.)", r"\1", raw[1:-1])
        params[name.lower()] = raw
    return f"{match.group(1)}/{match.group(2)}".lower(), params


class BodyFormat(enum.Enum):
    PLAIN_TEXT = "plain_text"
    COMMONMARK = "commonmark_0_31_2"
    #: An unknown media type or variant: show as plain text, never reject the message.
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class MessageBody:
    content_type: str
    text: str
    extensions: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_wire(cls, value: object) -> MessageBody:
        obj = object_of(value, "MessageBody")
        content_type, text = obj.get("content_type"), obj.get("text")
        if not isinstance(content_type, str) or not isinstance(text, str):
            raise BadRequest("MessageBody needs string content_type and text")
        if not text or is_whitespace_only(text):
            raise BadRequest("MessageBody text must hold a non-whitespace character")
        _, params = parse_media_type(content_type)
        if "charset" in params and params["charset"].lower() != "utf-8":
            raise BadRequest("MessageBody charset must be utf-8")
        return cls(content_type, text, extensions(obj, frozenset({"content_type", "text"})))

    def to_wire(self) -> dict[str, Any]:
        return {**self.extensions, "content_type": self.content_type, "text": self.text}

    @property
    def format(self) -> BodyFormat:
        media, params = parse_media_type(self.content_type)
        if media == "text/plain":
            return BodyFormat.PLAIN_TEXT
        if media == "text/markdown" and params.get("variant", "commonmark").lower() == "commonmark":
            return BodyFormat.COMMONMARK
        return BodyFormat.UNKNOWN


def check_hash_text(value: object) -> bytes:
    """``sha256:<canonical b64url of 32 bytes>``; the digest bytes."""
    if not isinstance(value, str) or _HASH_RE.fullmatch(value) is None:
        raise BadRequest("hash must be sha256:<base64url digest>")
    return b64u_decode(value[7:], length=32, field="hash")


@dataclass(frozen=True, slots=True)
class ContentEncryption:
    key: str
    nonce: str
    alg: str = "AES-256-GCM"

    def to_wire(self) -> dict[str, Any]:
        return {"alg": self.alg, "key": self.key, "nonce": self.nonce}


@dataclass(frozen=True, slots=True)
class ContentReference:
    uri: str
    hash: str
    content_type: str
    size: int
    encryption: ContentEncryption | None = None
    extensions: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_wire(cls, value: object) -> ContentReference:
        obj = object_of(value, "ContentReference")
        uri, content_type, size = obj.get("uri"), obj.get("content_type"), obj.get("size")
        if not isinstance(uri, str) or not uri.lower().startswith("https://"):
            raise BadRequest("ContentReference uri must be an absolute HTTPS URI")
        check_hash_text(obj.get("hash"))
        if not isinstance(content_type, str):
            raise BadRequest("ContentReference content_type must be a string")
        parse_media_type(content_type)
        if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= MAX_SAFE_INTEGER:
            raise BadRequest("ContentReference size must be a nonnegative integer")
        encryption = None
        if "encryption" in obj:
            enc = object_of(obj["encryption"], "ContentEncryption")
            if enc.get("alg") != "AES-256-GCM":
                raise BadRequest("ContentEncryption alg must be AES-256-GCM")
            b64u_decode(enc.get("key"), length=32, field="key")
            b64u_decode(enc.get("nonce"), length=12, field="nonce")
            encryption = ContentEncryption(key=enc["key"], nonce=enc["nonce"])
        known = frozenset({"uri", "hash", "content_type", "size", "encryption"})
        return cls(uri, obj["hash"], content_type, size, encryption, extensions(obj, known))

    def to_wire(self) -> dict[str, Any]:
        wire = {
            **self.extensions,
            "uri": self.uri,
            "hash": self.hash,
            "content_type": self.content_type,
            "size": self.size,
        }
        if self.encryption is not None:
            wire["encryption"] = self.encryption.to_wire()
        return wire

    def aad(self) -> bytes:
        """The attachment AAD: canonical ``meshline.content.reference.aad`` (no network context)."""
        return canonical_json(
            {
                "$type": "meshline.content.reference.aad",
                "alg": "AES-256-GCM",
                "hash": self.hash,
                "content_type": self.content_type,
                "size": self.size,
            }
        )


def encrypt_attachment(
    plaintext: bytes,
    *,
    uri: str,
    content_type: str,
    key: bytes | None = None,
    nonce: bytes | None = None,
) -> tuple[ContentReference, bytes]:
    """A reference (hash and size of the plaintext) and ``ciphertext || tag`` to upload."""
    key = os.urandom(32) if key is None else key
    nonce = os.urandom(12) if nonce is None else nonce
    ref = ContentReference(
        uri=uri,
        hash="sha256:" + b64u_encode(hashlib.sha256(plaintext).digest()),
        content_type=content_type,
        size=len(plaintext),
        encryption=ContentEncryption(key=b64u_encode(key), nonce=b64u_encode(nonce)),
    )
    return ref, AESGCM(key).encrypt(nonce, plaintext, ref.aad())


def decrypt_attachment(ref: ContentReference, data: bytes) -> bytes:
    """Authenticate and decrypt (when encrypted), then check size and hash."""
    plaintext = data
    if ref.encryption is not None:
        try:
            plaintext = AESGCM(b64u_decode(ref.encryption.key, length=32)).decrypt(
                b64u_decode(ref.encryption.nonce, length=12), data, ref.aad()
            )
        except InvalidTag:
            raise DecryptionFailed("attachment does not authenticate") from None
    if len(plaintext) != ref.size:
        raise DecryptionFailed("attachment size differs from its reference")
    if hashlib.sha256(plaintext).digest() != check_hash_text(ref.hash):
        raise DecryptionFailed("attachment hash differs from its reference")
    return plaintext


def ni_uri(hash_text: str) -> str:
    """The ``ni:///sha-256;…`` body reference for an attachment hash."""
    check_hash_text(hash_text)
    return "ni:///sha-256;" + hash_text[7:]


class ReferenceStatus(enum.Enum):
    RESOLVED = "resolved"
    UNRESOLVED = "unresolved"
    INVALID_REFERENCE = "invalid_reference"
    INVALID_ATTACHMENTS = "invalid_attachments"


def check_attachments(attachments: Sequence[object]) -> tuple[ContentReference, ...]:
    refs = tuple(ContentReference.from_wire(a) for a in attachments)
    if len({r.hash for r in refs}) != len(refs):
        raise BadRequest("attachments must not repeat a hash")
    return refs


def _ni_digest(uri: str) -> bytes:
    """Parse structure first, then percent-decode algorithm and digest once each."""
    scheme, sep, rest = uri.partition(":")
    if not sep or scheme.lower() != "ni" or not rest.startswith("///"):
        raise BadRequest("not an ni: URI with empty authority")
    path = rest[3:]
    if any(c in path for c in "/?#"):
        raise BadRequest("ni: reference has extra path, query or fragment")
    algorithm, sep, digest = path.partition(";")
    if not sep:
        raise BadRequest("ni: reference lacks ';'")
    try:
        alg = _percent_decode(algorithm)
        digest_text = _percent_decode(digest)
    except ValueError:
        raise BadRequest("bad percent-encoding in ni: reference") from None
    if alg != "sha-256":
        raise BadRequest("ni: algorithm must be sha-256")
    return b64u_decode(digest_text, length=32, field="ni digest")


def _percent_decode(text: str) -> str:
    if re.search(r"%(?![0-9A-Fa-f]{2})", text):
        raise ValueError("invalid percent escape")
    return unquote_to_bytes(text).decode("utf-8")


def resolve_reference(
    uri: str, attachments: Sequence[object]
) -> tuple[ReferenceStatus, int | None]:
    """Match a body ``ni:`` reference against the message's own attachments only."""
    try:
        refs = check_attachments(attachments)
    except BadRequest:
        return ReferenceStatus.INVALID_ATTACHMENTS, None
    try:
        digest = _ni_digest(uri)
    except BadRequest:
        return ReferenceStatus.INVALID_REFERENCE, None
    for index, ref in enumerate(refs):
        if check_hash_text(ref.hash) == digest:
            return ReferenceStatus.RESOLVED, index
    return ReferenceStatus.UNRESOLVED, None


def body_references(body: MessageBody) -> list[tuple[str, str]]:
    """``(kind, uri)`` of the ``ni:`` link/image targets of a CommonMark body, in order.

    Only parsed link and image destinations count: code, escapes and raw HTML
    create none, and plain or unknown formats are never interpreted.
    """
    if body.format is not BodyFormat.COMMONMARK:
        return []
    from markdown_it import MarkdownIt  # rich's dependency; only needed for display

    found: list[tuple[str, str]] = []
    stack = list(reversed(MarkdownIt("commonmark").parse(body.text)))
    while stack:
        token = stack.pop()
        if token.children:
            stack.extend(reversed(token.children))
        if token.type == "image":
            kind, target = "image", token.attrGet("src")
        elif token.type == "link_open":
            kind, target = "link", token.attrGet("href")
        else:
            continue
        if isinstance(target, str) and target[:3].lower() == "ni:":
            found.append((kind, target))
    return found


# --- business objects -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DirectMessage:
    body: MessageBody | None
    attachments: tuple[ContentReference, ...] = ()
    reply_to: tuple[str, str] | None = None
    raw: Mapping[str, Any] = field(default_factory=dict)

    type_name = "meshline.message.direct"

    @classmethod
    def from_wire(cls, obj: Mapping[str, Any]) -> DirectMessage:
        body = MessageBody.from_wire(obj["body"]) if "body" in obj else None
        attachments: tuple[ContentReference, ...] = ()
        if "attachments" in obj:
            if not isinstance(obj["attachments"], list):
                raise BadRequest("attachments must be an array")
            attachments = check_attachments(obj["attachments"])
        if body is None and not attachments:
            raise BadRequest("a direct message needs a body or attachments")
        reply_to = None
        if "reply_to" in obj:
            ref = object_of(obj["reply_to"], "DirectMessageReference")
            if not isinstance(ref.get("from"), str) or not isinstance(ref.get("message_id"), str):
                raise BadRequest("reply_to needs from and message_id")
            reply_to = (ref["from"], ref["message_id"])
        return cls(body, attachments, reply_to, obj)


@dataclass(frozen=True, slots=True)
class DeviceStateChanged:
    revision: int
    raw: Mapping[str, Any] = field(default_factory=dict)

    type_name = "meshline.device.state.changed"

    @classmethod
    def from_wire(cls, obj: Mapping[str, Any]) -> DeviceStateChanged:
        revision = obj.get("revision")
        if (
            not isinstance(revision, int)
            or isinstance(revision, bool)
            or not 0 <= revision <= MAX_SAFE_INTEGER
        ):
            raise BadRequest("revision must be a nonnegative safe integer")
        return cls(revision, obj)


@dataclass(frozen=True, slots=True)
class UnknownContent:
    """A business object whose ``$type`` this library does not implement: kept, never applied."""

    type_name: str
    raw: Mapping[str, Any]


BusinessContent = DirectMessage | DeviceStateChanged | UnknownContent

_PARSERS: Mapping[str, Any] = {
    DirectMessage.type_name: DirectMessage.from_wire,
    DeviceStateChanged.type_name: DeviceStateChanged.from_wire,
}


def parse_content(plaintext: bytes) -> BusinessContent:
    """Decrypted plaintext → a validated business object (BadRequest if invalid)."""
    obj = parse_json(plaintext)
    if not isinstance(obj, dict):
        raise BadRequest("business object must be a JSON object")
    try:
        parser = select_type(obj, _PARSERS)
    except UnsupportedType as exc:
        if exc.reason == "invalid_type":
            raise BadRequest("business object has no string $type") from None
        return UnknownContent(obj["$type"], obj)
    if "$context" in obj:
        raise BadRequest("business object must not carry $context")
    return parser(obj)
