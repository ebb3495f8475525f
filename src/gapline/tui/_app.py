"""The Textual app: a room list, a timeline with its gaps, a status line, a compose box.

The app never reaches into the engine. It is handed a ``connect`` function
that opens an engine publishing into a sink the app provides and yields
something with ``async execute(command) -> Answer`` (the real
:class:`~gapline.history.Engine`, or a fake in tests). The engine runs in the
app's own asyncio loop, inside a worker the app owns: it is opened when the
app mounts and closed (every room publishing ``Idle``) before the app exits.

Published events reach the app as messages, so they are applied on the
Textual loop, in publish order, by one handler: a :class:`Mirror` keeps every
open room's rows (and threads', members, who types) and the timeline pane
applies the diffs of what it shows (the room, or one of its threads) in place.
Row actions (reply, edit, delete, react, thread, read) are in ``_actions``.
"""

from __future__ import annotations

import asyncio
import logging
import webbrowser
from collections.abc import Callable
from dataclasses import replace
from datetime import tzinfo

from textual import on
from textual.app import App, ComposeResult
from textual.containers import Horizontal, Vertical
from textual.events import Resize
from textual.notifications import SeverityLevel
from textual.widgets import Footer, Input, Label, OptionList, ProgressBar, Static
from textual.worker import Worker, WorkerCancelled, WorkerFailed

from gapline.history import (
    Answer,
    Cancel,
    Command,
    EventItem,
    EventNotFound,
    Failed,
    FillGap,
    HistoryRepair,
    HistoryRepairChanged,
    Insert,
    Interrupted,
    Invalid,
    JoinRoom,
    MembersChanged,
    Mirror,
    MirrorError,
    Ok,
    OpenRoom,
    PaginateBackwards,
    PushFront,
    RecentHistoryChanged,
    RecentHistoryKind,
    RepairPhase,
    RetryRecent,
    RoomBusy,
    RoomNotOpen,
    TimelineChanged,
    TimelineReset,
    TypingChanged,
    VectorDiff,
    VerificationChanged,
)
from gapline.history.rooms import RoomDirectory
from gapline.tui._actions import PLACEHOLDER, RowActions
from gapline.tui._compose_box import ComposeBox
from gapline.tui._config import TuiConfig
from gapline.tui._connection import Reachability
from gapline.tui._engine_link import (
    AppSink,
    Connect,
    EngineEvent,
    EngineHandle,
    RoomsChanged,
    command_room,
)
from gapline.tui._help import HelpScreen
from gapline.tui._keys import BINDINGS as KEYS
from gapline.tui._keys import help_rows
from gapline.tui._links import RowLinks
from gapline.tui._panels import Panels
from gapline.tui._room_list import RoomList
from gapline.tui._search import TimelineSearch
from gapline.tui._session_prompt import SessionPrompt
from gapline.tui._status import StatusLines
from gapline.tui._switching import RoomSwitching
from gapline.tui._text import FillProgress
from gapline.tui._timeline import TimelineView
from gapline.tui._verification import Verification

log = logging.getLogger(__name__)

__all__ = ["Connect", "EngineHandle", "GaplineApp"]


def _inserted_events(diffs: tuple[VectorDiff, ...]) -> int:
    """Rows a fill page adds: events inserted before the end (sync appends at the end)."""
    return sum(
        1 for d in diffs if isinstance(d, (Insert, PushFront)) and isinstance(d.value, EventItem)
    )


class GaplineApp(
    RowActions,
    RowLinks,
    RoomList,
    RoomSwitching,
    TimelineSearch,
    Panels,
    StatusLines,
    SessionPrompt,
    Verification,
    App[int],
):
    """``gapline tui``: read rooms, see every gap where it is, fill it with one key."""

    TITLE = "gapline"
    CSS = """
    Screen { layout: vertical; }
    #main { height: 1fr; }
    #rooms { width: 24; height: 1fr; border: none; border-right: solid $panel-lighten-2; }
    #rooms:focus { border-right: solid $accent; }
    #room { width: 1fr; height: 1fr; }
    #room-title { height: 1; padding: 0 1; background: $panel; color: $text; text-style: bold; }
    #fill { height: 1; padding: 0 1; display: none; }
    #fill.-running { display: block; }
    #fill Label { width: auto; color: $text-success; padding-left: 1; }
    #fill ProgressBar { width: auto; }
    #fill Bar { width: 12; }
    #status { height: 1; padding: 0 1; background: $panel; color: $text-muted; }
    #status.-failed { color: $text-error; }
    #status.-offline { color: $text-warning; text-style: bold; }
    #search-bar { height: 1; display: none; background: $surface; }
    #search-bar.-shown { display: block; }
    #search { width: 24; height: 1; border: none; padding: 0 1; background: $surface; }
    #search:focus { border: none; background: $boost; }
    #search-info { width: 1fr; padding: 0 1; color: $text-muted; }
    #typing { height: 1; padding: 0 1; color: $text-muted; text-style: italic; display: none; }
    #typing.-typing { display: block; }
    #members { width: 26; height: 1fr; padding: 0 1; border-left: solid $panel-lighten-2;
               display: none; }
    #members.-shown { display: block; }
    """

    BINDINGS = KEYS
    # ctrl+p is the previous room here; the help panel (?) lists every key instead.
    ENABLE_COMMAND_PALETTE = False

    def __init__(
        self,
        connect: Connect,
        *,
        rooms: RoomDirectory | None = None,
        room_id: str | None = None,
        page_budget: int | None = None,
        tz: tzinfo | None = None,
        show_first_gap: bool = False,
        config: TuiConfig | None = None,
        reachability: Reachability | None = None,
        url_opener: Callable[[str], bool] = webbrowser.open,
    ) -> None:
        super().__init__()
        self.config = config if config is not None else TuiConfig()
        self.reachability = reachability if reachability is not None else Reachability()
        self.url_opener = url_opener  # opens a link (in a thread worker): webbrowser.open
        # The demo's "see the gap at once": when the first recent load settles, select
        # the newest gap and scroll it to the middle of the pane.
        self._show_first_gap = show_first_gap
        self._connect = connect
        self.directory = rooms if rooms is not None else RoomDirectory()
        self.room_id = room_id
        self.page_budget = page_budget
        self.tz = tz
        self.mirror = Mirror()
        self.notices: list[str] = []
        self._engine: EngineHandle | None = None
        self._engine_ready = asyncio.Event()
        self._stopping = asyncio.Event()
        self._engine_worker: Worker[None] | None = None
        self._unsubscribe: list[Callable[[], None]] = []
        self._fills: dict[str, str] = {}  # room id -> gap id of its running fill
        self.thread_root: str | None = None  # the thread shown instead of the room, if any
        self.me: str | None = None  # this account, once the engine says
        self._marked: dict[str, str] = {}  # room id -> the event MarkRead last named

    # -- layout --------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        with Horizontal(id="main"):
            yield OptionList(id="rooms")
            with Vertical(id="room"):
                yield Static("", id="room-title")
                yield TimelineView(tz=self.tz, id="timeline")
                with Horizontal(id="fill"):
                    yield ProgressBar(total=self.page_budget, show_eta=False, show_percentage=False)
                    yield Label("", id="fill-label")
                yield Static("", id="status")
                yield Static("", id="typing")
                with Horizontal(id="search-bar"):
                    yield Input(
                        placeholder="search · esc closes",
                        id="search",
                    )
                    yield Label("", id="search-info")
                yield ComposeBox(placeholder=PLACEHOLDER, id="compose")
            yield Static("", id="members")
        yield Footer()

    def on_resize(self, event: Resize | None = None) -> None:
        # Below 70 columns the room list would squeeze the timeline; the title line
        # still names the room (a hidden widget takes no focus, so tab skips it), and
        # ctrl+n / ctrl+p still switch. The member list takes the room list's place when
        # both would not fit. The event's size, not ``self.size``: the app takes the new
        # size only after its handlers ran.
        width = (event.size if event is not None else self.size).width
        members = self.query_one("#members").has_class("-shown")
        self.query_one("#rooms").display = width >= (120 if members else 70)

    @property
    def timeline(self) -> TimelineView:
        return self.query_one(TimelineView)

    def on_mount(self) -> None:
        self._apply_config()
        self._unsubscribe = [
            self.directory.subscribe(self._directory_changed),
            self.reachability.subscribe(self._reachability_changed),
        ]
        self._refresh_rooms()
        self._refresh_status()
        self.timeline.focus()
        self._engine_worker = self.run_worker(
            self._run_engine(), name="engine", group="engine", exit_on_error=False
        )

    def _apply_config(self) -> None:
        """The config file's keys (Textual's keymap) and colours (a theme over the chosen one)."""
        self.set_keymap(dict(self.config.keys))
        if self.config.theme is None and not self.config.colours:
            return
        base = self.get_theme(self.config.theme or self.theme)
        assert base is not None  # the config checked the name against the built-in themes
        if self.config.colours:
            base = replace(base, name="gapline-config", **self.config.colours)
            self.register_theme(base)
        self.theme = base.name

    def _directory_changed(self) -> None:
        self.post_message(RoomsChanged())

    def action_help(self) -> None:
        """Every key, as the config file bound them; Esc closes."""
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(help_rows(dict(self.config.keys))))

    async def _run_engine(self) -> None:
        try:
            async with self._connect(AppSink(self)) as engine:
                self._engine = engine
                self.me = getattr(engine, "me", None)
                self.timeline.me = self.me
                self._engine_ready.set()
                if self.room_id is not None:
                    self.command(OpenRoom(self.room_id))
                await self._stopping.wait()
        except Exception as exc:  # noqa: BLE001 - shown, then the app keeps its last rows
            self.notice(f"the engine stopped: {exc}", severity="error")
        finally:
            self._engine = None
            self._engine_ready.set()  # commands still waiting see it is gone

    async def action_quit(self) -> None:
        await self.shutdown()
        self.exit(0)

    async def shutdown(self) -> None:
        """Close the engine (its rooms publish ``Idle``) and wait for it."""
        self._stopping.set()
        worker = self._engine_worker
        if worker is not None and not worker.is_finished:
            try:
                await worker.wait()
            except (WorkerCancelled, WorkerFailed) as exc:
                # Quitting anyway: the engine's failure was already shown as a notice,
                # so it goes to the log rather than stopping the exit.
                log.warning("the engine stopped with an error on exit: %s", exc)
        for unsubscribe in self._unsubscribe:
            unsubscribe()
        self._unsubscribe = []

    # -- commands ------------------------------------------------------------------------

    def command(self, command: Command) -> Worker[Answer | None]:
        """Run ``command`` in a worker of its own (so ``Cancel`` reaches a running fill)."""
        return self.run_worker(self._execute(command), group="commands", exit_on_error=False)

    async def _execute(self, command: Command) -> Answer | None:
        if self._engine is None:
            await self._engine_ready.wait()
        engine = self._engine
        if engine is None:
            self.notice("the engine is not running", severity="error")
            return None
        rows_before = len(self.mirror.items(command_room(command) or "") or ())
        try:
            answer = await engine.execute(command)
        except Exception as exc:  # noqa: BLE001 - a notice, not a crash
            self.notice(f"internal error: {exc}", severity="error")
            return None
        self._answered(command, answer, rows_before)
        return answer

    def _answered(self, command: Command, answer: Answer, rows_before: int) -> None:
        match answer:
            case Ok():
                if isinstance(command, PaginateBackwards):
                    # The answer comes after its diffs were published; our handler may
                    # not have run them yet, so compare once the queue drained.
                    self.call_later(self._paginated, command.room_id, rows_before)
                elif isinstance(command, JoinRoom) and command.room.startswith("!"):
                    # A room id is the room itself: show it. An alias's room is only
                    # known once the room list has it (the answer carries no id).
                    self.show_room(command.room)
            case RoomBusy():
                self.notice(
                    "busy: another history operation runs in this room · c cancels it",
                    severity="warning",
                )
            case Interrupted():
                self.notice("stopped")
            case EventNotFound():
                self.notice("that gap is no longer there", severity="warning")
            case RoomNotOpen():
                self.notice("the room is not open", severity="warning")
            case Failed(message=message):
                self.notice(f"failed: {message}", severity="error")
            case Invalid(message=message):
                self.notice(f"invalid: {message}", severity="error")

    def _paginated(self, room_id: str, rows_before: int) -> None:
        if len(self.mirror.items(room_id) or ()) == rows_before:
            self.notice("the start of this room's accessible history is loaded")

    def notice(self, text: str, *, severity: SeverityLevel = "information") -> None:
        """A short notice (a toast); kept in :attr:`notices` for tests and the log."""
        self.notices.append(text)
        self.notify(text, severity=severity, timeout=5)

    # -- actions -------------------------------------------------------------------------

    def action_fill(self) -> None:
        if self.room_id is None:
            self.notice("open a room first", severity="warning")
            return
        gap = self.timeline.nearest_gap()
        if gap is None:
            self.notice("no gap in the loaded history of this room")
            return
        self.command(HistoryRepair(FillGap(self.room_id, gap.id)))

    def action_cancel(self) -> None:
        if self.room_id is not None:
            self.command(HistoryRepair(Cancel(self.room_id)))

    def action_retry(self) -> None:
        if self.room_id is not None:
            self.command(HistoryRepair(RetryRecent(self.room_id)))

    def action_scroll_back(self) -> None:
        view = self.timeline
        if view.at_top:
            if self.room_id is not None:
                self.command(PaginateBackwards(self.room_id, thread_root=self.thread_root))
        else:
            view.scroll_page_up(animate=False)

    def on_timeline_view_live_requested(self, _message: TimelineView.LiveRequested) -> None:
        self.action_live()

    def action_compose(self) -> None:
        self.query_one("#compose", ComposeBox).focus()

    @on(ComposeBox.Submitted, "#compose")
    def _send(self, event: ComposeBox.Submitted) -> None:
        if self.room_id is not None and self.submit(event.text):
            event.box.clear()
            self.timeline.focus()  # so the next key is a command again, not more text

    @on(Input.Submitted, "#search")
    def _search(self, event: Input.Submitted) -> None:
        self.run_search(event.value)

    @on(ComposeBox.Changed, "#compose")
    def _typed(self, event: ComposeBox.Changed) -> None:
        self.typed(event.text_area.text)

    def on_key(self, event) -> None:
        if event.key != "escape":
            return
        if self.focused is self.query_one("#compose", ComposeBox):
            if not self.leave_mode():
                self.timeline.focus()
            event.stop()
        elif self.close_search() or self.close_panel() or self.leave_thread():
            event.stop()

    # -- rooms ---------------------------------------------------------------------------

    @on(OptionList.OptionSelected, "#rooms")
    def _room_chosen(self, event: OptionList.OptionSelected) -> None:
        if event.option.id is not None:
            self.choose_room(event.option.id)

    # -- events --------------------------------------------------------------------------

    def on_engine_event(self, message: EngineEvent) -> None:
        event = message.event
        try:
            self.mirror.apply(event)
        except MirrorError as exc:
            self.notice(f"out of step with the engine: {exc}", severity="error")
            return
        view = self.timeline
        match event:
            case TimelineReset(room_id=room_id, items=items, thread_root=root):
                if room_id == self.room_id and root == self.thread_root:
                    view.reset(items)
                self._refresh_rooms()
            case TimelineChanged(room_id=room_id, diffs=diffs, thread_root=str(root)):
                if room_id == self.room_id and root == self.thread_root:
                    view.apply(diffs)
                    view.refresh_gaps()
            case TypingChanged(room_id=room_id):
                if room_id == self.room_id:
                    self._refresh_typing()
            case MembersChanged(room_id=room_id):
                if room_id == self.room_id:
                    self._refresh_members()
            case TimelineChanged(room_id=room_id, diffs=diffs):
                gap_id = self._fills.get(room_id)
                if gap_id is not None and gap_id in view.progress:
                    added = _inserted_events(diffs)
                    if added:
                        before = view.progress[gap_id]
                        view.progress[gap_id] = FillProgress(
                            before.pages + 1, before.events + added
                        )
                        self._show_progress()
                if room_id == self.room_id and self.thread_root is None:
                    view.apply(diffs)
                    view.refresh_gaps()
            case RecentHistoryChanged(room_id=room_id, state=state):
                if (
                    self._show_first_gap
                    and room_id == self.room_id
                    and state.kind is RecentHistoryKind.Loaded
                    and (gaps := view.gaps())
                ):
                    self._show_first_gap = False
                    view.select(gaps[-1].id, center=True)
                if state.kind is RecentHistoryKind.Idle:
                    gap_id = self._fills.pop(room_id, None)
                    if gap_id is not None:
                        view.progress.pop(gap_id, None)
                self._refresh_rooms()
            case HistoryRepairChanged(report=report):
                if report.phase is RepairPhase.Bridging:
                    self._fills[report.room_id] = report.gap_id
                    view.progress[report.gap_id] = FillProgress()
                    view.reports.pop(report.gap_id, None)
                    self._show_progress()
                else:
                    self._fills.pop(report.room_id, None)
                    view.progress.pop(report.gap_id, None)
                    view.reports[report.gap_id] = report
                    self._show_progress()
                view.refresh_gaps()
            case VerificationChanged():
                self.verification_changed(event)
        self._refresh_status()
