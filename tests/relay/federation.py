"""Test support for federated relays: processes sharing one registry file, and homes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from gapline.meshline import AccountKey, AccountRoute, b64u_encode, sign_route
from gapline.meshline.testing import TEST_CONTEXT, TestAccount, make_send_params
from gapline.relay._p2p._peers import FileRegistry, sign_registry_entry
from gapline.relay.devserver import RelayProcess, free_port
from tests.relay.harness import Clock, RelayUnderTest

ARGS = ["--network-context", str(TEST_CONTEXT), "--rate", "1000000", "--burst", "1000000"]


@dataclass
class Member:
    """One relay of the test network: its key, store and (while running) process."""

    name: str
    key: AccountKey
    key_file: Path
    dsn: str
    port: int
    p2p_port: int
    proc: RelayProcess | None = None

    @property
    def running(self) -> RelayProcess:
        assert self.proc is not None, f"relay {self.name} is not running"
        return self.proc

    @property
    def relay_id(self) -> str:
        return self.key.relay_id()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/meshline/v1"

    def client(self, http: httpx.AsyncClient) -> RelayUnderTest:
        assert self.proc is not None
        return RelayUnderTest(self.proc.url, self.proc.ws_url, self.relay_id, Clock(), http)


class Network:
    def __init__(self, tmp_path: Path, dsns: Sequence[str]) -> None:
        self.registry = tmp_path / "registry.json"
        self.members: list[Member] = []
        for i, dsn in enumerate(dsns):
            key = AccountKey.generate()
            key_file = tmp_path / f"relay{i}.key"
            key_file.write_text(b64u_encode(key.private_bytes()))
            self.members.append(
                Member(chr(ord("A") + i), key, key_file, dsn, free_port(), free_port())
            )
        FileRegistry.write(
            self.registry, [sign_registry_entry(m.key, m.url, TEST_CONTEXT) for m in self.members]
        )

    def start(self, member: Member, *extra: str) -> RelayProcess:
        first = self.members[0]
        bootstrap = []
        if member is not first and first.proc is not None:
            bootstrap = ["--bootstrap", first.proc.info["p2p"][0]]
        member.proc = RelayProcess.start(
            member.dsn,
            port=member.port,
            extra_args=[
                *ARGS,
                "--registry-file",
                str(self.registry),
                "--relay-key",
                str(member.key_file),
                "--p2p-listen",
                f"127.0.0.1:{member.p2p_port}",
                *bootstrap,
                *extra,
            ],
        )
        return member.proc

    def stop_all(self) -> None:
        for member in self.members:
            if member.proc is not None and member.proc.proc.poll() is None:
                member.proc.stop()


async def metric(member: Member, name: str, labels: str = "") -> float:
    assert member.proc is not None
    async with httpx.AsyncClient() as http:
        text = (await http.get(member.url.rsplit("/meshline", 1)[0] + "/metrics")).text
    prefix = name + (("{" + labels + "}") if labels else "") + " "
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(prefix))


async def wait_for(predicate: Any, what: str, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if await predicate():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


async def make_home(r: RelayUnderTest, account: TestAccount, revision: int) -> AccountRoute:
    """Publish the account's device state on ``r`` and a route naming ``r`` as its home."""
    await r.publish(account)
    draft = sign_route(
        account.key,
        r.context,
        relay_id=r.relay_id,
        revision=revision,
        updated_at=int(time.time()),
        expires_at=int(time.time()) + 3600,
    )
    token = await r.account_login(account)
    return AccountRoute.from_wire(await r.ok("account.route.publish", draft.to_wire(), token=token))


def send_body(sender: TestAccount, recipient: TestAccount) -> dict[str, Any]:
    return make_send_params(sender, recipient).to_wire()


async def received(r: RelayUnderTest, account: TestAccount) -> list[str]:
    """The message IDs in ``account``'s timeline on ``r``, in order (all pages)."""
    token = await r.login(account)
    out: list[str] = []
    after = -1
    while True:
        page = await r.ok("message.timeline.sync", {"after": after, "limit": 200}, token=token)
        out += [i["envelope"]["message_id"] for i in page["items"]]
        if not page["items"]:
            return out
        after = page["items"][-1]["sequence"]
        if not page["has_more"]:
            return out
