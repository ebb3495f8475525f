"""The PostgreSQL forms of journal rules agree with their generic twins.

``gapline.journal._sql_postgres`` restates two rules for PostgreSQL: admission of an
original in one statement (twin of ``_admission.admit_in_steps``) and the outbox claim
with row locks (twin of ``_outbox.CLAIM_DELIVERIES``). The generic form runs on
PostgreSQL too, so each test replays one scenario on two fresh PostgreSQL databases,
the generic form on one and the PostgreSQL form on the other, and compares what each
step returns, every journal table after every step, and the wake-ups sent.

The scenarios reach each branch of the twinned statements: held edits (the author's,
another sender's, an unresolved one), tombstones, duplicates, stale epochs,
unresolved previews, threads, context-only and unprojected events, and a state no API
path produces (an original already projected while an edit of it is still held). The
last tests change one twin and check the comparison notices.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from gapline.journal import (
    SIDECAR_KEY,
    STREAM_STATUS_KEY,
    DeliveryRequest,
    DeliveryStage,
    DepartureSource,
    EventKind,
    InboundEvent,
    JournalStore,
    PrincipalJournal,
    _outbox,
    _projection,
    _sql_postgres,
)
from gapline.journal._admission import admit_in_steps
from gapline.journal._events import journal_insert
from gapline.journal._projection import ParsedKind, parse_inbound
from gapline.storage import Backend, Tx, open_backend
from tests.journal.contract import ALICE, BOT, MALLORY, ROOM, edit, message, redaction

pytestmark = pytest.mark.postgres

OTHER_BOT = "@other:example.org"
SIDECAR = {SIDECAR_KEY: {"url": "mxc://example.org/x", "size": 9, "sha256": "00"}}
END = "end-of-scenario"


# -- the scenario ----------------------------------------------------------------------


@dataclass(frozen=True)
class Admit:
    event: InboundEvent
    epoch: int = 0


@dataclass(frozen=True)
class Fence:
    room_id: str = ROOM


@dataclass(frozen=True)
class Chunk:
    events: tuple[InboundEvent, ...]
    epoch: int = 0


@dataclass(frozen=True)
class Raw:
    """State no API path produces; both forms must still agree on it."""

    sql: str
    params: tuple[Any, ...]


Step = Admit | Fence | Chunk | Raw


def reaction(event_id: str) -> InboundEvent:
    return InboundEvent(event_id, ROOM, None, ALICE, 50, "m.reaction", "{}", EventKind.REACTION)


WITHIN_ONE_EPOCH: tuple[Step, ...] = (
    # plain originals: actionable (wakes), context-only (compacted, no wake), threaded
    Admit(message("$plain", "plain", ts=10)),
    Admit(message("$ctx", "context", ts=11, kind=EventKind.CONTEXT_ONLY)),
    Admit(message("$thr", "threaded", ts=12, thread="$plain")),
    # an unresolved sidecar preview is a refresh debt derived from the receipt order
    Admit(message("$preview", "preview", ts=13, extra=SIDECAR)),
    # edits held before their original: the author's applies, another sender's goes
    Admit(edit("$a-edit", "$held", "author's", ts=30)),
    Admit(edit("$m-edit", "$held", "attacker's", ts=31, sender=MALLORY)),
    Admit(message("$held", "v0", ts=20)),
    # only another sender's held edit: the original stays unedited
    Admit(edit("$m-only", "$lonely", "attacker's", ts=40, sender=MALLORY)),
    Admit(message("$lonely", "v0", ts=21)),
    # the author's held edit is itself unresolved: its own debt comes along
    Admit(edit("$u-edit", "$udebt", "x", ts=41, new_content_extra=SIDECAR)),
    Admit(message("$udebt", "v0", ts=22)),
    # tombstoned before it arrives: journaled, never projected
    Admit(redaction("$red", "$gone")),
    Admit(message("$gone", "resurrected?", ts=23)),
    # duplicates refuse, whatever the form
    Admit(message("$plain", "plain", ts=10)),
    Admit(message("$ctx", "context", ts=11, kind=EventKind.CONTEXT_ONLY)),
    # events the projection ignores: a reaction, junk content, the bot's own progress
    Admit(reaction("$react")),
    Admit(
        InboundEvent("$junk", ROOM, None, ALICE, 51, "m.room.message", "[", EventKind.ACTIONABLE)
    ),
    Admit(
        edit(
            "$progress",
            "$plain",
            "…",
            sender=BOT,
            new_content_extra={STREAM_STATUS_KEY: "streaming"},
        )
    ),
    # an original hydration already projected: admission only journals it
    Chunk((message("$hydrated", "from history", ts=5),)),
    Admit(message("$hydrated", "from history", ts=5)),
    # an original already projected while an edit of it is still held
    Raw(
        "INSERT INTO journal_messages (principal_id, room_id, thread_id, created_ts,"
        " logical_event_id, sender, body, edited, rev_ts, rev_event_id, refresh_token)"
        " VALUES (?, ?, '', 6, '$stale', ?, 'seen', 0, 0, '', NULL)",
        (BOT, ROOM, ALICE),
    ),
    Raw(
        "INSERT INTO journal_held_edits (principal_id, room_id, target_event_id, sender,"
        " edit_ts, edit_event_id, body, refresh_token) VALUES (?, ?, '$stale', ?, 60,"
        " '$stale-edit', 'still held', NULL)",
        (BOT, ROOM, ALICE),
    ),
    Admit(message("$stale", "seen", ts=6)),
)

ACROSS_A_FENCE: tuple[Step, ...] = (
    # a departure fences, a stale admission refuses, the current one admits
    Fence(),
    Admit(message("$late", "late", ts=70), epoch=0),
    Admit(edit("$after-edit", "$after", "edited", ts=80), epoch=1),
    Admit(message("$after", "after", ts=71), epoch=1),
    Admit(reaction("$react2"), epoch=1),
)

ADMISSION_SCENARIO = WITHIN_ONE_EPOCH + ACROSS_A_FENCE

AdmissionForm = Callable[..., int | None]


def postgres_form(tx: Tx, p: str, event: InboundEvent, *args: Any) -> int | None:
    """What PostgreSQL runs: the one-statement form where it applies, else the generic."""
    parsed = args[0]
    if parsed.kind in (ParsedKind.ORIGINAL, ParsedKind.OTHER):
        return _sql_postgres.admit_in_one_statement(tx, p, event, *args)
    return admit_in_steps(tx, p, event, *args)


async def run_step(
    journal: PrincipalJournal, backend: Backend, step: Step, form: AdmissionForm
) -> Any:
    p = journal.principal_id
    if isinstance(step, Admit):
        parsed = parse_inbound(p, step.event)
        thread, params, wake = journal_insert(p, step.event, step.epoch)
        return await backend.write(
            lambda tx: form(
                tx, p, step.event, parsed, thread, params, journal.pending_channel, wake
            )
        )
    if isinstance(step, Fence):
        return await journal.fence_departure(step.room_id, source=DepartureSource.LOCAL)
    if isinstance(step, Chunk):
        return await journal.project_chunk(ROOM, step.events, expected_epoch=step.epoch)
    return await backend.write(lambda tx: tx.execute(step.sql, step.params))


# -- two databases, one scenario ---------------------------------------------------------


@dataclass
class Side:
    backend: Backend
    journal: PrincipalJournal
    wakeups: AsyncIterator[str]


@pytest.fixture
async def sides(make_postgres_dsn: Callable[..., str]) -> AsyncIterator[tuple[Side, Side]]:
    opened: list[Backend] = []
    try:
        made = []
        for _ in range(2):
            backend = await open_backend(make_postgres_dsn())
            opened.append(backend)
            journal = (await JournalStore.open(backend)).principal(BOT)
            made.append(Side(backend, journal, aiter(backend.subscribe(journal.pending_channel))))
        yield made[0], made[1]
    finally:
        for backend in opened:
            await backend.close()


async def tables(backend: Backend) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every journal table, in a canonical order."""

    def dump(tx: Tx) -> dict[str, list[tuple[Any, ...]]]:
        names = tx.all(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
            " AND tablename LIKE 'journal\\_%' ORDER BY tablename"
        )
        return {name: sorted(tx.all(f"SELECT * FROM {name}"), key=repr) for (name,) in names}

    return await backend.read(dump)


async def wakeups_until_end(side: Side) -> list[str]:
    """The pending channel's payloads up to the END marker sent after the scenario."""
    await side.backend.write(lambda tx: tx.notify(side.journal.pending_channel, END))
    seen: list[str] = []
    async with asyncio.timeout(30):  # a guard against a hang, not a timing assertion
        while (payload := await anext(side.wakeups)) != END:
            seen.append(payload)
    return seen


async def disagreements(
    generic: Side,
    postgres: Side,
    scenario: Sequence[Step],
    forms: tuple[AdmissionForm, AdmissionForm],
) -> list[str]:
    """Where the two forms' results differ, step by step (empty when they agree)."""
    found: list[str] = []
    for index, step in enumerate(scenario):
        results = [
            await run_step(side.journal, side.backend, step, form)
            for side, form in zip((generic, postgres), forms, strict=True)
        ]
        if results[0] != results[1]:
            found.append(f"step {index} {step}: returned {results[0]!r} vs {results[1]!r}")
        before, after = await tables(generic.backend), await tables(postgres.backend)
        for name in sorted(set(before) | set(after)):
            if before.get(name) != after.get(name):
                found.append(
                    f"step {index} {step}: {name} {before.get(name)!r} vs {after.get(name)!r}"
                )
    wakes = [await wakeups_until_end(side) for side in (generic, postgres)]
    if wakes[0] != wakes[1]:
        found.append(f"wake-ups {wakes[0]!r} vs {wakes[1]!r}")
    return found


async def test_admission_in_one_statement_agrees_with_admission_in_steps(
    sides: tuple[Side, Side],
) -> None:
    generic, postgres = sides
    forms = (admit_in_steps, postgres_form)
    assert await disagreements(generic, postgres, WITHIN_ONE_EPOCH, forms) == []
    # The scenario reached what it claims to (a vacuous agreement would prove nothing).
    state = await tables(postgres.backend)
    rows = {r[4]: r for r in state["journal_messages"]}
    assert rows["$held"][6] == "author's" and rows["$lonely"][7] == 0
    assert rows["$udebt"][6] is None and rows["$udebt"][10] is not None
    assert rows["$preview"][10] is not None and "$gone" not in rows
    assert rows["$stale"][6] == "seen"
    assert [r[5] for r in state["journal_held_edits"]] == ["$stale-edit"]
    assert await disagreements(generic, postgres, ACROSS_A_FENCE, forms) == []
    rows = {r[4]: r for r in (await tables(postgres.backend))["journal_messages"]}
    assert rows["$after"][6] == "edited" and "$late" not in rows


# -- the outbox claim ------------------------------------------------------------------------


async def outbox_scenario(journal: PrincipalJournal, other: PrincipalJournal) -> None:
    for source in ("$q1", "$q2", "$q3", "$q4"):
        await journal.admit(message(source, ts=1), epoch=0)
        await journal.begin_turn(source)
        await journal.enqueue(
            DeliveryRequest(
                source, f"d-{source}", DeliveryStage.INITIAL, ROOM, None, "m.room.message", "{}"
            )
        )
    await other.admit(message("$theirs", ts=1), epoch=0)
    await other.begin_turn("$theirs")
    await other.enqueue(
        DeliveryRequest(
            "$theirs", "d-theirs", DeliveryStage.INITIAL, ROOM, None, "m.room.message", "{}"
        )
    )


async def claims(side: Side, statement: str, other: PrincipalJournal) -> list[Any]:
    """Claim in pages of two, acknowledging the first claimed row of each page."""
    p = side.journal.principal_id
    await outbox_scenario(side.journal, other)
    returned: list[Any] = []
    for _ in range(4):
        rows = await side.backend.write(lambda tx: tx.all(statement, (p, 2)))
        returned.append(sorted(rows, key=repr))
        if rows:
            first = min(rows, key=lambda r: r[0])
            await side.backend.write(
                lambda tx, first=first: tx.execute(
                    "UPDATE journal_outbox SET acked_event_id = ? WHERE seq = ?",
                    (f"$ack{first[0]}", first[0]),
                )
            )
    returned.append(await tables(side.backend))
    return returned


async def claim_disagreements(generic: Side, postgres: Side) -> list[str]:
    results = []
    for side, statement in (
        (generic, _outbox.CLAIM_DELIVERIES),
        (postgres, _sql_postgres.CLAIM_DELIVERIES_FOR_UPDATE),
    ):
        other = JournalStore(side.backend).principal(OTHER_BOT)
        results.append(await claims(side, statement, other))
    return [f"{a!r} vs {b!r}" for a, b in zip(*results, strict=True) if a != b]


async def test_claim_for_update_agrees_with_the_generic_claim(sides: tuple[Side, Side]) -> None:
    generic, postgres = sides
    assert await claim_disagreements(generic, postgres) == []


# -- the comparisons can fail ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("module", "name", "old", "new"),
    [
        # the PostgreSQL form sweeps held edits even when it projected nothing
        (_sql_postgres, "ADMIT_ORIGINAL", "AND EXISTS (SELECT 1 FROM m)", "AND TRUE"),
        # the PostgreSQL form derives another refresh token for an unresolved preview
        (_sql_postgres, "ADMIT_ORIGINAL", "'r' || j.seq::text", "'h' || j.seq::text"),
        # the PostgreSQL form ignores tombstones
        (
            _sql_postgres,
            "ADMIT_ORIGINAL",
            "WHERE ?::boolean AND NOT EXISTS",
            "WHERE ?::boolean OR EXISTS",
        ),
        # the PostgreSQL form wakes for every event
        (
            _sql_postgres,
            "ADMIT_ORIGINAL",
            "FROM j WHERE ?::boolean)",
            "FROM j WHERE ?::boolean OR TRUE)",
        ),
        # the generic form projects an original as if edited
        (_projection, "PROJECT_ORIGINAL", "?, 0, 0, ''", "?, 1, 0, ''"),
    ],
)
async def test_a_changed_admission_twin_is_noticed(
    sides: tuple[Side, Side],
    monkeypatch: pytest.MonkeyPatch,
    module: Any,
    name: str,
    old: str,
    new: str,
) -> None:
    statement = getattr(module, name)
    assert old in statement
    monkeypatch.setattr(module, name, statement.replace(old, new))
    generic, postgres = sides
    assert (
        await disagreements(generic, postgres, ADMISSION_SCENARIO, (admit_in_steps, postgres_form))
        != []
    )


async def test_a_changed_claim_twin_is_noticed(
    sides: tuple[Side, Side], monkeypatch: pytest.MonkeyPatch
) -> None:
    statement = _sql_postgres.CLAIM_DELIVERIES_FOR_UPDATE
    monkeypatch.setattr(
        _sql_postgres,
        "CLAIM_DELIVERIES_FOR_UPDATE",
        statement.replace("ORDER BY seq", "ORDER BY seq DESC"),
    )
    generic, postgres = sides
    assert await claim_disagreements(generic, postgres) != []
