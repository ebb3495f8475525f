"""What gapline's end-to-end encryption adds to vodozemac's own cost, measured in one run.

Figures (each beside the floor it is compared with):

- ``megolm_bare``: vodozemac alone decrypting N Megolm events (parse the base64
  message, decrypt and verify its signature), events/s: the crypto floor.
- ``megolm_machine``: `CryptoMachine.decrypt_room_events` on the same events
  (lookup, decrypt, replay index, JSON, checks), events/s and the ratio to the floor.
- ``share_100_devices``: sharing a new room session with 100 devices that have no
  Olm session yet: the claim answer turned into 100 Olm sessions, 100 encrypted
  room keys, the changes taken (pickled) and the sendToDevice request built; ms
  (target under 200 ms).
- ``heal``: 10,000 events of one session retained as undecryptable, then the key
  arrives: decrypting all of them, against the bare decrypt calls (target ≤ 1.5x),
  and the event loop's longest stall when done in one call, in batches with a
  yield between (what `CryptoDriver.decrypt_room_events` does), and in batches on
  a worker thread; plus the SQLite commit of the healing step's changes.

- ``restore``: restoring a server-side key backup of 10,000 sessions: decrypting
  parsing the ``GET /room_keys/keys`` answer, decrypting each entry with the backup
  key and importing it (`KeyBackup.restore`), taking the
  changes (pickling every session) and the SQLite commit; s in all and ms per
  session (target under 1 ms each), beside the bare vodozemac floor (decrypt the
  entry and import the session key, nothing else).

- ``recovered_fill``: a 200-event encrypted gap filled on a device that recovered
  (each page fetches its sessions from the key backup before it commits) against
  the same fill on the device that received the keys, in the same run: the
  ratio of the fill times (target <= 1.5x), and the same pages/events on both
  (``bench/e2ee_fill.py``).

The events are made by a bare vodozemac device, and every machine input (device
keys, the Olm-encrypted room key) goes through the public API. A recipient of the
100-device share decrypts its room key as a cross-check before any figure is printed.

    python bench/e2ee.py [--quick]

Prints one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import datetime
import json
import logging
import os
import platform
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

import vodozemac

from gapline.e2ee import (
    BACKUP_SECRET,
    E2EE_MIGRATIONS,
    E2EE_SCHEMA,
    OLM,
    BackupKey,
    Changes,
    CryptoMachine,
    DecryptedEvent,
    RequestKind,
    ShareState,
    UnableToDecrypt,
    save_changes,
    signing_bytes,
)
from gapline.e2ee._backup_crypto import BACKUP_ALGORITHM, seal_session
from gapline.matrix import (
    BackupVersionResponse,
    ClientEvent,
    KeysClaimResponse,
    KeysQueryResponse,
    RoomKeysResponse,
    ToDeviceEvent,
    parse,
)
from gapline.storage import open_backend

ROOM = "!bench:example.org"


class RawDevice:
    """A device made of a bare vodozemac Account: signed device keys and one-time keys."""

    def __init__(self, user_id: str, device_id: str) -> None:
        self.user_id, self.device_id = user_id, device_id
        self.account = vodozemac.Account()
        self.curve = self.account.curve25519_key.to_base64()
        self.ed = self.account.ed25519_key.to_base64()

    def sign(self, obj: dict[str, Any]) -> dict[str, Any]:
        signature = self.account.sign(signing_bytes(obj)).to_base64()
        return {**obj, "signatures": {self.user_id: {f"ed25519:{self.device_id}": signature}}}

    def device_keys(self) -> dict[str, Any]:
        return self.sign(
            {
                "user_id": self.user_id,
                "device_id": self.device_id,
                "algorithms": [OLM, "m.megolm.v1.aes-sha2"],
                "keys": {
                    f"curve25519:{self.device_id}": self.curve,
                    f"ed25519:{self.device_id}": self.ed,
                },
            }
        )

    def one_time_key(self) -> dict[str, dict[str, Any]]:
        self.account.generate_one_time_keys(1)
        key_id, key = next(iter(self.account.one_time_keys.items()))
        self.account.mark_keys_as_published()
        return {f"signed_curve25519:{key_id}": self.sign({"key": key.to_base64()})}


def answer(machine: CryptoMachine, kind: RequestKind, response: object) -> None:
    machine.take_changes()
    (request,) = [r for r in machine.outgoing_requests() if r.kind is kind]
    machine.mark_request_as_sent(request.request_id, response)


def receiver(sender: RawDevice) -> CryptoMachine:
    """A machine that has accepted ``sender``'s device keys (and no room key yet)."""
    machine = CryptoMachine.create(os.urandom(32), "@bob:example.org", "BOB")
    machine.update_tracked_users([sender.user_id])
    listed = {sender.user_id: {sender.device_id: sender.device_keys()}, machine.user_id: {}}
    answer(machine, RequestKind.KEYS_QUERY, KeysQueryResponse(device_keys=listed))
    machine.take_changes()
    return machine


def room_key_event(sender: RawDevice, machine: CryptoMachine, session_key: str) -> ToDeviceEvent:
    """``sender``'s ``m.room_key`` for ``session_key``, Olm-encrypted to ``machine``."""
    otk = next(iter((machine.account.upload_body() or {})["one_time_keys"].values()))["key"]
    curve = machine.identity_keys["curve25519"]
    olm = sender.account.create_outbound_session(
        vodozemac.Curve25519PublicKey.from_base64(curve),
        vodozemac.Curve25519PublicKey.from_base64(otk),
    )
    session_id = vodozemac.InboundGroupSession(vodozemac.SessionKey(session_key)).session_id
    payload = {
        "type": "m.room_key",
        "sender": sender.user_id,
        "sender_device": sender.device_id,
        "keys": {"ed25519": sender.ed},
        "recipient": machine.user_id,
        "recipient_keys": {"ed25519": machine.identity_keys["ed25519"]},
        "content": {
            "algorithm": "m.megolm.v1.aes-sha2",
            "room_id": ROOM,
            "session_id": session_id,
            "session_key": session_key,
        },
    }
    message_type, ciphertext = olm.encrypt(json.dumps(payload).encode()).to_parts()
    body = base64.b64encode(ciphertext).decode().rstrip("=")
    content = {
        "algorithm": OLM,
        "sender_key": sender.curve,
        "ciphertext": {curve: {"type": message_type, "body": body}},
    }
    return ToDeviceEvent(sender=sender.user_id, type="m.room.encrypted", content=content)


def keyed(machine: CryptoMachine, sender: RawDevice, session_key: str) -> CryptoMachine:
    updates = machine.receive_sync_changes(to_device=[room_key_event(sender, machine, session_key)])
    assert updates.room_keys, updates.refusals
    machine.take_changes()
    return machine


def make_events(sender: RawDevice, count: int) -> tuple[str, list[ClientEvent]]:
    """``count`` Megolm events of one new session, and the session key at index 0."""
    session = vodozemac.GroupSession()
    key = session.session_key.to_base64()
    events = []
    for i in range(count):
        plaintext = {
            "type": "m.room.message",
            "room_id": ROOM,
            "content": {"msgtype": "m.text", "body": f"message {i} " + "lorem ipsum " * 6},
        }
        ciphertext = session.encrypt(json.dumps(plaintext).encode()).to_base64()
        content = {
            "algorithm": "m.megolm.v1.aes-sha2",
            "ciphertext": ciphertext,
            "session_id": session.session_id,
            "sender_key": sender.curve,
            "device_id": sender.device_id,
        }
        events.append(
            ClientEvent(
                event_id=f"$e{i}",
                type="m.room.encrypted",
                sender=sender.user_id,
                origin_server_ts=i,
                content=content,
            )
        )
    return key, events


def bare_decrypt(key: str, events: list[ClientEvent]) -> None:
    inbound = vodozemac.InboundGroupSession(vodozemac.SessionKey(key))
    for e in events:
        inbound.decrypt(vodozemac.MegolmMessage.from_base64(e.content["ciphertext"]))


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench_megolm(count: int, rounds: int) -> dict[str, Any]:
    """Bare and machine decryption of the same events, alternating; the best round of each."""
    sender = RawDevice("@alice:example.org", "ALICE")
    key, events = make_events(sender, count)
    bare, machine_s = float("inf"), float("inf")
    for _ in range(rounds):
        bare = min(bare, timed(lambda: bare_decrypt(key, events)))
        machine = keyed(receiver(sender), sender, key)
        start = time.perf_counter()
        results = machine.decrypt_room_events(ROOM, events)
        machine_s = min(machine_s, time.perf_counter() - start)
        assert all(isinstance(r, DecryptedEvent) for r in results)
    return {
        "events": count,
        "bare_events_per_s": round(count / bare),
        "machine_events_per_s": round(count / machine_s),
        "ratio": round(machine_s / bare, 3),
        "bare_us_per_event": round(bare / count * 1e6, 1),
        "machine_us_per_event": round(machine_s / count * 1e6, 1),
    }


def bench_share(devices: int, rounds: int) -> dict[str, Any]:
    best: tuple[float, tuple[float, float, float]] | None = None
    for _ in range(rounds):
        peers = [RawDevice(f"@u{i}:example.org", f"D{i}") for i in range(devices)]
        alice = CryptoMachine.create(os.urandom(32), "@alice:example.org", "ALICE")
        alice.set_room_encryption(ROOM, {"algorithm": "m.megolm.v1.aes-sha2"})
        users = [p.user_id for p in peers]
        assert alice.share_room_key(ROOM, users).state is ShareState.NEEDS_KEYS_QUERY
        listed = {p.user_id: {p.device_id: p.device_keys()} for p in peers}
        listed[alice.user_id] = {}
        answer(alice, RequestKind.KEYS_QUERY, KeysQueryResponse(device_keys=listed))
        claimed = {p.user_id: {p.device_id: p.one_time_key()} for p in peers}
        start = time.perf_counter()
        assert alice.share_room_key(ROOM, users).state is ShareState.NEEDS_KEYS_CLAIM
        answer(alice, RequestKind.KEYS_CLAIM, KeysClaimResponse(one_time_keys=claimed))
        after_claim = time.perf_counter()
        report = alice.share_room_key(ROOM, users)
        after_encrypt = time.perf_counter()
        changes = alice.take_changes()
        (to_device,) = [r for r in alice.outgoing_requests() if r.kind is RequestKind.TO_DEVICE]
        end = time.perf_counter()
        assert report.state is ShareState.READY and len(report.shared_with) == devices
        assert len(changes.olm_sessions) == devices
        # Cross-check: the first recipient opens its room key.
        first = peers[0]
        message = to_device.request.json["messages"][first.user_id][first.device_id]["ciphertext"][
            first.curve
        ]
        _s, plaintext = first.account.create_inbound_session(
            vodozemac.Curve25519PublicKey.from_base64(alice.identity_keys["curve25519"]),
            vodozemac.PreKeyMessage.from_base64(message["body"]),
        )
        assert json.loads(plaintext)["content"]["session_id"] == report.session_id
        total = end - start
        if best is None or total < best[0]:
            best = (total, (after_claim - start, after_encrypt - after_claim, end - after_encrypt))
    assert best is not None
    claim_ms, encrypt_ms, take_ms = (round(x * 1000, 2) for x in best[1])
    return {
        "devices": devices,
        "ms": round(best[0] * 1000, 2),
        "target_ms": 200,
        "olm_sessions_from_claim_ms": claim_ms,
        "encrypt_room_keys_ms": encrypt_ms,
        "take_changes_and_request_ms": take_ms,
    }


async def _stall_during(work: Callable[[], Awaitable[None]]) -> tuple[float, float]:
    """Run ``work`` while a ticker task measures the event loop's longest stall."""
    stall = 0.0
    done = asyncio.Event()
    started = asyncio.Event()

    async def ticker() -> None:
        nonlocal stall
        last = time.perf_counter()
        started.set()
        while not done.is_set():
            await asyncio.sleep(0)
            now = time.perf_counter()
            stall = max(stall, now - last)
            last = now

    async with asyncio.TaskGroup() as group:
        group.create_task(ticker())
        await started.wait()
        start = time.perf_counter()
        await work()
        elapsed = time.perf_counter() - start
        done.set()
    return elapsed, stall


async def bench_heal(count: int, rounds: int, batch: int) -> dict[str, Any]:
    """Retained events healing when their key arrives, three ways, against bare decryption."""
    sender = RawDevice("@alice:example.org", "ALICE")
    key, events = make_events(sender, count)

    def one_call(m: CryptoMachine) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            m.decrypt_room_events(ROOM, events)

        return run

    def batched(m: CryptoMachine) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            for i in range(0, len(events), batch):
                m.decrypt_room_events(ROOM, events[i : i + batch])
                await asyncio.sleep(0)

        return run

    def threaded(m: CryptoMachine) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            for i in range(0, len(events), 256):
                await asyncio.to_thread(m.decrypt_room_events, ROOM, events[i : i + 256])

        return run

    ways = {
        "one_call": one_call,
        f"batches_of_{batch}_yielding": batched,
        "thread_batches_of_256": threaded,
    }
    best = {name: (float("inf"), float("inf")) for name in ways}
    bare = float("inf")
    commit_ms: float | None = None
    for _ in range(rounds):
        bare = min(bare, timed(lambda: bare_decrypt(key, events)))
        for name, way in ways.items():
            machine = receiver(sender)
            utds = machine.decrypt_room_events(ROOM, events[:50])
            assert all(isinstance(u, UnableToDecrypt) for u in utds)
            keyed(machine, sender, key)
            elapsed, stall = await _stall_during(way(machine))
            best[name] = (min(best[name][0], elapsed), min(best[name][1], stall))
            changes = machine.take_changes()
            assert len(changes.seen) == count
            if commit_ms is None:
                commit_ms = await _commit_ms(changes)
    variants = {
        name: {
            "ms": round(e * 1000, 1),
            "ratio_to_bare": round(e / bare, 3),
            "longest_loop_stall_ms": round(s * 1000, 2),
        }
        for name, (e, s) in best.items()
    }
    return {
        "events": count,
        "bare_ms": round(bare * 1000, 1),
        "target_ratio": 1.5,
        "variants": variants,
        "sqlite_commit_of_the_changes_ms": commit_ms,
    }


async def _commit_ms(changes: Changes) -> float:
    with tempfile.TemporaryDirectory() as directory:
        backend = await open_backend(os.path.join(directory, "bench.db"))
        try:
            await backend.migrate(E2EE_SCHEMA, E2EE_MIGRATIONS)
            start = time.perf_counter()
            await backend.write(lambda tx: save_changes(tx, changes))
            return round((time.perf_counter() - start) * 1000, 1)
        finally:
            await backend.close()


def backup_page(count: int, key: BackupKey) -> tuple[bytes, list[dict[str, str]]]:
    """A ``GET /room_keys/keys`` answer body of ``count`` sessions in 100 rooms, sealed to
    ``key``."""
    sender = RawDevice("@alice:example.org", "ALICE")
    encryption = key.encryption()
    rooms: dict[str, dict[str, Any]] = {}
    sealed = []
    for i in range(count):
        session = vodozemac.InboundGroupSession(vodozemac.GroupSession().session_key)
        exported = session.export_at(0)
        assert exported is not None
        data = seal_session(
            encryption,
            {
                "algorithm": "m.megolm.v1.aes-sha2",
                "sender_key": sender.curve,
                "sender_claimed_keys": {"ed25519": sender.ed},
                "forwarding_curve25519_key_chain": [],
                "session_key": exported.to_base64(),
            },
        )
        sealed.append(data)
        rooms.setdefault(f"!room{i % 100}:example.org", {})[session.session_id] = {
            "first_message_index": 0,
            "forwarded_count": 0,
            "is_verified": False,
            "session_data": data,
        }
    body = {"rooms": {r: {"sessions": s} for r, s in rooms.items()}}
    return json.dumps(body).encode(), sealed


async def bench_restore(count: int, rounds: int) -> dict[str, Any]:
    """Restoring a backup of ``count`` sessions, against the bare decrypt-and-import floor."""
    key = BackupKey.generate()
    body, sealed = backup_page(count, key)
    decryption = vodozemac.PkDecryption.from_key(
        vodozemac.Curve25519SecretKey.from_bytes(base64.b64decode(key.secret + "="))
    )

    def bare() -> None:
        for data in sealed:
            message = vodozemac.Message.from_base64(
                data["ciphertext"], data["mac"], data["ephemeral"]
            )
            session = json.loads(decryption.decrypt(message))
            vodozemac.InboundGroupSession.import_session(
                vodozemac.ExportedSessionKey(session["session_key"])
            )

    version = BackupVersionResponse(
        algorithm=BACKUP_ALGORITHM, auth_data={"public_key": key.public_key}, version="1"
    )
    best: tuple[float, float, float] | None = None
    bare_s = float("inf")
    for _ in range(rounds):
        bare_s = min(bare_s, timed(bare))
        machine = CryptoMachine.create(os.urandom(32), "@bob:example.org", "BOB")
        machine.vault.put(BACKUP_SECRET, key.secret)
        assert machine.backup.use_version(version).trusted
        machine.take_changes()
        start = time.perf_counter()
        page = parse(body, RoomKeysResponse)
        report = machine.backup.restore("1", page)
        restored = time.perf_counter()
        changes = machine.take_changes()
        taken = time.perf_counter()
        assert len(report.imported) == count and not report.refusals
        assert len(changes.inbound_sessions) == count and len(changes.backed_up) == count
        commit_ms = await _commit_ms(changes)
        times = (restored - start, taken - restored, commit_ms / 1000)
        if best is None or sum(times) < sum(best):
            best = times
    assert best is not None
    total = sum(best)
    return {
        "sessions": count,
        "s": round(total, 3),
        "ms_per_session": round(total / count * 1000, 4),
        "target_ms_per_session": 1.0,
        "parse_decrypt_and_import_s": round(best[0], 3),
        "take_changes_s": round(best[1], 3),
        "sqlite_commit_s": round(best[2], 3),
        "bare_decrypt_and_import_s": round(bare_s, 3),
        "ratio_of_parse_decrypt_and_import_to_bare": round(best[0] / bare_s, 3),
        "answer_bytes": len(body),
    }


def main() -> None:
    from e2ee_fill import bench_recovered_fill  # it builds on this module

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # the machines' own refusals are not expected here
    n, devices, heal, rounds = (300, 20, 1000, 1) if args.quick else (1000, 100, 10_000, 5)
    sessions = 500 if args.quick else 10_000
    print(f"megolm x{n}, share x{devices}, heal x{heal}, restore x{sessions}", file=sys.stderr)
    result = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "load_average": os.getloadavg()[0],
        },
        "quick": args.quick,
        "megolm": bench_megolm(n, rounds * 2),
        "share": bench_share(devices, rounds),
        "heal": asyncio.run(bench_heal(heal, max(1, rounds - 2), batch=64)),
        "restore": asyncio.run(bench_restore(sessions, max(1, rounds - 2))),
        "recovered_fill": asyncio.run(bench_recovered_fill(200, max(1, rounds))),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
