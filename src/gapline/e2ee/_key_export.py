"""Room-key export and import in the file format Element and other clients write.

The file (the client-server spec's "Key exports")::

    -----BEGIN MEGOLM SESSION DATA-----
    base64 of: 0x01 | salt (16) | IV (16) | rounds (4, big-endian) | AES-256-CTR ciphertext
               | HMAC-SHA-256 of everything before it (32)
    -----END MEGOLM SESSION DATA-----

The AES and HMAC keys are the two halves of PBKDF2-HMAC-SHA-512(passphrase,
salt, rounds, 64 bytes). The plaintext is a JSON array of exported sessions
(room, session ID, sender key, claimed Ed25519 key, forwarding chain, and the
session key exported at its first known index).

The MAC is checked before anything is decrypted, and nothing is stored unless
the whole file opens: a wrong passphrase, a damaged or truncated file is a
`KeyExportError` and the machine is unchanged. An imported session is kept as
a forwarded one (a file proves nothing about who first sent it), so it never
replaces a copy the sender gave us directly.
"""

from __future__ import annotations

import base64
import binascii
import enum
import hashlib
import hmac
import json
import logging
import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from ._errors import E2eeError
from ._inbound import RoomKey
from ._types import MEGOLM, Refusal, RoomKeyId

if TYPE_CHECKING:
    from ._machine import CryptoMachine

__all__ = [
    "DEFAULT_ROUNDS",
    "ExportedSession",
    "ImportReport",
    "KeyExportError",
    "KeyExportProblem",
    "decrypt_key_file",
    "encrypt_key_file",
    "export_room_keys",
    "import_room_keys",
]

log = logging.getLogger("gapline.e2ee.export")

HEADER = "-----BEGIN MEGOLM SESSION DATA-----"
FOOTER = "-----END MEGOLM SESSION DATA-----"
DEFAULT_ROUNDS = 500_000  # Element's default for new exports
_MAX_ROUNDS = 10_000_000  # refuse a file that would make us derive for minutes
_LINE = 96  # characters per base64 line, as Element writes them
_MIN_BODY = 1 + 16 + 16 + 4 + 32


class KeyExportProblem(enum.StrEnum):
    NOT_AN_EXPORT = "not_an_export"  # no header/footer, or not base64
    TRUNCATED = "truncated"  # shorter than the fixed fields
    UNSUPPORTED_VERSION = "unsupported_version"
    BAD_MAC = "bad_mac"  # a wrong passphrase, or a damaged file: both look the same
    MALFORMED = "malformed"  # decrypted, but not a list of sessions


class KeyExportError(E2eeError):
    """A key file that does not open; nothing of it was imported."""

    def __init__(self, problem: KeyExportProblem, detail: str) -> None:
        self.problem = problem
        super().__init__(f"key file refused ({problem.value}): {detail}")


@dataclass(frozen=True, slots=True)
class ExportedSession:
    """One session of a key file (``session_key`` is an exported key, secret)."""

    room_id: str
    session_id: str
    sender_key: str
    signing_key: str
    session_key: str
    forwarding_chain: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "algorithm": MEGOLM,
            "room_id": self.room_id,
            "session_id": self.session_id,
            "sender_key": self.sender_key,
            "sender_claimed_keys": {"ed25519": self.signing_key},
            "forwarding_curve25519_key_chain": list(self.forwarding_chain),
            "session_key": self.session_key,
        }

    @classmethod
    def from_json(cls, obj: Any) -> ExportedSession:
        """Parse one entry; raises ``ValueError`` naming what is wrong."""
        if not isinstance(obj, dict):
            raise ValueError("an entry is not an object")
        if obj.get("algorithm") != MEGOLM:
            raise ValueError(f"unsupported algorithm {obj.get('algorithm')!r}")
        fields = [obj.get(k) for k in ("room_id", "session_id", "sender_key", "session_key")]
        claimed = obj.get("sender_claimed_keys")
        ed = claimed.get("ed25519") if isinstance(claimed, dict) else None
        chain = obj.get("forwarding_curve25519_key_chain", [])
        if not all(isinstance(f, str) for f in [*fields, ed]):
            raise ValueError(
                "an entry lacks room_id, session_id, sender_key, session_key or ed25519"
            )
        if not isinstance(chain, list) or not all(isinstance(c, str) for c in chain):
            raise ValueError("forwarding_curve25519_key_chain is not a list of keys")
        room_id, session_id, sender_key, session_key = fields
        return cls(room_id, session_id, sender_key, ed, session_key, tuple(chain))  # ty: ignore[invalid-argument-type]


def _keys(passphrase: str, salt: bytes, rounds: int) -> tuple[bytes, bytes]:
    derived = hashlib.pbkdf2_hmac("sha512", passphrase.encode("utf-8"), salt, rounds, 64)
    return derived[:32], derived[32:]


def _ctr(key: bytes, iv: bytes, data: bytes) -> bytes:
    cryptor = Cipher(algorithms.AES(key), modes.CTR(iv)).encryptor()
    return cryptor.update(data) + cryptor.finalize()


def encrypt_key_file(plaintext: bytes, passphrase: str, *, rounds: int = DEFAULT_ROUNDS) -> str:
    """Seal ``plaintext`` (the JSON array) as a key file's text."""
    salt = os.urandom(16)
    iv = bytearray(os.urandom(16))
    iv[8] &= 0x7F  # bit 63 clear: the counter cannot wrap, as other clients expect
    aes_key, mac_key = _keys(passphrase, salt, rounds)
    body = b"\x01" + salt + bytes(iv) + struct.pack(">I", rounds)
    body += _ctr(aes_key, bytes(iv), plaintext)
    body += hmac.new(mac_key, body, hashlib.sha256).digest()
    text = base64.b64encode(body).decode("ascii")
    lines = [text[i : i + _LINE] for i in range(0, len(text), _LINE)]
    return "\n".join([HEADER, *lines, FOOTER]) + "\n"


def decrypt_key_file(text: str, passphrase: str) -> bytes:
    """Open a key file's text; raises `KeyExportError` (the MAC is checked first)."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if len(lines) < 2 or lines[0] != HEADER or lines[-1] != FOOTER:
        if lines and lines[0] == HEADER:
            raise KeyExportError(KeyExportProblem.TRUNCATED, "the end marker is missing")
        raise KeyExportError(KeyExportProblem.NOT_AN_EXPORT, "no MEGOLM SESSION DATA markers")
    encoded = "".join(lines[1:-1])
    try:
        body = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise KeyExportError(KeyExportProblem.NOT_AN_EXPORT, f"not base64: {exc}") from None
    if len(body) < _MIN_BODY:
        raise KeyExportError(KeyExportProblem.TRUNCATED, f"{len(body)} bytes is too short")
    if body[0] != 1:
        raise KeyExportError(KeyExportProblem.UNSUPPORTED_VERSION, f"version {body[0]}")
    salt, iv = body[1:17], body[17:33]
    (rounds,) = struct.unpack(">I", body[33:37])
    if not 1 <= rounds <= _MAX_ROUNDS:
        raise KeyExportError(KeyExportProblem.MALFORMED, f"{rounds} PBKDF2 rounds")
    aes_key, mac_key = _keys(passphrase, salt, rounds)
    expected = hmac.new(mac_key, body[:-32], hashlib.sha256).digest()
    if not hmac.compare_digest(expected, body[-32:]):
        raise KeyExportError(
            KeyExportProblem.BAD_MAC, "the MAC does not match: wrong passphrase or damaged file"
        )
    return _ctr(aes_key, iv, body[37:-32])


def parse_sessions(plaintext: bytes) -> tuple[list[ExportedSession], list[str]]:
    """The file's sessions, and the reasons entries were skipped."""
    try:
        data = json.loads(plaintext)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise KeyExportError(KeyExportProblem.MALFORMED, f"not JSON: {exc}") from None
    if not isinstance(data, list):
        raise KeyExportError(KeyExportProblem.MALFORMED, "not a list of sessions")
    sessions, skipped = [], []
    for obj in data:
        try:
            sessions.append(ExportedSession.from_json(obj))
        except ValueError as exc:
            skipped.append(str(exc))
    return sessions, skipped


@dataclass(frozen=True, slots=True)
class ImportReport:
    """What an import did: new or better sessions (retry their events), and the rest."""

    imported: tuple[RoomKeyId, ...]
    already_known: int
    skipped: tuple[str, ...]  # entries that did not parse (algorithm, missing field)
    refusals: tuple[Refusal, ...]  # entries the machine's room-key rules refused


def export_room_keys(
    machine: CryptoMachine,
    passphrase: str,
    *,
    room_ids: Iterable[str] | None = None,
    rounds: int = DEFAULT_ROUNDS,
) -> str:
    """Every inbound session (of ``room_ids``, if given) as a key file's text."""
    rooms = None if room_ids is None else set(room_ids)
    entries = []
    for room_id, session_id in machine.inbound.identifiers():
        if rooms is not None and room_id not in rooms:
            continue
        exported = machine.inbound.export(room_id, session_id)
        if exported is not None:
            key, _index = exported
            entries.append(
                ExportedSession(
                    room_id, session_id, key.sender_key, key.signing_key, key.session_key,
                    key.forwarding_chain,
                ).to_json()
            )  # fmt: skip
    return encrypt_key_file(json.dumps(entries).encode(), passphrase, rounds=rounds)


def import_room_keys(machine: CryptoMachine, text: str, passphrase: str) -> ImportReport:
    """Import a key file's sessions into the machine (its changes wait in `take_changes`).

    Raises `KeyExportError` before anything is added when the file does not open."""
    sessions, skipped = parse_sessions(decrypt_key_file(text, passphrase))
    imported: list[RoomKeyId] = []
    refusals: list[Refusal] = []
    known = 0
    for s in sessions:
        device = machine.devices.by_curve25519(s.sender_key)
        owner = device if device is not None and device.ed25519 == s.signing_key else None
        result = machine.inbound.add(
            RoomKey(
                s.room_id,
                s.session_id,
                s.session_key,
                s.sender_key,
                s.signing_key,
                owner.user_id if owner else None,
                owner.device_id if owner else None,
                forwarded=True,
                forwarding_chain=s.forwarding_chain,
            )
        )
        if isinstance(result, Refusal):
            log.warning("key import: refused session %s: %s", s.session_id, result.detail)
            refusals.append(result)
        elif result:
            imported.append(RoomKeyId(s.room_id, s.session_id))
        else:
            known += 1
    for reason in skipped:
        log.warning("key import: skipped an entry: %s", reason)
    return ImportReport(tuple(imported), known, tuple(skipped), tuple(refusals))
