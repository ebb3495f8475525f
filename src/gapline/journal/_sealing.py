"""Contents at rest: a journal opened with a key seals every message text it stores.

A bot with a passphrase reads encrypted rooms; what it decrypts must not reach the disk
in the clear, and SQLite's WAL (like PostgreSQL's) keeps every page version ever
written, so a value must be sealed *before* its first write, not rewritten later. The
principal-bound store (`PrincipalJournal`) is the one place contents pass through, so it
seals them there, with an AEAD (`gapline.storage.StoreCipher`) under a key derived from
the passphrase-wrapped store key:

- the replay input of an event (``journal_events.source``, ``resolved_text``);
- the projection's bodies (``journal_messages.body``, ``journal_held_edits.body``);
- a turn's result (``journal_turns.result``) and an outbox payload before it is
  Megolm-encrypted (``journal_outbox.content``), approval cards and their resolution
  edits included;
- an approval's exact call (``approval_cards.tool_name``, ``arguments``) and its digest
  (``call_digest``); the approval id is keyed instead (`Sealing.id_key`), since it is a
  key of rows and of transaction ids.

Identifiers, timestamps and the order of rows stay in the clear: every index and every
SQL rule (tombstones, edit order, row-value cursors) works on them unchanged, and a body
is only ever moved, never inspected, by SQL. A sealed text is ``gls1:`` + URL-safe
base64; sealed bytes start with ``GLS\\x01``. Neither is what a Matrix content (JSON) or
a handler's text begins with, so unsealed rows written before the key existed still
read. A journal opened without its key refuses to show a sealed value
(`SealedContent`): never ciphertext as if it were a body.
"""

from __future__ import annotations

import base64
import dataclasses

from gapline.journal._types import (
    ConversationPage,
    ConversationRow,
    Delivery,
    InboundEvent,
    JournalError,
    PendingEvent,
    TurnRecord,
)
from gapline.storage import Backend, StorageError, StoreCipher, open_cipher

__all__ = [
    "SEALING_LABEL",
    "SealedContent",
    "Sealing",
    "open_sealing",
    "require_no_seal",
    "sealing_of",
]

SEALING_LABEL = "gapline/journal/contents/v1"
"""The journal's content key is the store cipher's keyed hash of this label."""

APPROVAL_ID_LABEL = "gapline/journal/approval-ids/v1"
"""The key approval ids are keyed with is the content cipher's keyed hash of this label."""

_TEXT = "gls1:"
_DATA = b"GLS\x01"
_AAD_TEXT = b"gapline/journal/text"
_AAD_DATA = b"gapline/journal/data"


class SealedContent(JournalError):
    """A sealed value was read by a journal opened without its key."""


class Sealing:
    """Seals on the way in, opens on the way out; without a cipher it only opens what was
    never sealed (and refuses what was)."""

    __slots__ = ("_cipher",)

    def __init__(self, cipher: StoreCipher | None = None) -> None:
        self._cipher = cipher

    @property
    def active(self) -> bool:
        return self._cipher is not None

    def id_key(self) -> bytes | None:
        """The key that makes derived ids (approval ids) reveal nothing they derive from;
        None without a cipher (nothing is sealed then, so nothing is hidden either)."""
        return None if self._cipher is None else self._cipher.lookup_key(APPROVAL_ID_LABEL)

    def _key(self) -> StoreCipher:
        if self._cipher is None:
            raise SealedContent(
                "this journal's contents are sealed: open it with its passphrase "
                "(--passphrase-file FILE or $GAPLINE_PASSPHRASE)"
            )
        return self._cipher

    def text(self, value: str | None) -> str | None:
        if value is None or self._cipher is None:
            return value
        sealed = self._cipher.encrypt(value.encode("utf-8"), _AAD_TEXT)
        return _TEXT + base64.urlsafe_b64encode(sealed).decode("ascii")

    def open_text(self, value: str | None) -> str | None:
        if value is None or not value.startswith(_TEXT):
            return value
        sealed = base64.urlsafe_b64decode(value[len(_TEXT) :])
        return self._key().decrypt(sealed, _AAD_TEXT).decode("utf-8")

    def data(self, value: str | bytes) -> bytes:
        raw = value.encode("utf-8") if isinstance(value, str) else bytes(value)
        if self._cipher is None or not raw:
            return raw
        return _DATA + self._cipher.encrypt(raw, _AAD_DATA)

    @staticmethod
    def is_sealed_text(value: str) -> bool:
        """Whether ``value`` was stored sealed (by whichever principal wrote it)."""
        return value.startswith(_TEXT)

    def open_data(self, value: bytes | None) -> bytes | None:
        if value is None or not value.startswith(_DATA):
            return value
        return self._key().decrypt(value[len(_DATA) :], _AAD_DATA)

    # -- the envelopes that carry contents ----------------------------------------------------

    def event(self, event: InboundEvent) -> InboundEvent:
        if self._cipher is None:
            return event
        return dataclasses.replace(
            event, content=self.data(event.content), resolved_text=self.text(event.resolved_text)
        )

    def open_event(self, event: InboundEvent) -> InboundEvent:
        content = event.content
        raw = content.encode("utf-8") if isinstance(content, str) else content
        opened = self.open_data(raw)
        return dataclasses.replace(
            event,
            content=b"" if opened is None else opened,
            resolved_text=self.open_text(event.resolved_text),
        )

    def open_pending(self, pending: PendingEvent) -> PendingEvent:
        return dataclasses.replace(pending, event=self.open_event(pending.event))

    def open_row(self, row: ConversationRow) -> ConversationRow:
        return dataclasses.replace(row, body=self.open_text(row.body) or "")

    def open_page(self, page: ConversationPage) -> ConversationPage:
        return dataclasses.replace(
            page,
            rows=tuple(self.open_row(r) for r in page.rows),
            root=None if page.root is None else self.open_row(page.root),
        )

    def open_turn(self, turn: TurnRecord) -> TurnRecord:
        return dataclasses.replace(turn, result=self.open_data(turn.result))

    def open_delivery(self, delivery: Delivery) -> Delivery:
        opened = self.open_data(delivery.content)
        return dataclasses.replace(delivery, content=b"" if opened is None else opened)


def sealing_of(cipher: StoreCipher) -> Sealing:
    """The journal's sealing under a store's (passphrase-wrapped) key."""
    return Sealing(StoreCipher(cipher.lookup_key(SEALING_LABEL)))


async def open_sealing(backend: Backend, passphrase: str) -> Sealing:
    """The sealing of an existing journal that has a passphrase (for readers: nothing is
    created). Raises `SealedContent` when it has none, `WrongPassphrase` when it is not
    this one."""
    try:
        row = await backend.read(lambda tx: tx.one("SELECT 1 FROM gapline_cipher_key WHERE id = 1"))
    except StorageError:
        row = None
    if row is None:
        raise SealedContent("this journal has no passphrase: open it without one")
    return sealing_of(await open_cipher(backend, passphrase))


async def require_no_seal(backend: Backend, user_id: str) -> None:
    """Raise `SealedContent` when ``user_id`` ran on this database with a passphrase (its
    device's encryption state is here, and its contents are sealed): starting it without
    one would show it ciphertext. Other principals of the database are not concerned."""
    try:
        row = await backend.read(lambda tx: tx.one("SELECT user_id FROM e2ee_account WHERE id = 1"))
    except StorageError:
        return  # no encryption state in this database at all
    if row is not None and row[0] == user_id:
        raise SealedContent(
            f"{user_id} keeps its encryption state and sealed contents in this journal: "
            "start it with its passphrase (--passphrase-file FILE or $GAPLINE_PASSPHRASE)"
        )
