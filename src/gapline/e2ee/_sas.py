"""The cryptography of one ``m.sas.v1`` exchange: commitment, short string, MACs.

vodozemac's `Sas` does the Curve25519 agreement and the HKDF; this module
builds the info strings the spec defines around it. Key agreement is
``curve25519-hkdf-sha256`` only (the older ``curve25519`` mixes fewer
identifiers into the string and is not offered). MACs are
``hkdf-hmac-sha256.v2`` by preference; ``hkdf-hmac-sha256`` is accepted
because matrix-nio offers nothing else.

Two interoperability decisions, each safe because both encodings carry the
same HMAC or hash:

- ``hkdf-hmac-sha256`` was defined by libolm's MAC output, which is not valid
  base64; matrix-nio (on vodozemac) sends standard base64 under that name.
  Received MACs are checked in both encodings; ours are sent in standard base64,
  which nio checks. Clients that offer ``.v2`` (Element, matrix-rust-sdk)
  never reach this path.
- The commitment is unpadded base64 of SHA-256 by the spec; matrix-nio sends it
  as hex. Both are accepted; ours is sent as the spec says.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

import vodozemac

from ._canonical import b64encode, canonical_json

__all__ = [
    "EMOJI",
    "HASH",
    "KEY_AGREEMENT",
    "MAC_METHODS",
    "MAC_V1",
    "MAC_V2",
    "SAS_METHOD",
    "SHORT_STRINGS",
    "SasKeys",
    "ShortString",
    "commitment",
    "commitment_matches",
]

SAS_METHOD = "m.sas.v1"
KEY_AGREEMENT = "curve25519-hkdf-sha256"
HASH = "sha256"
MAC_V2 = "hkdf-hmac-sha256.v2"
MAC_V1 = "hkdf-hmac-sha256"
MAC_METHODS = (MAC_V2, MAC_V1)  # in order of preference
SHORT_STRINGS = ("decimal", "emoji")

# The spec's table of 64 emoji and their English names, by index.
_EMOJI_TABLE = """🐶 Dog|🐱 Cat|🦁 Lion|🐎 Horse|🦄 Unicorn|🐷 Pig|🐘 Elephant|🐰 Rabbit|\
🐼 Panda|🐓 Rooster|🐧 Penguin|🐢 Turtle|🐟 Fish|🐙 Octopus|🦋 Butterfly|🌷 Flower|\
🌳 Tree|🌵 Cactus|🍄 Mushroom|🌏 Globe|🌙 Moon|☁️ Cloud|🔥 Fire|🍌 Banana|\
🍎 Apple|🍓 Strawberry|🌽 Corn|🍕 Pizza|🎂 Cake|❤️ Heart|😀 Smiley|🤖 Robot|\
🎩 Hat|👓 Glasses|🔧 Spanner|🎅 Santa|👍 Thumbs Up|☂️ Umbrella|⌛ Hourglass|⏰ Clock|\
🎁 Gift|💡 Light Bulb|📕 Book|✏️ Pencil|📎 Paperclip|✂️ Scissors|🔒 Lock|🔑 Key|\
🔨 Hammer|☎️ Telephone|🏁 Flag|🚂 Train|🚲 Bicycle|✈️ Aeroplane|🚀 Rocket|🏆 Trophy|\
⚽ Ball|🎸 Guitar|🎺 Trumpet|🔔 Bell|⚓ Anchor|🎧 Headphones|📁 Folder|📌 Pin"""
EMOJI: tuple[tuple[str, str], ...] = tuple(
    (line.split(" ", 1)[0], line.split(" ", 1)[1]) for line in _EMOJI_TABLE.split("|")
)


@dataclass(frozen=True, slots=True)
class ShortString:
    """What both people compare: seven emoji (symbol, name) and three numbers."""

    emoji: tuple[tuple[str, str], ...]
    decimals: tuple[int, int, int]


def commitment(public_key: str, start_content: dict[str, object]) -> str:
    """The acceptor's commitment to its key: unpadded base64 SHA-256 of key + start."""
    digest = hashlib.sha256(public_key.encode() + canonical_json(start_content)).digest()
    return b64encode(digest)


def commitment_matches(received: str, public_key: str, start_content: dict[str, object]) -> bool:
    digest = hashlib.sha256(public_key.encode() + canonical_json(start_content)).digest()
    return hmac.compare_digest(received, b64encode(digest)) or hmac.compare_digest(
        received, digest.hex()
    )


class SasKeys:
    """Our ephemeral SAS key and, once the other key arrived, the agreed secret."""

    def __init__(self) -> None:
        self._sas: vodozemac.Sas | None = vodozemac.Sas()
        self.public_key: str = self._sas.public_key.to_base64()
        self.their_key: str | None = None
        self._established: vodozemac.EstablishedSas | None = None

    @property
    def established(self) -> bool:
        return self._established is not None

    def agree(self, their_key: str) -> None:
        """Raises `ValueError` for a key that is not a Curve25519 public key."""
        assert self._sas is not None, "agreed once"
        try:
            public = vodozemac.Curve25519PublicKey.from_base64(their_key)
            self._established = self._sas.diffie_hellman(public)
        except (vodozemac.KeyException, vodozemac.SasException) as exc:
            raise ValueError(f"bad SAS key: {exc}") from None
        self._sas = None  # a Sas is consumed by the agreement
        self.their_key = their_key

    def short_string(self, starter: tuple[str, str, str], acceptor: tuple[str, str, str],
                     flow_id: str) -> ShortString:  # fmt: skip
        """``starter`` / ``acceptor``: (user, device, SAS public key) of each side."""
        assert self._established is not None
        info = "|".join(("MATRIX_KEY_VERIFICATION_SAS", *starter, *acceptor, flow_id))
        raw = self._established.bytes(info)
        emoji = tuple(EMOJI[i] for i in raw.emoji_indices)
        a, b, c = raw.decimals
        return ShortString(emoji, (a, b, c))

    def mac(self, method: str, value: str, info: str) -> str:
        assert self._established is not None
        # Standard base64 for both methods (see the module docstring for hkdf-hmac-sha256).
        return self._established.calculate_mac(value, info)

    def mac_matches(self, method: str, value: str, info: str, tag: str) -> bool:
        assert self._established is not None
        good = self._established.calculate_mac(value, info)
        if hmac.compare_digest(good, tag):
            return True
        if method == MAC_V1:
            return hmac.compare_digest(
                self._established.calculate_mac_invalid_base64(value, info), tag
            )
        return False


def mac_info(sender: tuple[str, str], receiver: tuple[str, str], flow_id: str) -> str:
    """The MAC info prefix: sender user and device, receiver user and device, flow ID."""
    return f"MATRIX_KEY_VERIFICATION_MAC{sender[0]}{sender[1]}{receiver[0]}{receiver[1]}{flow_id}"
