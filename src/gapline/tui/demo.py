"""`gapline demo`: a throwaway homeserver, a room with a gap in its history, and the TUI.

The story, the same with and without a terminal:

1. start a throwaway Synapse on 127.0.0.1 (the installed ``matrix-synapse``);
2. register alice (the reader) and bob (the writer); bob makes a room, alice joins;
3. bob writes a first stretch of history; alice's client syncs and retains it;
4. alice's client closes; bob writes a few hundred more messages;
5. alice's client opens the room again: its recent load fetches the newest
   messages, and between them and the retained stretch sits a gap.

``gapline demo`` then shows the room in the TUI (press ``f`` to fill the gap);
``gapline demo --headless`` fills it itself and prints the timeline before and
after, and the fill reports. It exits 0 only if a gap was found and filled
with continuity ``Verified``.

Everything (the server, the store, the temp directory) is removed on every way
out: ``q`` or Ctrl-C in the TUI, Ctrl-C before it, SIGTERM, SIGHUP (the
terminal closed), and a crash of the TUI. A signal ends the demo with status
128 + its number, after the teardown.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from textual import events
from textual.binding import Binding

from gapline.clikit import CommandError, Exit, examples, positive_int
from gapline.history import (
    Continuity,
    Engine,
    EngineConfig,
    EventItem,
    FillGap,
    HistoryGapItem,
    HistoryRepair,
    HistoryRepairChanged,
    HistoryRepairReport,
    Mirror,
    OpenRoom,
    PaginateBackwards,
    Publisher,
    RepairPhase,
    RetryRecent,
    TimelineItem,
)
from gapline.history.rooms import RoomDirectory, RoomSummary
from gapline.matrix import Session
from gapline.matrix.devserver import SynapseServer, SynapseStartError
from gapline.tui._app import GaplineApp
from gapline.tui._text import item_line
from gapline.tui._ways_out import WaysOut
from gapline.tui.cli import engine_connect

__all__ = ["CRASH_KEY_ENV", "DEMO_CONFIG", "EXAMPLES", "Story", "configure", "prepare_story", "run"]

PASSPHRASE = "demo"
ROOM_NAME = "gapline demo"
# Small pages make the fill visible page by page; the budget covers the whole gap,
# so one press of `f` fills it.
DEMO_CONFIG = EngineConfig(page_size=20, recent_pages=2, page_budget=30)
# A test hook: the key named here makes the demo's TUI raise, as a bug would.
CRASH_KEY_ENV = "GAPLINE_DEMO_CRASH_KEY"

DESCRIPTION = """\
A throwaway homeserver, a room with a gap in its history, and the TUI to fill it.

Starts Synapse on 127.0.0.1 in a temporary directory, writes a first stretch of
history that the client keeps, closes the client, writes more, and opens the room
again: press f to fill the gap, q to quit. Everything is removed on every way out
(q, Ctrl-C, SIGTERM, the terminal closing, a crash)."""

EXAMPLES = examples(
    "gapline demo",
    "gapline demo --headless --first 10 --more 100",
)


@dataclass(frozen=True, slots=True)
class Story:
    server: SynapseServer
    reader: Session
    writer: Session
    room_id: str
    store: Path


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--headless",
        action="store_true",
        help="no terminal UI: print the timeline before and after filling the gap",
    )
    parser.add_argument(
        "--screenshots",
        type=Path,
        metavar="DIR",
        help="no terminal: run the TUI headless and save gap-before.svg / gap-after.svg in DIR",
    )
    parser.add_argument(
        "--first", type=positive_int, default=40, metavar="N", help="messages retained first"
    )
    parser.add_argument(
        "--more", type=positive_int, default=300, metavar="N", help="messages written while away"
    )


def run(args: argparse.Namespace) -> Coroutine[None, None, int]:
    wants_terminal = not args.headless and args.screenshots is None
    if wants_terminal and not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise CommandError(
            "the demo's TUI needs a terminal on stdin and stdout; "
            "`gapline demo --headless` tells the same story as text",
            Exit.NO_TERMINAL,
        )
    return _main(args)


def _say(text: str) -> None:
    # After SIGHUP the terminal is gone: the teardown goes on without its messages.
    with contextlib.suppress(OSError):
        print(text, flush=True)


class _Teardown:
    """What the demo made, removed on every way out: synchronous, idempotent and
    thread-safe (the ways-out watcher may run it when the demo itself cannot)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self._starting: Future[SynapseServer] | None = None
        self._lock = threading.Lock()
        self._closed = False

    async def start_server(self) -> SynapseServer:
        # The start runs in a thread, which a cancellation cannot stop: the future is kept
        # so `close` waits for a start still under way and stops what it started.
        executor = ThreadPoolExecutor(1, thread_name_prefix="gapline-demo-synapse")
        self._starting = executor.submit(SynapseServer.start, self.workdir / "synapse")
        executor.shutdown(wait=False)
        return await asyncio.shield(asyncio.wrap_future(self._starting))

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._starting is not None:
                # A start that failed stopped what it had started itself.
                with contextlib.suppress(SynapseStartError):
                    self._starting.result().stop()
            shutil.rmtree(self.workdir, ignore_errors=True)


async def _main(args: argparse.Namespace) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="gapline-demo-"))
    teardown = _Teardown(workdir)
    ways = WaysOut(teardown.close)
    with_tui = not args.headless and args.screenshots is None
    with ways.installed(terminal=sys.stdin.fileno() if with_tui else None):
        try:
            _say(f"starting a throwaway Synapse on 127.0.0.1 (files in {workdir}) …")
            try:
                server = await teardown.start_server()
            except SynapseStartError as exc:
                print(
                    f"gapline demo: Synapse could not start: {exc}\n{exc.log_tail}",
                    file=sys.stderr,
                )
                return Exit.FAILED
            story = await prepare_story(server, workdir / "store", first=args.first, more=args.more)
            if args.screenshots is not None:
                return await screenshots(story, args.screenshots)
            if args.headless:
                return await headless(story)
            return await _tui(story, ways)
        except asyncio.CancelledError:
            if ways.status is None or ways.task is None:
                raise
            ways.task.uncancel()
            return ways.status
        finally:
            ways.teardown()
            if ways.signum is not None:
                _say(f"stopped by {signal.Signals(ways.signum).name}")
            _say("demo homeserver stopped; everything removed")


async def prepare_story(
    server: SynapseServer,
    store: Path,
    *,
    first: int = 40,
    more: int = 300,
    say: Callable[[str], None] = _say,
) -> Story:
    """Steps 2 to 4 of the story; returns what the reader's client needs to open the room."""
    alice = await server.register_user("alice", "alice-password")
    bob = await server.register_user("bob", "bob-password")
    room_id = await server.create_room(bob, name=ROOM_NAME)
    await server.invite_and_join(bob, room_id, alice)
    say(f"{bob.user_id} writes {first} messages in {room_id} …")
    await server.send_messages(bob, room_id, [f"early message {i + 1}" for i in range(first)])

    say(f"{alice.user_id}'s client syncs and retains them …")
    await asyncio.to_thread(store.mkdir, parents=True, exist_ok=True)
    async with (
        server.client(alice) as client,
        Engine.open(store, client, passphrase=PASSPHRASE, sync=False) as engine,
    ):
        await engine.sync_once(initial=True)
        await engine.execute(OpenRoom(room_id))
        await engine.execute(HistoryRepair(RetryRecent(room_id)))  # waits for the recent load
        await engine.execute(PaginateBackwards(room_id, first + 20))  # retain the whole stretch

    say(f"the client is closed; {bob.user_id} writes {more} more messages …")
    await server.send_messages(bob, room_id, [f"later message {i + 1}" for i in range(more)])
    return Story(server, alice, bob, room_id, store)


# -- headless -------------------------------------------------------------------------------


def timeline_text(items: Sequence[TimelineItem], *, keep: int = 3) -> list[str]:
    """The timeline as lines; long runs of messages keep their first and last ``keep``."""
    lines: list[str] = []
    run: list[EventItem] = []

    def flush() -> None:
        if len(run) > 2 * keep + 1:
            lines.extend("  " + item_line(e) for e in run[:keep])
            lines.append(f"  … {len(run) - 2 * keep} more messages …")
            lines.extend("  " + item_line(e) for e in run[-keep:])
        else:
            lines.extend("  " + item_line(e) for e in run)
        run.clear()

    for item in items:
        if isinstance(item, EventItem):
            run.append(item)
        else:
            flush()
            lines.append("  " + item_line(item))
    flush()
    return lines


def report_line(report: HistoryRepairReport) -> str:
    parts = [f"phase={report.phase.value}", f"pages={report.pages}", f"events={report.events}"]
    if report.continuity is not None:
        parts.append(f"continuity={report.continuity.value}")
    if report.stop is not None:
        parts.append(f"stop={report.stop.value}")
    if report.failure is not None:
        parts.append(f"failure={report.failure}")
    return "fill report: " + " ".join(parts)


class _Reports:
    def __init__(self) -> None:
        self.reports: list[HistoryRepairReport] = []

    async def publish(self, event: object) -> None:
        if isinstance(event, HistoryRepairChanged):
            self.reports.append(event.report)
            _say("  " + report_line(event.report))


async def headless(story: Story) -> int:
    """Open the room, print it, fill its gap, print it again; 0 iff filled and Verified."""
    mirror, reports = Mirror(), _Reports()
    async with (
        story.server.client(story.reader) as client,
        Engine.open(
            story.store,
            client,
            passphrase=PASSPHRASE,
            sink=Publisher([mirror, reports]),
            config=DEMO_CONFIG,
            sync=False,
        ) as engine,
    ):
        await engine.sync_once()
        await engine.execute(OpenRoom(story.room_id))
        await engine.execute(HistoryRepair(RetryRecent(story.room_id)))
        items = mirror.items(story.room_id) or ()
        _say(f"\ntimeline of {ROOM_NAME!r} as the client opens it:")
        for line in timeline_text(items):
            _say(line)
        gaps = [i for i in items if isinstance(i, HistoryGapItem)]
        if not gaps:
            _say("\nno gap found: nothing to fill")
            return 1
        gap = gaps[-1]
        _say(f"\nfilling the gap {gap.id} …")
        for _ in range(10):
            answer = await engine.execute(HistoryRepair(FillGap(story.room_id, gap.id)))
            last = reports.reports[-1] if reports.reports else None
            _say(f"  answer: {type(answer).__name__}")
            if last is None or last.phase is not RepairPhase.Paused or last.stop is None:
                break
        items = mirror.items(story.room_id) or ()
        _say(f"\ntimeline of {ROOM_NAME!r} after the fill:")
        for line in timeline_text(items):
            _say(line)
        at = next(
            (
                i
                for i, it in enumerate(items)
                if getattr(it, "event_id", None) == gap.older_boundary
            ),
            None,
        )
        if at is not None:
            _say("\nwhere the gap was:")
            for item in items[max(0, at - 1) : at + 3]:
                _say("  " + item_line(item))
        settled = [r for r in reports.reports if r.gap_id == gap.id and r.settled]
        verified = bool(settled) and (
            settled[-1].phase is RepairPhase.Ready and settled[-1].continuity is Continuity.Verified
        )
        still_there = any(i.id == gap.id for i in items)
        if verified and not still_there:
            total = sum(r.events for r in settled)
            _say(f"\ngap filled: {total} events, continuity Verified")
            return 0
        _say("\nthe gap was NOT filled with continuity Verified")
        return 1


# -- with a terminal ------------------------------------------------------------------------


class DemoApp(GaplineApp):
    """The TUI on the demo room: Ctrl-C quits too (the demo is not a place to copy text),
    and the crash hook of `CRASH_KEY_ENV` raises on its key, as a bug would."""

    BINDINGS = [Binding("ctrl+c", "quit", "Quit", show=False, priority=True)]

    def __init__(self, story: Story) -> None:
        directory = RoomDirectory([RoomSummary(story.room_id, name=ROOM_NAME)])
        super().__init__(
            demo_connect(story, directory),
            rooms=directory,
            room_id=story.room_id,
            page_budget=DEMO_CONFIG.page_budget,
            show_first_gap=True,
        )
        self._crash_key = os.environ.get(CRASH_KEY_ENV) or None

    def on_key(self, event: events.Key) -> None:
        if event.key == self._crash_key:
            raise RuntimeError(f"the demo TUI crashed on purpose (${CRASH_KEY_ENV})")


async def _tui(story: Story, ways: WaysOut) -> int:
    app = DemoApp(story)
    ways.app = app
    try:
        await app.run_async()
    finally:
        ways.app = None
    if ways.status is not None:
        return ways.status
    return app.return_code or 0


async def screenshots(story: Story, out: Path, *, size: tuple[int, int] = (100, 30)) -> int:
    """The TUI on the demo room without a terminal: a screenshot before and after ``f``."""
    app = DemoApp(story)
    await asyncio.to_thread(out.mkdir, parents=True, exist_ok=True)
    async with app.run_test(size=size) as pilot:

        async def until(done: Callable[[], bool], what: str) -> None:
            for _ in range(600):
                if done():
                    return
                await pilot.pause(0.05)
            raise TimeoutError(f"the demo TUI never showed {what}")

        def loaded() -> bool:
            return (
                bool(app.timeline.gaps())
                and app.mirror.state.recent(story.room_id).kind.value == "Loaded"
            )

        await until(loaded, "the gap")
        await pilot.pause()
        app.save_screenshot("gap-before.svg", path=str(out))
        await pilot.press("f")

        def filled() -> bool:
            report = app.mirror.state.repairs.get(story.room_id)
            return report is not None and report.phase is RepairPhase.Ready

        await until(filled, "the gap filled")
        await pilot.pause()
        app.save_screenshot("gap-after.svg", path=str(out))
        await app.shutdown()
    _say(f"saved {out / 'gap-before.svg'} and {out / 'gap-after.svg'}")
    return 0


def demo_connect(story: Story, directory: RoomDirectory):
    return engine_connect(
        story.server.base_url,
        story.reader,
        story.store,
        passphrase=PASSPHRASE,
        config=DEMO_CONFIG,
        directory=directory,
        trust_env=False,
    )
