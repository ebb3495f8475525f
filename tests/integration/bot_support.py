"""Helpers shared by the bot integration tests: run a bot, wait for answers, inspect rooms."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx

from gapline.journal import Bot, BotConfig, Handler, JournalStore, TurnState, echo
from gapline.journal._progress import STREAM_STATUS_KEY
from gapline.matrix import ClientEvent, MatrixClient, Session
from gapline.storage import open_backend
from tests.activity import Activity

T = TypeVar("T")

PASSWORD = "password"


async def eventually(
    probe: Callable[[], Awaitable[T | None]], *, within: float = 60.0, what: str = "condition"
) -> T:
    """Wait until ``probe`` returns something other than None/False.

    It is re-checked whenever a bot of this test did something: answered a request or
    committed a write (:func:`running_bot`), or wrote a log line (:func:`bot_process`).
    """
    return await Activity.current().until(probe, what=what, within=within)


@contextlib.asynccontextmanager
async def running_bot(
    homeserver: str,
    user_id: str,
    store: str,
    *,
    allow: frozenset[str] = frozenset(),
    handler: Handler = echo,
    timeline_limit: int = 100,
    sidecar_limit: int = 16_000,
    passphrase: str | None = None,
) -> AsyncGenerator[Bot]:
    activity = Activity.current()
    backend = await open_backend(store)
    bot = Bot(
        BotConfig(
            homeserver=homeserver,
            user=user_id,
            password=PASSWORD,
            store=store,
            handler=handler,
            allow_inviters=allow,
            sync_timeline_limit=timeline_limit,
            sidecar_limit=sidecar_limit,
            passphrase=passphrase,
        ),
        backend=activity.backend(backend),
        transport=activity.transport(httpx.AsyncHTTPTransport()),
    )
    task = asyncio.create_task(bot.run())
    try:
        ready = asyncio.create_task(bot.ready.wait())
        done, _ = await asyncio.wait({task, ready}, timeout=60, return_when="FIRST_COMPLETED")
        if task in done:
            task.result()  # raises the bot's failure
        assert ready in done, "bot did not finish its first sync"
        yield bot
    finally:
        task.cancel()
        # A bot that ignores its cancellation is a bug to report, not a test to hang.
        done, _ = await asyncio.wait({task}, timeout=30)
        if task not in done:
            raise AssertionError("the bot did not stop within 30 s of being cancelled")
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await backend.close()


def bot_process(
    homeserver: str,
    user_id: str,
    store: str,
    *,
    fault: str | None = None,
    log_path: Path,
    extra_env: Mapping[str, str] | None = None,
    handler: str = "echo",
) -> subprocess.Popen[bytes]:
    """``gapline bot`` as a subprocess (what the crash matrix kills); its log goes to
    ``log_path``, each line a signal for :func:`eventually`."""
    env = dict(os.environ)
    env.pop("GAPLINE_FAULT", None)
    if fault is not None:
        env["GAPLINE_FAULT"] = fault
    env.update(extra_env or {})
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gapline.cli",
            "bot",
            "--homeserver",
            homeserver,
            "--user",
            user_id,
            "--password",
            PASSWORD,
            "--store",
            store,
            "--handler",
            handler,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert process.stderr is not None
    Activity.current().pump(process.stderr, log_path.open("ab"))
    return process


async def wait_joined(client: MatrixClient, room_id: str, user_id: str) -> None:
    async def joined() -> bool:
        return user_id in await client.joined_members(room_id)

    await eventually(joined, what=f"{user_id} to join {room_id}")


async def room_events(client: MatrixClient, room_id: str) -> list[ClientEvent]:
    """Every event of the room, oldest first (``/messages`` is the order's truth)."""
    events: list[ClientEvent] = []
    token: str | None = None
    while True:
        page = await client.messages(room_id, from_=token, dir="b", limit=500)
        events.extend(page.chunk)
        if not page.end or not page.chunk:
            break
        token = page.end
    events.reverse()
    return events


@dataclass(frozen=True)
class Answer:
    """The bot's visible answer to one message, as the room shows it."""

    reply_event_id: str
    final_body: str | None
    progress_edits: int
    final_edits: int


def answers_by_source(events: list[ClientEvent], bot_id: str) -> dict[str, list[Answer]]:
    """Bot replies grouped by the message they answer, with their edit history."""
    replies: dict[str, tuple[str, str]] = {}  # reply id -> (source id, placeholder body)
    for event in events:
        relates = event.content.get("m.relates_to") or {}
        if event.sender != bot_id or relates.get("rel_type") == "m.replace":
            continue
        source = (relates.get("m.in_reply_to") or {}).get("event_id")
        if source:
            replies[event.event_id] = (source, event.content.get("body", ""))
    finals: dict[str, str] = {}
    final_count: dict[str, int] = {}
    progress: dict[str, int] = {}
    for event in events:
        relates = event.content.get("m.relates_to") or {}
        if event.sender != bot_id or relates.get("rel_type") != "m.replace":
            continue
        target = str(relates.get("event_id"))
        new = event.content.get("m.new_content") or {}
        if new.get(STREAM_STATUS_KEY) == "streaming":
            progress[target] = progress.get(target, 0) + 1
        else:
            finals[target] = str(new.get("body"))
            final_count[target] = final_count.get(target, 0) + 1
    out: dict[str, list[Answer]] = {}
    for reply_id, (source, _body) in replies.items():
        out.setdefault(source, []).append(
            Answer(
                reply_id,
                finals.get(reply_id),
                progress.get(reply_id, 0),
                final_count.get(reply_id, 0),
            )
        )
    return out


async def turn_states(store_dsn: str, principal: str, source_ids: list[str]) -> dict[str, Any]:
    backend = await open_backend(store_dsn)
    try:
        journal = (await JournalStore.open(backend)).principal(principal)
        out: dict[str, Any] = {}
        for source in source_ids:
            turn = await journal.turn(source)
            out[source] = None if turn is None else turn.state
        return out
    finally:
        await backend.close()


def delivered(states: dict[str, Any]) -> bool:
    return all(state is TurnState.DELIVERED for state in states.values())


async def make_bot_user(kit: Any) -> Session:
    return await kit.user("bot", PASSWORD)
