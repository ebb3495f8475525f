"""`gapline relay serve` as a process: SIGTERM shuts down gracefully (answered sends are
durable, exit code 0), and the relay key and timeline heads survive a restart."""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path

import aiohttp
import httpx
import pytest

from gapline.meshline.testing import TEST_CONTEXT, make_account, make_send_params
from gapline.relay.devserver import RelayProcess, RelayStartError
from tests.relay.harness import Clock, RelayUnderTest

ARGS = ["--network-context", str(TEST_CONTEXT), "--rate", "1000000", "--burst", "1000000"]


async def test_sigterm_finishes_in_flight_sends_and_restart_keeps_everything(
    tmp_path: Path,
) -> None:
    dsn = str(tmp_path / "relay.db")
    alice, bob = make_account(), make_account()
    bodies = [
        json.dumps(make_send_params(alice, bob, sender_boxes=False).to_wire()).encode()
        for _ in range(300)
    ]
    ids = [json.loads(b)["envelope"]["message_id"] for b in bodies]
    proc = RelayProcess.start(dsn, extra_args=ARGS)
    answered: list[str] = []
    try:
        async with httpx.AsyncClient(timeout=30) as http:
            r = RelayUnderTest(proc.url, proc.ws_url, proc.relay_id, Clock(), http)
            await r.publish(alice)
            await r.publish(bob)
            token = await r.login(alice)
        first_answer = asyncio.Event()
        async with aiohttp.ClientSession() as session:

            async def send(i: int) -> None:
                try:
                    async with session.post(
                        proc.url + "/message/send",
                        data=bodies[i],
                        headers={"Content-Type": "application/json", "X-Meshline-Session": token},
                    ) as resp:
                        body = await resp.json()
                        assert resp.status < 500 or body["code"] == "temporarily_unavailable", body
                        if resp.status == 200:
                            answered.append(ids[i])
                            first_answer.set()
                except aiohttp.ClientError:
                    pass  # refused or cut once the listener closed: not answered, not promised

            async with asyncio.TaskGroup() as tg:
                for i in range(len(bodies)):
                    tg.create_task(send(i))
                await first_answer.wait()
                code = await asyncio.to_thread(proc.stop)
        assert code == 0, proc.log_tail()
        assert answered
    finally:
        proc.stop()
    with RelayProcess.start(dsn, extra_args=ARGS) as again:
        assert again.relay_id == proc.relay_id  # the key generated on first start was kept
        async with httpx.AsyncClient(timeout=30) as http:
            r = RelayUnderTest(again.url, again.ws_url, again.relay_id, Clock(), http)
            token = await r.login(bob)
            items: list[dict] = []
            after = -1
            while True:  # every page: the relay caps a page at 200 records
                page = await r.ok("message.timeline.sync", {"after": after}, token=token)
                items += page["items"]
                if not page["has_more"]:
                    break
                after = items[-1]["sequence"]
            stored = [item["envelope"]["message_id"] for item in items]
            assert set(answered) <= set(stored)  # every answered send is durable
            assert set(stored) <= set(ids)
            seqs = [item["sequence"] for item in items]
            assert seqs == sorted(set(seqs))


def test_a_relay_leaves_no_log_file_however_it_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(logs))
    proc = RelayProcess.start(str(tmp_path / "relay.db"), extra_args=ARGS)
    assert "relay listening" in proc.log_text()  # read while it runs
    assert proc.stop() == 0
    assert "shut" in proc.log_tail().lower()  # what the relay said last, kept from the stop
    assert proc.log_text().endswith(proc.log_tail() + "\n")
    assert proc.stop() == 0  # a second stop changes nothing
    killed = RelayProcess.start(str(tmp_path / "relay.db"), extra_args=ARGS)
    killed.proc.kill()  # as the crash tests do: stop() is never called
    assert killed.proc.wait() == -9
    with pytest.raises(RelayStartError, match="relay did not start"):
        RelayProcess.start(str(tmp_path), extra_args=ARGS)  # a directory: no database
    assert list(logs.iterdir()) == []
