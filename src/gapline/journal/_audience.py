"""Who reads what the bot sends into an encrypted room, kept in the journal's database.

A room key goes to every device of the joined members, and of the invited ones when the
room's ``m.room.history_visibility`` lets invited members read (``invited``, ``shared``,
``world_readable``). The bot keeps that audience from sync, per principal and room
(``journal_room_members``, ``journal_room_audience``), and writes each sync's changes in
the commit that moves its sync token, so after a restart (clean or SIGKILL) the stored
audience is exactly the one the stored token stands for: the next answer reaches an
invited member at once, with no wait for a full state resync and no full ``/state``
request before every encrypted send.

A room's audience is *known* from a sync whose state block is the room's whole state (a
first sync, or the sync of our own new join, as the client-server spec gives it) or from
one ``/state`` answer; incremental syncs then keep it current. A room never known this
way has no audience row: its first send asks the homeserver once. Our own departure
forgets the room (a rejoin's sync brings the whole state again).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gapline.matrix import ClientEvent, SyncResponse
from gapline.storage import Tx

__all__ = [
    "AudienceChange",
    "RoomMembers",
    "audience_changes",
    "load_audience",
    "record_audience",
    "room_members",
    "store_audience",
]

_DEFAULT_VISIBILITY = "shared"  # the spec's, for a room without the state event
_READERS = ("join", "invite")


@dataclass(frozen=True, slots=True)
class RoomMembers:
    """Who may read what the bot sends next: the joined members, the invited ones, and
    the room's ``m.room.history_visibility`` (the machine shares the key with invited
    members when it lets them read: ``invited``, ``shared``, ``world_readable``)."""

    joined: tuple[str, ...]
    invited: tuple[str, ...]
    history_visibility: str


def room_members(state: Sequence[ClientEvent]) -> RoomMembers:
    """The recipients of a room key, from the room's current state. A room with no
    ``m.room.history_visibility`` is ``shared`` (the spec's default)."""
    change = _reduce("", state, full=True)
    return change.members_after()


@dataclass(frozen=True, slots=True)
class AudienceChange:
    """One room's audience changes in one sync, in event order. ``full``: the events are
    the room's whole state (replace what is stored); ``forget``: our own departure, the
    room's audience is dropped (after it, ``members``/``visibility`` start afresh)."""

    room_id: str
    full: bool
    forget: bool
    members: tuple[tuple[str, str | None], ...]  # (user, 'join' | 'invite' | None: gone)
    visibility: str | None

    def members_after(self) -> RoomMembers:
        """The audience these changes describe on their own (for a ``full`` change)."""
        kept = {user: m for user, m in self.members if m is not None}
        return RoomMembers(
            tuple(sorted(u for u, m in kept.items() if m == "join")),
            tuple(sorted(u for u, m in kept.items() if m == "invite")),
            self.visibility or _DEFAULT_VISIBILITY,
        )


def _reduce(
    room_id: str, events: Sequence[ClientEvent], *, full: bool, principal_id: str = ""
) -> AudienceChange:
    members: dict[str, str | None] = {}
    visibility: str | None = None
    forget = False
    for event in events:
        if event.state_key is None:
            continue
        if event.type == "m.room.member" and event.state_key:
            membership = event.content.get("membership")
            if event.state_key == principal_id and membership in ("leave", "ban"):
                forget, full = True, False
                members.clear()
                visibility = None
                continue
            members[event.state_key] = membership if membership in _READERS else None
        elif event.type == "m.room.history_visibility" and event.state_key == "":
            value = event.content.get("history_visibility")
            visibility = value if isinstance(value, str) else visibility
    return AudienceChange(room_id, full, forget, tuple(members.items()), visibility)


def _own_new_join(event: ClientEvent, principal_id: str) -> bool:
    if event.type != "m.room.member" or event.state_key != principal_id:
        return False
    if event.content.get("membership") != "join":
        return False
    prev = (event.unsigned or {}).get("prev_content") or {}
    return prev.get("membership") != "join"


def audience_changes(
    response: SyncResponse, *, principal_id: str, initial: bool
) -> tuple[AudienceChange, ...]:
    """Every room's audience changes in one sync answer (state block, then timeline).
    A first sync's state block, or the one of a room we newly joined, is the whole
    state; a room we left is forgotten."""
    out: list[AudienceChange] = []
    for room_id, room in response.rooms.join.items():
        events = [*room.state.events, *room.timeline.events]
        full = initial or any(_own_new_join(e, principal_id) for e in events)
        change = _reduce(room_id, events, full=full, principal_id=principal_id)
        if change.full or change.forget or change.members or change.visibility is not None:
            out.append(change)
    for room_id in response.rooms.leave:
        out.append(AudienceChange(room_id, False, True, (), None))
    return tuple(out)


def _known(tx: Tx, p: str, room_id: str) -> bool:
    row = tx.one(
        "SELECT 1 FROM journal_room_audience WHERE principal_id = ? AND room_id = ?",
        (p, room_id),
    )
    return row is not None


def _forget(tx: Tx, p: str, room_id: str) -> None:
    tx.execute(
        "DELETE FROM journal_room_members WHERE principal_id = ? AND room_id = ?", (p, room_id)
    )
    tx.execute(
        "DELETE FROM journal_room_audience WHERE principal_id = ? AND room_id = ?", (p, room_id)
    )


def store_audience(tx: Tx, p: str, room_id: str, members: RoomMembers) -> None:
    """Replace the room's audience with ``members`` (the room's whole state) and mark it
    known."""
    _forget(tx, p, room_id)
    rows = [(p, room_id, u, "join") for u in members.joined]
    rows += [(p, room_id, u, "invite") for u in members.invited]
    if rows:
        tx.executemany(
            "INSERT INTO journal_room_members (principal_id, room_id, user_id, membership)"
            " VALUES (?, ?, ?, ?)",
            rows,
        )
    tx.execute(
        "INSERT INTO journal_room_audience (principal_id, room_id, history_visibility)"
        " VALUES (?, ?, ?)",
        (p, room_id, members.history_visibility),
    )


def record_audience(tx: Tx, p: str, changes: Sequence[AudienceChange]) -> None:
    """Write one sync's audience changes (inside the commit of its sync token). Changes
    to a room whose audience is not known are dropped: its first send asks the
    homeserver for the whole state anyway."""
    for change in changes:
        if change.forget:
            _forget(tx, p, change.room_id)
            if not change.full and not change.members and change.visibility is None:
                continue
        if change.full:
            store_audience(tx, p, change.room_id, change.members_after())
            continue
        if not _known(tx, p, change.room_id):
            continue
        for user, membership in change.members:
            if membership is None:
                tx.execute(
                    "DELETE FROM journal_room_members"
                    " WHERE principal_id = ? AND room_id = ? AND user_id = ?",
                    (p, change.room_id, user),
                )
            else:
                tx.execute(
                    "INSERT INTO journal_room_members (principal_id, room_id, user_id,"
                    " membership) VALUES (?, ?, ?, ?) ON CONFLICT (principal_id, room_id,"
                    " user_id) DO UPDATE SET membership = excluded.membership",
                    (p, change.room_id, user, membership),
                )
        if change.visibility is not None:
            tx.execute(
                "UPDATE journal_room_audience SET history_visibility = ?"
                " WHERE principal_id = ? AND room_id = ?",
                (change.visibility, p, change.room_id),
            )


def load_audience(tx: Tx, p: str, room_id: str) -> RoomMembers | None:
    """The room's stored audience; None when it is not known (ask the homeserver)."""
    row = tx.one(
        "SELECT history_visibility FROM journal_room_audience"
        " WHERE principal_id = ? AND room_id = ?",
        (p, room_id),
    )
    if row is None:
        return None
    rows = tx.all(
        "SELECT user_id, membership FROM journal_room_members"
        " WHERE principal_id = ? AND room_id = ? ORDER BY user_id",
        (p, room_id),
    )
    return RoomMembers(
        tuple(str(u) for u, m in rows if m == "join"),
        tuple(str(u) for u, m in rows if m == "invite"),
        str(row[0]),
    )
