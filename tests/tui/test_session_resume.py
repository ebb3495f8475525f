"""A session that ends while the TUI runs: an expired one resumes with its password on the
same device (the sync loop goes on, the new token is sealed in the store); a declined
prompt or a revoked session leaves the status line saying how to log in again."""

from __future__ import annotations

from datetime import UTC
from pathlib import Path

from textual.pilot import Pilot
from textual.widgets import Input

from gapline.history import EngineConfig
from gapline.history._cache_store import CacheStore
from gapline.history._session_store import load_session
from gapline.history.cli_session import on_store
from gapline.history.rooms import RoomDirectory
from gapline.matrix import RetryPolicy, Session
from gapline.matrix.testing import FakeHomeserver
from gapline.storage import KdfParams
from gapline.tui import GaplineApp
from gapline.tui._connection import Reachability
from gapline.tui._session_prompt import PasswordScreen
from gapline.tui.cli import engine_connect
from tests.tui.support import until

HINT = "`gapline login --store S --user @alice:fake.test`"


def _app(fake: FakeHomeserver, alice: Session, store: Path, room: str) -> GaplineApp:
    directory = RoomDirectory()
    reachability = Reachability()
    connect = engine_connect(
        fake.base_url,
        alice,
        store,
        passphrase="pw",
        config=EngineConfig(),
        directory=directory,
        reachability=reachability,
        login_hint=HINT,
        kdf_cost=KdfParams.cheap(),
        transport=fake.transport,
        retry=RetryPolicy(attempts=1),
    )
    return GaplineApp(connect, rooms=directory, room_id=room, tz=UTC, reachability=reachability)


def _room() -> tuple[FakeHomeserver, Session, Session, str]:
    """A fake homeserver; alice (password "right") and bob in a room with one message."""
    fake = FakeHomeserver()
    alice = fake.register("alice", "right")
    bob = fake.register("bob")
    room = fake.create_room(alice.user_id, name="r", members=[bob.user_id])
    fake.send_messages(bob.user_id, room, ["before"])
    return fake, alice, bob, room


def _bodies(app: GaplineApp) -> list[str | None]:
    return [getattr(row.item, "body", None) for row in app.timeline.rows]


def _status(app: GaplineApp) -> str:
    return str(app.query_one("#status").render())


async def _answer(app: GaplineApp, pilot: Pilot, password: str) -> None:
    await until(pilot, lambda: isinstance(app.screen, PasswordScreen), "the password screen")
    screen = app.screen
    screen.query_one(Input).value = password
    await pilot.press("enter")
    await until(pilot, lambda: app.screen is not screen, "the screen answered")


async def test_an_expired_session_resumes_with_its_password_on_the_same_device(
    tmp_path: Path,
) -> None:
    fake, alice, bob, room = _room()
    store = tmp_path / "store"
    app = _app(fake, alice, store, room)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: "before" in _bodies(app), "the room loaded")
        fake.expire(alice)
        fake.send_messages(bob.user_id, room, ["while expired"])  # wakes the long poll

        await _answer(app, pilot, "wrong")
        await until(pilot, lambda: isinstance(app.screen, PasswordScreen), "asked again")
        problem = str(app.screen.query_one("#password-problem").render())
        assert "refused the login" in problem
        assert "waiting for the password" in _status(app)
        await _answer(app, pilot, "right")

        await until(pilot, lambda: "while expired" in _bodies(app), "the sync went on")
        fake.send_messages(bob.user_id, room, ["after"])
        await until(pilot, lambda: "after" in _bodies(app), "later syncs arrive")
        assert "signed out" not in _status(app)
        assert app.reachability.signed_out is None
        await app.shutdown()

    async def stored(cache: CacheStore) -> Session | None:
        return await load_session(cache.backend, cache.cipher)

    kept = await on_store(store, "pw", stored)
    assert kept is not None
    assert kept.device_id == alice.device_id
    assert kept.access_token != alice.access_token  # the new token, sealed for the next start


async def test_a_declined_prompt_and_a_revoked_session_say_how_to_log_in_again(
    tmp_path: Path,
) -> None:
    fake, alice, bob, room = _room()
    app = _app(fake, alice, tmp_path / "a", room)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: "before" in _bodies(app), "the room loaded")
        fake.expire(alice)
        fake.send_messages(bob.user_id, room, ["wake"])
        await until(pilot, lambda: isinstance(app.screen, PasswordScreen), "the password screen")
        await pilot.press("escape")
        await until(pilot, lambda: "signed out" in _status(app), "the status line")
        assert f"the session expired; log in again with {HINT}" in _status(app)
        await app.shutdown()

    carol = fake.register("carol")
    room = fake.create_room(carol.user_id, name="c", members=[bob.user_id])
    fake.send_messages(bob.user_id, room, ["before"])
    app = _app(fake, carol, tmp_path / "c", room)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: "before" in _bodies(app), "the room loaded")
        fake.revoke(carol)
        fake.send_messages(bob.user_id, room, ["wake"])
        await until(pilot, lambda: "signed out" in _status(app), "the status line")
        assert "the homeserver ended this session" in _status(app)
        assert not isinstance(app.screen, PasswordScreen)  # a new login would be a new device
        await app.shutdown()
