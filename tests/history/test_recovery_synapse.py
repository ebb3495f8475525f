"""Keys that outlive a device, through the commands, on a real Synapse with matrix-nio.

Device A (`gapline bridge`) reads nio's encrypted messages, `gapline keys
setup-recovery` prints the recovery key, and A's later sync steps upload the new
keys they store to the backup by themselves. Device B, a new store started with
``--recovery-key-file``, reads the same history through open and gap fill: every
row A could read, with keys it fetches from the backup as it shows them. A wrong
recovery key is refused (status 1) and B's keys are untouched. Key files cross both ways between `gapline keys` and nio.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import httpx
import pytest

from gapline.e2ee import bootstrap_cross_signing, enable_backup, encode_recovery_key
from gapline.history import Engine, EventItem, HistoryGapItem, OpenRoom
from gapline.history._accounts import account_dirname
from gapline.matrix import MatrixClient, Session, crypto_api
from gapline.storage import KdfParams
from tests.e2ee.synapse_peers import NioDevice
from tests.fixtures.synapse import SynapseKit
from tests.history.test_bridge_synapse import READ_TIMEOUT, BridgeProcess, open_and_load

pytestmark = pytest.mark.timeout(300)

STORE_PASSPHRASE = "correct horse"  # BridgeProcess's


def _rows(bridge: BridgeProcess, room: str) -> dict[str, EventItem]:
    return {
        i.event_id: i
        for i in bridge.mirror.items(room) or ()
        if isinstance(i, EventItem) and i.event_id is not None
    }


def _readable(bridge: BridgeProcess, room: str) -> dict[str, str]:
    return {e: r.body for e, r in _rows(bridge, room).items() if r.encrypted and r.body}


async def _sees_device(nio: NioDevice, user_id: str, store: Path) -> None:
    device = json.loads((store / account_dirname(user_id) / "device.json").read_text())["device_id"]
    for _ in range(40):
        await nio.step(timeout_ms=500)
        devices = nio.client.device_store.active_user_devices(user_id)
        if any(d.device_id == device for d in devices):
            return
    raise AssertionError("nio never saw the bridge's device keys")


async def _gapline(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gapline.cli", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), READ_TIMEOUT * 2)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def _fill_every_gap(bridge: BridgeProcess, room: str) -> int:
    """FillGap until no gap is left; how many fills it took."""
    for fills in range(20):
        gaps = [i for i in bridge.mirror.items(room) or () if isinstance(i, HistoryGapItem)]
        if not gaps:
            return fills
        _, answer = await bridge.request(
            {"HistoryRepair": {"FillGap": {"room_id": room, "gap_id": gaps[0].id}}}
        )
        assert answer == "Ok", answer
    raise AssertionError("the gaps never closed")


async def _back_to_the_start(bridge: BridgeProcess, room: str) -> None:
    """Back-paginate until a call publishes nothing (the top of the room is loaded)."""
    for _ in range(40):
        lines, answer = await bridge.request({"PaginateBackwards": {"room_id": room, "count": 20}})
        assert answer == "Ok", answer
        if not any("TimelineChanged" in line.get("event", {}) for line in lines):
            return
    raise AssertionError("back-pagination never reached the top of the room")


def _secret(path: Path, text: str) -> Path:
    path.write_text(text + "\n")
    return path


async def test_a_recovered_device_reads_every_row_the_first_device_read(
    synapse_kit: SynapseKit, tmp_path: Path, peers: tuple[Session, NioDevice, str]
) -> None:
    alice, nio, room = peers
    store_a = tmp_path / "a"
    a = await BridgeProcess.start(synapse_kit, alice.user_id, store_a)
    await open_and_load(a, room)
    await _sees_device(nio, alice.user_id, store_a)
    before = [await nio.send_text(room, f"before recovery {i}") for i in range(6)]
    await a.until(lambda: set(before) <= set(_readable(a, room)))
    await a.shutdown()

    status, out, err = await _gapline(
        "keys", "setup-recovery", "--homeserver", synapse_kit.base_url, "--user",
        alice.user_id, "--password", "password", "--store", str(store_a),
        "--passphrase", STORE_PASSPHRASE,
    )  # fmt: skip
    assert status == 0, err
    recovery_key = out.strip()
    assert len(out.splitlines()) == 1 and recovery_key.startswith("Es"), out
    assert recovery_key not in "".join(
        p.read_bytes().decode(errors="replace") for p in store_a.rglob("*") if p.is_file()
    )

    # A new session after setup: A's own sync step puts its key in the backup.
    a = await BridgeProcess.start(synapse_kit, alice.user_id, store_a)
    await open_and_load(a, room)
    nio.olm.outbound_group_sessions.pop(room, None)
    after = [await nio.send_text(room, f"after recovery {i}") for i in range(6)]
    await a.until(lambda: set(after) <= set(_readable(a, room)))
    await _back_to_the_start(a, room)
    read_by_a = _readable(a, room)
    await a.shutdown()
    assert set(before + after) <= set(read_by_a)

    # A wrong (well-formed) recovery key: one line, status 1, before the sync starts.
    wrong = _secret(tmp_path / "wrong.txt", encode_recovery_key(os.urandom(32)))
    store_c = tmp_path / "c"
    c = await BridgeProcess.start(
        synapse_kit, alice.user_id, store_c, "--recovery-key-file", str(wrong)
    )
    assert await asyncio.wait_for(c.proc.wait(), READ_TIMEOUT) == 1
    assert "wrong recovery key" in await c.stderr()

    store_b = tmp_path / "b"
    right = _secret(tmp_path / "recovery-key.txt", recovery_key)
    b = await BridgeProcess.start(
        synapse_kit, alice.user_id, store_b, "--recovery-key-file", str(right)
    )
    await open_and_load(b, room)
    await _back_to_the_start(b, room)
    # Every row A could read, B reads, the same text: the rows its sync delivered heal as
    # their keys come from the backup (B restored nothing up front).
    await b.until(lambda: _readable(b, room) == read_by_a)
    await b.shutdown()

    # While B is away: a third session, read by A (whose step backs it up); B's restart
    # shows a gap, and filling it decrypts the rows with keys B fetched from the backup.
    a = await BridgeProcess.start(synapse_kit, alice.user_id, store_a)
    await open_and_load(a, room)
    nio.olm.outbound_group_sessions.pop(room, None)
    away = [await nio.send_text(room, f"while B was away {i}") for i in range(12)]
    await a.until(lambda: set(away) <= set(_readable(a, room)))
    await _back_to_the_start(a, room)
    read_by_a = _readable(a, room)
    await a.shutdown()
    b = await BridgeProcess.start(
        synapse_kit, alice.user_id, store_b, "--recovery-key-file", str(right)
    )
    await open_and_load(b, room)
    filled = await _fill_every_gap(b, room)
    assert filled >= 1, "expected a gap for what was sent while B was away"
    await _back_to_the_start(b, room)
    await b.until(lambda: _readable(b, room) == read_by_a)
    assert not [r for r in _rows(b, room).values() if r.decryption is not None]
    await b.shutdown()


async def test_key_files_cross_between_gapline_and_nio_both_ways(
    synapse_kit: SynapseKit, tmp_path: Path, peers: tuple[Session, NioDevice, str]
) -> None:
    alice, nio, room = peers
    store = tmp_path / "a"
    a = await BridgeProcess.start(synapse_kit, alice.user_id, store)
    await open_and_load(a, room)
    await _sees_device(nio, alice.user_id, store)
    first = await nio.send_text(room, "read by gapline, exported")
    await a.until(lambda: first in _readable(a, room))
    # A session gapline never gets: its message stays a UTD row until a file brings it.
    nio.olm.outbound_group_sessions.pop(room, None)
    await nio.hold_back_room_key(room)
    held = await nio.send_text(room, "only in nio's key file")
    await a.until(lambda: (r := _rows(a, room).get(held)) is not None and r.decryption is not None)
    await a.shutdown()

    # gapline -> nio: a new nio device of bob reads the first message with gapline's file.
    passphrase = _secret(tmp_path / "export-passphrase.txt", "file passphrase")
    exported = tmp_path / "gapline-keys.txt"
    status, _, err = await _gapline(
        "keys", "export", "--store", str(store), "--out", str(exported),
        "--passphrase", STORE_PASSPHRASE, "--export-passphrase-file", str(passphrase),
    )  # fmt: skip
    assert status == 0, err
    assert exported.read_text().startswith("-----BEGIN MEGOLM SESSION DATA-----")
    assert exported.stat().st_mode & 0o077 == 0
    other = await NioDevice.login(synapse_kit.base_url, nio.client.user_id, tmp_path / "nio2")
    try:
        await other.client.import_keys(str(exported), "file passphrase")
        await other.wait_until(lambda: first in other.undecryptable or first in other.bodies)
        await other.retry_undecryptable()
        assert other.bodies.get(first) == "read by gapline, exported"
    finally:
        await other.close()

    # nio -> gapline: nio's file carries the held session; the row heals on the next start.
    from_nio = tmp_path / "nio-keys.txt"
    await nio.client.export_keys(str(from_nio), "file passphrase")
    wrong = _secret(tmp_path / "wrong-passphrase.txt", "not the passphrase")
    status, _, err = await _gapline(
        "keys", "import", str(from_nio), "--store", str(store),
        "--passphrase", STORE_PASSPHRASE, "--export-passphrase-file", str(wrong),
    )  # fmt: skip
    assert status == 1 and "cannot import" in err, err
    status, _, err = await _gapline(
        "keys", "import", str(from_nio), "--store", str(store),
        "--passphrase", STORE_PASSPHRASE, "--export-passphrase-file", str(passphrase),
    )  # fmt: skip
    assert status == 0, err
    assert "imported" in err
    a = await BridgeProcess.start(synapse_kit, alice.user_id, store)
    await open_and_load(a, room)
    await a.until(lambda: _readable(a, room).get(held) == "only in nio's key file")
    await a.shutdown()


class _RefuseBackupUploads(httpx.AsyncBaseTransport):
    """Synapse, except that uploads of backed-up keys fail while ``refusing`` is set."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.refusing = True
        self.refused = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self.refusing and request.method == "PUT" and "/room_keys/keys" in request.url.path:
            self.refused += 1
            body = {"errcode": "M_UNKNOWN", "error": "injected"}
            return httpx.Response(400, json=body, request=request)
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_a_failed_backup_upload_never_fails_the_sync_and_resumes_next_step(
    synapse_kit: SynapseKit,
    tmp_path: Path,
    peers: tuple[Session, NioDevice, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    alice, nio, room = peers
    transport = _RefuseBackupUploads()
    async with (
        MatrixClient(synapse_kit.base_url, session=alice, transport=transport) as client,
        Engine.open(
            tmp_path / "a", client, passphrase="pw", sync=False, e2ee=True,
            kdf_cost=KdfParams.cheap(),
        ) as engine,
    ):  # fmt: skip
        await engine.sync_once()
        assert engine.crypto is not None and engine.crypto.driver is not None
        driver = engine.crypto.driver
        await bootstrap_cross_signing(driver, password="password")
        trust = await enable_backup(driver)
        assert trust is not None and trust.trusted
        await engine.execute(OpenRoom(room))
        await _sees_device_id(nio, alice.user_id, alice.device_id)
        sent = await nio.send_text(room, "backed up later")
        for _ in range(40):
            await engine.sync_once(timeout_ms=500)  # a refused upload does not raise
            if driver.machine.backup.pending:
                break
        assert transport.refused >= 1 and driver.machine.backup.pending == 1
        assert "key backup upload failed" in caplog.text
        await engine.flush_history(room)
        row = next(
            r
            for r in engine.timeline(room).state.items
            if isinstance(r, EventItem) and r.event_id == sent
        )
        assert row.body == "backed up later"  # the sync step itself committed
        transport.refusing = False
        await engine.sync_once()
        assert driver.machine.backup.pending == 0
        held = await client.request(crypto_api.room_keys_get(driver.machine.backup.version), dict)
        assert list(held["rooms"]) == [room]


async def _sees_device_id(nio: NioDevice, user_id: str, device_id: str) -> None:
    for _ in range(40):
        await nio.step(timeout_ms=500)
        if any(
            d.device_id == device_id for d in nio.client.device_store.active_user_devices(user_id)
        ):
            return
    raise AssertionError("nio never saw the engine's device keys")


async def test_setup_recovery_never_replaces_cross_signing_keys_it_does_not_hold_unasked(
    synapse_kit: SynapseKit, tmp_path: Path
) -> None:
    user = await synapse_kit.user("keys")
    base = ("keys", "setup-recovery", "--homeserver", synapse_kit.base_url, "--user")
    login = (user.user_id, "--password", "password", "--passphrase", STORE_PASSPHRASE)
    first, out, err = await _gapline(*base, *login, "--store", str(tmp_path / "first"))
    assert first == 0, err
    master = await _master_key(synapse_kit, user)

    # A second device that never recovered: stopped, the account's keys untouched.
    second = ("--store", str(tmp_path / "second"))
    status, out, err = await _gapline(*base, *login, *second)
    assert (status, out) == (1, "")
    assert "--reset-cross-signing" in err and "does not hold" in err
    assert await _master_key(synapse_kit, user) == master

    status, out, err = await _gapline(*base, *login, *second, "--reset-cross-signing")
    assert status == 0, err
    assert out.strip().startswith("Es")
    assert await _master_key(synapse_kit, user) != master


async def _master_key(synapse_kit: SynapseKit, user: Session) -> dict:
    async with httpx.AsyncClient(base_url=synapse_kit.base_url) as http:
        answer = await http.post(
            "/_matrix/client/v3/keys/query",
            json={"device_keys": {user.user_id: []}},
            headers={"Authorization": f"Bearer {user.access_token}"},
        )
    answer.raise_for_status()
    return answer.json()["master_keys"][user.user_id]
