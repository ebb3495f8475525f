"""The client store: accepted messages, dedup keys, sync positions, retention gaps.

One ``commit_page`` transaction writes a page's outcome: accepted messages in
sequence order, any new retention gap, and the sync position. The primary key
``(context, owner, from_account, message_id)`` is the cross-relay dedup key,
and inserts are ``ON CONFLICT DO NOTHING``: if two relays race with copies of
one message, the first commit wins and the later one neither overwrites nor
re-applies. Positions only move forward (``WHERE position < excluded.position``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from gapline.meshline._canonical import NetworkContext
from gapline.meshline._content import UnknownContent
from gapline.meshline._envelope import MessageEnvelope
from gapline.meshline._timeline import (
    AcceptedMessage,
    Direction,
    GapState,
    PageOutcome,
    RetentionGap,
)
from gapline.storage import Backend, Migration, Tx

__all__ = ["MeshlineStore", "StoredMessage", "StoredPage"]

SCHEMA = "meshline"
MIGRATIONS = [
    Migration(
        1,
        "messages, sync positions and retention gaps",
        """
        -- One row per logical message (context, owner, from_account, message_id): the dedup key.
        CREATE TABLE meshline_messages (
            context TEXT NOT NULL,          -- trusted network context
            owner TEXT NOT NULL,            -- the local account whose timeline held it
            from_account TEXT NOT NULL,     -- envelope "from"
            message_id TEXT NOT NULL,       -- envelope "message_id"
            local_order INTEGER NOT NULL,   -- order of acceptance in this store (per owner)
            to_account TEXT NOT NULL,       -- envelope "to"
            direction TEXT NOT NULL,        -- inbound | outbound | self
            relay_id TEXT NOT NULL,         -- relay of the first accepted copy
            sequence INTEGER NOT NULL,      -- that copy's sequence on that relay
            accepted_at INTEGER NOT NULL,   -- relay acceptance time (unix s)
            created_at INTEGER NOT NULL,    -- envelope created_at
            content_type TEXT NOT NULL,     -- business object $type
            applicable INTEGER NOT NULL,    -- 0 for unknown $type: kept, never applied
            envelope_digest TEXT NOT NULL,  -- sha256 of the canonical envelope
            envelope TEXT NOT NULL,         -- canonical envelope JSON
            plaintext TEXT NOT NULL,        -- decrypted business object JSON
            PRIMARY KEY (context, owner, from_account, message_id)
        );
        CREATE INDEX meshline_messages_order ON meshline_messages (context, owner, local_order);
        -- Sync position per (context, account, relay): the largest fully processed sequence.
        CREATE TABLE meshline_sync_positions (
            context TEXT NOT NULL,
            owner TEXT NOT NULL,
            relay_id TEXT NOT NULL,
            position INTEGER NOT NULL,
            PRIMARY KEY (context, owner, relay_id)
        );
        -- Retention gaps reported by a relay: unrecoverable holes in the account's history.
        CREATE TABLE meshline_gaps (
            context TEXT NOT NULL,
            owner TEXT NOT NULL,
            relay_id TEXT NOT NULL,
            after_position INTEGER NOT NULL,   -- the position the sync was asked from
            before_position INTEGER,           -- first readable sequence after it, if known
            observed_at INTEGER NOT NULL,
            PRIMARY KEY (context, owner, relay_id, after_position)
        );
        """,
    )
]


@dataclass(frozen=True, slots=True)
class StoredMessage:
    local_order: int
    from_account: str
    message_id: str
    to_account: str
    direction: Direction
    relay_id: str
    sequence: int
    accepted_at: int
    content_type: str
    applicable: bool
    envelope: MessageEnvelope
    plaintext: bytes


@dataclass(frozen=True, slots=True)
class StoredPage:
    """What a commit actually added: only these are new to the application."""

    messages: tuple[AcceptedMessage, ...]
    gap: RetentionGap | None
    position: int


class MeshlineStore:
    """Store for one local account in one network context."""

    def __init__(self, backend: Backend, context: NetworkContext, owner: str):
        self._backend = backend
        self._context = str(context)
        self._owner = owner

    @classmethod
    async def open(cls, backend: Backend, context: NetworkContext, owner: str) -> MeshlineStore:
        await backend.migrate(SCHEMA, MIGRATIONS)
        return cls(backend, context, owner)

    @property
    def owner(self) -> str:
        return self._owner

    async def position(self, relay_id: str) -> int:
        """The sync position for ``relay_id`` (-1 before the first page)."""

        def op(tx: Tx) -> int:
            row = tx.one(
                "SELECT position FROM meshline_sync_positions WHERE context = ? AND owner = ? AND relay_id = ?",
                (self._context, self._owner, relay_id),
            )
            return -1 if row is None else int(row[0])

        return await self._backend.read(op)

    async def known_digests(self, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], str]:
        """Envelope digests of already accepted messages among ``keys``."""
        unique = list(dict.fromkeys(keys))

        def op(tx: Tx) -> dict[tuple[str, str], str]:
            found: dict[tuple[str, str], str] = {}
            for from_account, message_id in unique:
                row = tx.one(
                    "SELECT envelope_digest FROM meshline_messages"
                    " WHERE context = ? AND owner = ? AND from_account = ? AND message_id = ?",
                    (self._context, self._owner, from_account, message_id),
                )
                if row is not None:
                    found[(from_account, message_id)] = str(row[0])
            return found

        return await self._backend.read(op) if unique else {}

    async def commit_page(self, relay_id: str, outcome: PageOutcome) -> StoredPage:
        """Atomically store a processed page; return what was new."""
        ctx, owner = self._context, self._owner

        def op(tx: Tx) -> StoredPage:
            row = tx.one(
                "SELECT COALESCE(MAX(local_order), 0) FROM meshline_messages WHERE context = ? AND owner = ?",
                (ctx, owner),
            )
            order = int(row[0]) if row else 0
            added: list[AcceptedMessage] = []
            for message in outcome.accepted:  # already in sequence order
                env = message.envelope
                changed = tx.execute(
                    "INSERT INTO meshline_messages (context, owner, from_account, message_id, local_order,"
                    " to_account, direction, relay_id, sequence, accepted_at, created_at, content_type,"
                    " applicable, envelope_digest, envelope, plaintext)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                    (
                        ctx,
                        owner,
                        env.from_,
                        env.message_id,
                        order + 1,
                        env.to,
                        message.direction.value,
                        relay_id,
                        message.sequence,
                        message.accepted_at,
                        env.created_at,
                        _content_type(message),
                        1 if message.applicable else 0,
                        message.digest,
                        env.to_json().decode(),
                        message.plaintext.decode(),
                    ),
                )
                if changed != 0:
                    order += 1
                    added.append(message)
            gap = None
            if outcome.gap is not None:
                changed = tx.execute(
                    "INSERT INTO meshline_gaps (context, owner, relay_id, after_position, before_position,"
                    " observed_at) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                    (ctx, owner, relay_id, outcome.gap.after, outcome.gap.before, int(time.time())),
                )
                if changed != 0:
                    gap = outcome.gap
            tx.execute(
                "INSERT INTO meshline_sync_positions (context, owner, relay_id, position) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (context, owner, relay_id) DO UPDATE SET position = excluded.position"
                " WHERE meshline_sync_positions.position < excluded.position",
                (ctx, owner, relay_id, outcome.position),
            )
            row = tx.one(
                "SELECT position FROM meshline_sync_positions WHERE context = ? AND owner = ? AND relay_id = ?",
                (ctx, owner, relay_id),
            )
            return StoredPage(tuple(added), gap, int(row[0]) if row else outcome.position)

        return await self._backend.write(op)

    async def messages(self, *, after: int = 0, limit: int = 100) -> list[StoredMessage]:
        """Accepted messages in acceptance order, after ``local_order`` ``after``."""

        def op(tx: Tx) -> list[StoredMessage]:
            rows = tx.all(
                "SELECT local_order, from_account, message_id, to_account, direction, relay_id, sequence,"
                " accepted_at, content_type, applicable, envelope, plaintext FROM meshline_messages"
                " WHERE context = ? AND owner = ? AND local_order > ? ORDER BY local_order LIMIT ?",
                (self._context, self._owner, after, limit),
            )
            return [
                StoredMessage(
                    local_order=int(r[0]),
                    from_account=r[1],
                    message_id=r[2],
                    to_account=r[3],
                    direction=Direction(r[4]),
                    relay_id=r[5],
                    sequence=int(r[6]),
                    accepted_at=int(r[7]),
                    content_type=r[8],
                    applicable=bool(r[9]),
                    envelope=MessageEnvelope.from_json(r[10]),
                    plaintext=r[11].encode(),
                )
                for r in rows
            ]

        return await self._backend.read(op)

    async def gaps(self, *, limit: int = 100) -> list[RetentionGap]:
        def op(tx: Tx) -> list[RetentionGap]:
            rows = tx.all(
                "SELECT relay_id, after_position, before_position FROM meshline_gaps"
                " WHERE context = ? AND owner = ? ORDER BY relay_id, after_position LIMIT ?",
                (self._context, self._owner, limit),
            )
            return [
                RetentionGap(
                    self._owner,
                    r[0],
                    int(r[1]),
                    None if r[2] is None else int(r[2]),
                    GapState.UNAVAILABLE,
                )
                for r in rows
            ]

        return await self._backend.read(op)


def _content_type(message: AcceptedMessage) -> str:
    content = message.content
    if isinstance(content, UnknownContent):
        return content.type_name
    return type(content).type_name  # type: ignore[attr-defined]
