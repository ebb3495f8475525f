"""When the homeserver stops answering, or ends the session: say so, and resume what can be.

:class:`SessionPrompt` is mixed into the app (``self`` is the app). It reacts to every
change of the app's :class:`~gapline.tui._connection.Reachability`: a notice when the
homeserver stops answering, and a password screen when the session expired (a soft
logout). The client that saw the expiry waits for the answer, logs the same device in
again and syncs on; Esc declines, and the status line then says how to log in again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Input, Static

from gapline.tui._connection import PasswordWanted

if TYPE_CHECKING:
    from gapline.tui._app import GaplineApp

__all__ = ["PasswordScreen", "ReachabilityChanged", "SessionPrompt"]


class ReachabilityChanged(Message):
    """The homeserver stopped or started answering, or the session's state changed."""


class PasswordScreen(ModalScreen[str | None]):
    """The account's password, to resume its expired session: Enter resumes, Esc declines."""

    DEFAULT_CSS = """
    PasswordScreen { align: center middle; }
    PasswordScreen #password-box {
        width: 64; height: auto; padding: 1 2; border: thick $warning; background: $surface;
    }
    PasswordScreen #password-problem { color: $text-error; }
    PasswordScreen Input { margin-top: 1; }
    """
    BINDINGS = [Binding("escape", "decline", "Stay signed out")]

    def __init__(self, wanted: PasswordWanted) -> None:
        super().__init__()
        self.wanted = wanted

    def compose(self) -> ComposeResult:
        with Vertical(id="password-box"):
            yield Static(Text("The session expired", style="bold"))
            yield Static(
                f"The homeserver logged {self.wanted.user_id} out of device "
                f"{self.wanted.device_id}. Its password resumes the same device; "
                "nothing here is lost. Esc stays signed out."
            )
            if self.wanted.problem is not None:
                yield Static(self.wanted.problem, id="password-problem")
            yield Input(password=True, placeholder="password", id="password")

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        if event.value:
            self.dismiss(event.value)

    def action_decline(self) -> None:
        self.dismiss(None)


class SessionPrompt:
    """Reachability and session notices of :class:`~gapline.tui._app.GaplineApp` (a mixin)."""

    _problem_told: str | None = None  # the unreachability last announced
    _password_asked: PasswordWanted | None = None  # the request whose screen is open

    def _reachability_changed(self: GaplineApp) -> None:
        self.post_message(ReachabilityChanged())

    def on_reachability_changed(self: GaplineApp, _message: ReachabilityChanged) -> None:
        reachability = self.reachability
        problem = reachability.problem
        if problem is not None and problem != self._problem_told:
            self.notice(f"the homeserver does not answer: {problem}", severity="warning")
        self._problem_told = problem
        wanted = reachability.password_wanted
        if wanted is not None and wanted is not self._password_asked:
            self._password_asked = wanted
            self.push_screen(PasswordScreen(wanted), reachability.answer_password)
        self._refresh_status()
