"""`gapline login` and `gapline logout` against the fake homeserver: the login types it
offers, SSO only, the sealed session reused, soft and hard logouts, logout itself."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gapline.clikit import CommandError, Exit
from gapline.history._accounts import DeviceRecord, choose_account, read_record
from gapline.history._failures import describe
from gapline.history._session_store import load_session
from gapline.history.cli_logout import logout
from gapline.history.cli_session import Target, login, on_store, sign_in
from gapline.matrix import UnknownToken
from gapline.matrix._responses import parse_error
from gapline.matrix.testing import FakeHomeserver

USER = "@alice:example.org"


def _target(fake: FakeHomeserver, store: Path, password: str | None = "password") -> Target:
    return Target(store, choose_account(store, USER, create=True), fake.base_url, password)


def _connect(fake: FakeHomeserver) -> Any:
    return lambda url, **kwargs: fake.client(**kwargs)


def _posts(fake: FakeHomeserver, endpoint: str) -> int:
    return sum(1 for r in fake.requests if r.endpoint == endpoint)


async def _logged_in(store: Path) -> tuple[FakeHomeserver, Target]:
    """A fake with alice, logged in with `gapline login`'s work into ``store``."""
    fake = FakeHomeserver()
    fake.register("alice")
    chosen = _target(fake, store)
    assert await login(chosen, "pp", None, connect=_connect(fake)) == Exit.OK
    return fake, chosen


async def _stored(chosen: Target) -> Any:
    """The sealed session of the account, read with its store open."""
    return await on_store(
        chosen.account.directory, "pp", lambda cache: load_session(cache.backend, cache.cipher)
    )


async def _resume(fake: FakeHomeserver, chosen: Target) -> Any:
    async with fake.client() as client:
        return await on_store(
            chosen.account.directory,
            "pp",
            lambda cache: sign_in(client, cache, chosen, device_id=None, name="test"),
        )


async def test_login_seals_the_session_and_the_next_start_needs_no_password(
    tmp_path: Path,
) -> None:
    fake = FakeHomeserver()
    fake.register("alice")
    chosen = _target(fake, tmp_path)
    assert await login(chosen, "pp", None, connect=_connect(fake)) == Exit.OK
    assert _posts(fake, "login_flows") == 1 and _posts(fake, "login") == 1
    record = read_record(chosen.account.directory)
    assert record is not None and record.user_id == USER and record.device_id
    assert record.homeserver == fake.base_url

    # No password this time: the sealed session is resumed (checked with whoami).
    session = await _resume(fake, _target(fake, tmp_path, password=None))
    assert session.device_id == record.device_id
    assert _posts(fake, "login") == 1
    assert _posts(fake, "whoami") == 1


async def test_an_sso_only_homeserver_is_one_line_before_any_password(tmp_path: Path) -> None:
    fake = FakeHomeserver()
    fake.register("alice")
    fake.login_types = ["m.login.sso", "m.login.token"]
    # No password given and no terminal: a prompt would fail; the SSO check comes first.
    chosen = _target(fake, tmp_path, password=None)
    with pytest.raises(CommandError) as refused:
        await login(chosen, "pp", None, connect=_connect(fake))
    assert refused.value.status == Exit.FAILED
    assert refused.value.message == (
        f"the homeserver at {fake.base_url} offers only single sign-on (SSO), which gapline "
        "does not support yet; it needs a password login (m.login.password)"
    )
    assert _posts(fake, "login") == 0

    fake.login_types = ["m.login.token"]
    with pytest.raises(
        CommandError, match=r"offers no password login \(it offers: m.login.token\)"
    ):
        await login(chosen, "pp", None, connect=_connect(fake))


async def test_a_soft_logout_asks_for_a_login_on_the_same_device(tmp_path: Path) -> None:
    fake, chosen = await _logged_in(tmp_path)
    session = await _stored(chosen)
    fake.expire(session)
    with pytest.raises(CommandError) as expired:
        await _resume(fake, _target(fake, tmp_path, password=None))
    assert expired.value.status == Exit.FAILED
    assert f"the session of {USER} expired" in expired.value.message
    assert f"gapline login --store {tmp_path} --user {USER}" in expired.value.message

    # Logging in again (with the password) resumes that device.
    again = await _resume(fake, _target(fake, tmp_path))
    assert again.device_id == session.device_id
    assert await _resume(fake, _target(fake, tmp_path, password=None)) == again

    # A revoked token (the device deleted elsewhere) says so, without "softly".
    fake.revoke(again)
    with pytest.raises(CommandError, match="no longer accepts the session") as revoked:
        await _resume(fake, _target(fake, tmp_path, password=None))
    assert "softly" not in revoked.value.message


def test_soft_logout_is_read_from_the_error_body() -> None:
    soft = parse_error(401, b'{"errcode":"M_UNKNOWN_TOKEN","error":"x","soft_logout":true}')
    assert isinstance(soft, UnknownToken) and soft.soft_logout
    assert "the same device resumes" in describe(soft)
    hard = parse_error(401, b'{"errcode":"M_UNKNOWN_TOKEN","error":"x"}')
    assert isinstance(hard, UnknownToken) and not hard.soft_logout
    odd = parse_error(401, b'{"errcode":"M_UNKNOWN_TOKEN","soft_logout":"yes"}')
    assert isinstance(odd, UnknownToken) and not odd.soft_logout  # the errcode survives


async def test_logout_ends_the_token_and_keeps_or_deletes_the_local_data(tmp_path: Path) -> None:
    fake, chosen = await _logged_in(tmp_path)
    session = await _stored(chosen)

    assert await logout(chosen.account, "pp", local=False, connect=_connect(fake)) == Exit.OK
    async with fake.client(session) as client:
        with pytest.raises(UnknownToken):
            await client.whoami()
    assert read_record(chosen.account.directory) == DeviceRecord(
        USER, session.device_id, fake.base_url, logged_out=True
    )
    assert await _stored(chosen) is None
    # The kept data is a logged-out device's: never logged in again.
    with pytest.raises(CommandError, match="was logged out; its messages and keys") as refused:
        await _resume(fake, _target(fake, tmp_path))
    assert refused.value.status == Exit.STORE
    with pytest.raises(CommandError, match="nothing to log out"):
        await logout(chosen.account, "pp", local=False, connect=_connect(fake))

    assert await logout(chosen.account, "pp", local=True, connect=_connect(fake)) == Exit.OK
    assert not chosen.account.directory.exists()
    # Logged in again from scratch: a new device.
    chosen = _target(fake, tmp_path)
    await login(chosen, "pp", None, connect=_connect(fake))
    fresh = await _stored(chosen)
    assert fresh is not None and fresh.device_id != session.device_id


async def test_an_unreachable_homeserver_changes_nothing_at_logout(tmp_path: Path) -> None:
    fake, chosen = await _logged_in(tmp_path)
    fake.fail("logout", status=503, times=None)
    with pytest.raises(CommandError, match="still logged in, nothing changed"):
        await logout(chosen.account, "pp", local=True, connect=_connect(fake))
    assert await _stored(chosen) is not None
    assert chosen.account.directory.is_dir()
