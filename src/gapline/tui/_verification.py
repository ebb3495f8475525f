"""Verifying a device in the terminal: pick one, compare seven emoji, say whether they match.

The engine runs the flow (``StartVerification`` and the answers; it publishes
``VerificationChanged`` for every step, whichever side moved it). This module
only shows it:

- :class:`DevicePicker` (``V``): the devices of the room's members and of this
  account, each with its trust; Enter asks the chosen one to verify;
- :class:`VerificationScreen`: one flow, as a modal. An incoming request asks
  "Accept? y/n"; at the comparison it shows the emoji with their names (and the
  three numbers) and asks "Do they match? y/n" (``n`` tells the other side
  they differ, ``m.mismatched_sas``); then verified, or why it ended (a
  mismatch, a timeout, the other side cancelling). Esc cancels a flow under
  way (the other side is told) and closes one that ended;
- :class:`Verification`, mixed into the app: a modal per flow, opened when a
  flow first shows up and kept up to date.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from gapline.history import (
    AcceptVerification,
    CancelVerification,
    Command,
    ConfirmVerification,
    Device,
    StartVerification,
    TrustLevel,
    VerificationChanged,
    VerificationPhase,
)
from gapline.tui._encryption import CryptoView

if TYPE_CHECKING:
    from gapline.tui._app import GaplineApp

__all__ = ["DevicePicker", "Verification", "VerificationScreen", "flow_text"]

P = VerificationPhase

_ENDED_BECAUSE = {
    "m.mismatched_sas": "the emoji did not match",
    "m.timeout": "it timed out",
    "m.user": "it was cancelled",
    "m.key_mismatch": "the keys did not match",
    "m.mismatched_commitment": "the keys did not match what was promised",
    "m.accepted": "another device answered first",
    "m.unknown_method": "there is no verification method both sides speak",
    "m.unexpected_message": "a step came out of order, or from an unknown device",
}

_CSS = """
VerificationScreen, DevicePicker { align: center middle; }
#verification, #picker { width: 72; height: auto; max-height: 24; padding: 1 2;
                         border: thick $accent; background: $surface; }
#picker OptionList { height: auto; max-height: 16; }
"""


def _who(event: VerificationChanged, names: Mapping[str, str | None]) -> str:
    user = names.get(event.other_user) or event.other_user
    return f"{user} ({event.other_device})" if event.other_device else user


def _asks_us(event: VerificationChanged) -> bool:
    """The flow waits for this person to agree to it."""
    return not event.outgoing and event.state in (P.Requested, P.Started)


def flow_text(event: VerificationChanged, names: Mapping[str, str | None] | None = None) -> Text:
    """What the modal says of a flow's state (pure, for the screen and the tests)."""
    who = _who(event, names or {})
    text = Text("Verify ", style="bold")
    text.append(who, style="bold")
    text.append("\n\n")
    match event.state:
        case _ if _asks_us(event):
            text.append(f"{who} asks to verify with this device.\n\n")
            text.append("Accept? ", style="bold")
            text.append("y / n")
        case P.Requested | P.Ready | P.Started | P.Accepted:
            text.append("Waiting for the other device to answer…\n\n", style="dim")
            text.append("Esc cancels", style="dim")
        case P.ShowSas:
            text.append("Compare with what the other device shows:\n\n")
            for symbol, name in event.emoji or ():
                text.append(f" {symbol} ", style="bold")
                text.append(f"{name}  ")
            if event.decimals is not None:
                text.append("\n\n" + "  ".join(str(d) for d in event.decimals), style="bold")
            text.append("\n\nDo they match? ", style="bold")
            text.append("y / n   (Esc cancels)")
        case P.Confirmed:
            text.append("Waiting for the other device to confirm…\n\n", style="dim")
            text.append("Esc cancels", style="dim")
        case P.Done:
            text.append("✔ Verified", style="bold green")
            if event.cross_signed:
                text.append(" and cross-signed", style="bold green")
            text.append(".\n\nEnter closes", style="dim")
        case _:
            why = _ENDED_BECAUSE.get(event.cancel_code or "", event.cancel_code or "cancelled")
            side = "by you" if event.cancelled_by_us else "by the other side"
            text.append(f"Not verified: {why} ({side}).", style="bold red")
            if event.cancel_reason and event.cancel_code not in _ENDED_BECAUSE:
                text.append(f"\n{event.cancel_reason}", style="dim")
            text.append("\n\nEnter closes", style="dim")
    return text


class VerificationScreen(ModalScreen[None]):
    """One verification flow (see the module doc)."""

    DEFAULT_CSS = _CSS
    BINDINGS = [
        Binding("y", "answer(True)", "Yes"),
        Binding("n", "answer(False)", "No"),
        Binding("escape", "escape", "Cancel / close"),
        Binding("enter", "close", "Close", show=False),
    ]

    def __init__(self, event: VerificationChanged, send: Callable[[Command], object],
                 names: Mapping[str, str | None]) -> None:  # fmt: skip
        super().__init__()
        self.event = event
        self._send = send
        self._names = names

    def compose(self) -> ComposeResult:
        with Vertical(id="verification"):
            yield Static(flow_text(self.event, self._names), id="verification-text")

    @property
    def text(self) -> str:
        """What the modal shows now, as plain text."""
        return flow_text(self.event, self._names).plain

    def show(self, event: VerificationChanged) -> None:
        self.event = event
        if self.is_mounted:
            self.query_one("#verification-text", Static).update(flow_text(event, self._names))

    def action_answer(self, yes: bool) -> None:
        flow = self.event.flow_id
        if _asks_us(self.event):
            self._send(AcceptVerification(flow) if yes else CancelVerification(flow))
        elif self.event.state is P.ShowSas:
            self._send(ConfirmVerification(flow, matches=yes))

    def action_escape(self) -> None:
        if self.event.finished:
            self.dismiss()
        else:
            self._send(CancelVerification(self.event.flow_id))

    def action_close(self) -> None:
        if self.event.finished:
            self.dismiss()


class DevicePicker(ModalScreen[tuple[str, str] | None]):
    """Choose a device to verify: Enter asks it, Esc closes."""

    DEFAULT_CSS = _CSS
    BINDINGS = [Binding("escape", "dismiss(None)", "Close")]

    def __init__(self, devices: Iterable[Device], names: Mapping[str, str | None]) -> None:
        super().__init__()
        self._options = []
        for d in devices:
            user = names.get(d.user_id) or d.user_id
            mark = "✔ " if d.trust is TrustLevel.VERIFIED else ""
            label = f"{mark}{user} · {d.display_name or d.device_id} ({d.device_id})"
            self._options.append(Option(label, id=f"{d.user_id}\n{d.device_id}"))

    def compose(self) -> ComposeResult:
        with Vertical(id="picker"):
            yield Static(Text("Verify which device?", style="bold"))
            yield OptionList(*self._options)

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        user, _, device = (event.option.id or "").partition("\n")
        self.dismiss((user, device))


class Verification:
    """Verification flows of :class:`~gapline.tui._app.GaplineApp` (a mixin)."""

    _flows_shown: dict[str, VerificationScreen] | None = None  # flow ID -> its open modal

    def _verification_screens(self: GaplineApp) -> dict[str, VerificationScreen]:
        if self._flows_shown is None:
            self._flows_shown = {}
        return self._flows_shown

    def action_verify(self: GaplineApp) -> None:
        """``V``: pick a device of the room's members (or of this account) to verify."""
        engine = self._engine
        if not isinstance(engine, CryptoView):
            self.notice("verification needs end-to-end encryption", severity="warning")
            return
        users = {m.user_id for m in self.mirror.members(self.room_id or "")}
        if self.me is not None:
            users.add(self.me)
        devices = [d for found in engine.devices(sorted(users)).values() for d in found
                   if d.trust is not TrustLevel.OWN]  # fmt: skip
        if not devices:
            self.notice("no other device is known to verify")
            return

        def chosen(picked: tuple[str, str] | None) -> None:
            if picked is not None:
                self.command(StartVerification(picked[0], picked[1]))

        self.push_screen(DevicePicker(devices, self._names()), chosen)

    def verification_changed(self: GaplineApp, event: VerificationChanged) -> None:
        """A flow moved: update its modal, or open one for a flow not seen yet."""
        if event.state is P.Done:
            self._refresh_members()  # the device list shows it verified
        screens = self._verification_screens()
        screen = screens.get(event.flow_id)
        if screen is not None:
            screen.show(event)
            return
        if event.finished:
            return  # ended before it was shown (another device answered, say)
        screen = VerificationScreen(event, self.command, self._names())
        screens[event.flow_id] = screen

        def closed(_: None) -> None:
            screens.pop(event.flow_id, None)

        self.push_screen(screen, closed)
