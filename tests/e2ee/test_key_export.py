"""Key files in Element's format: round trips, matrix-nio's own writer and reader, bad files."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from nio.crypto import key_export as nio_export

from gapline.e2ee import (
    DecryptedEvent,
    KeyExportError,
    KeyExportProblem,
    UnableToDecrypt,
    UtdReason,
    decrypt_key_file,
    encrypt_key_file,
    export_room_keys,
    import_room_keys,
)
from gapline.matrix import ClientEvent

from .harness import Clock, Peer, Room, connected, online
from .keyserver import KeyServer

ROUNDS = 1000  # fast enough for tests; the format carries the count


def _scene() -> tuple[Peer, Peer, Peer, Room, list[ClientEvent]]:
    server, clock = KeyServer(), Clock()
    alice, bob = online(server, clock, ("@alice:x", "A1"), ("@bob:x", "B1"))
    room = connected([alice, bob])
    events = [alice.send(room, f"secret {i}") for i in range(3)]
    bob.sync()
    assert [bob.body(room, e) for e in events] == ["secret 0", "secret 1", "secret 2"]
    carol = Peer(server, "@bob:x", "B2", clock)  # bob's new device, with no keys
    return alice, bob, carol, room, events


def test_export_then_import_on_another_device_decrypts_the_history() -> None:
    _alice, bob, carol, room, events = _scene()
    text = export_room_keys(bob.machine, "correct horse", rounds=ROUNDS)
    assert text.startswith("-----BEGIN MEGOLM SESSION DATA-----\n")
    assert text.rstrip().endswith("-----END MEGOLM SESSION DATA-----")
    assert all(len(line) <= 96 for line in text.splitlines())
    before = carol.read(room, events[0])
    assert isinstance(before, UnableToDecrypt) and before.reason is UtdReason.MISSING_ROOM_KEY
    report = import_room_keys(carol.machine, text, "correct horse")
    exported = set(bob.machine.inbound.identifiers())  # this room's and the setup room's
    assert {(k.room_id, k.session_id) for k in report.imported} == exported
    assert (room.room_id, events[0].content["session_id"]) in exported
    changes = carol.commit()
    assert len(changes.inbound_sessions) == len(exported)
    results = [carol.read(room, e) for e in events]
    results = [r for r in results if isinstance(r, DecryptedEvent)]
    assert len(results) == len(events)
    assert [r.content["body"] for r in results] == ["secret 0", "secret 1", "secret 2"]
    assert all(r.forwarded for r in results)
    again = import_room_keys(carol.machine, text, "correct horse")
    assert again.imported == () and again.already_known == len(exported)


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        ("passphrase", KeyExportProblem.BAD_MAC),
        ("flip", KeyExportProblem.BAD_MAC),
        ("truncate", KeyExportProblem.TRUNCATED),
        ("cut_lines", KeyExportProblem.BAD_MAC),
        ("no_footer", KeyExportProblem.TRUNCATED),
        ("garbage", KeyExportProblem.NOT_AN_EXPORT),
    ],
)
def test_a_bad_file_is_refused_and_nothing_is_stored(
    damage: str, problem: KeyExportProblem
) -> None:
    _alice, bob, carol, room, events = _scene()
    text = export_room_keys(bob.machine, "pw", rounds=ROUNDS)
    lines = text.strip().splitlines()
    passphrase = "pw"
    if damage == "passphrase":
        passphrase = "Pw"
    elif damage == "flip":
        body = bytearray(base64.b64decode("".join(lines[1:-1])))
        body[60] ^= 0x01
        text = "\n".join([lines[0], base64.b64encode(bytes(body)).decode(), lines[-1]])
    elif damage == "truncate":
        text = "\n".join([lines[0], lines[1][:40], lines[-1]])
    elif damage == "cut_lines":
        text = "\n".join([lines[0], *lines[1:-2], lines[-1]])
    elif damage == "no_footer":
        text = "\n".join(lines[:-1])
    else:
        text = "hello"
    with pytest.raises(KeyExportError) as caught:
        import_room_keys(carol.machine, text, passphrase)
    assert caught.value.problem is problem
    assert carol.commit().inbound_sessions == ()
    assert isinstance(carol.read(room, events[0]), UnableToDecrypt)


def test_an_entry_of_an_unknown_algorithm_is_skipped_the_rest_imported() -> None:
    _alice, bob, carol, _room, _events = _scene()
    entry = json.loads(decrypt_key_file(export_room_keys(bob.machine, "pw", rounds=ROUNDS), "pw"))[
        0
    ]
    odd = {**entry, "algorithm": "m.megolm.v2", "session_id": "other"}
    text = encrypt_key_file(json.dumps([odd, entry]).encode(), "pw", rounds=ROUNDS)
    report = import_room_keys(carol.machine, text, "pw")
    assert len(report.imported) == 1 and len(report.skipped) == 1
    assert "m.megolm.v2" in report.skipped[0]


def test_an_entry_whose_key_opens_another_session_is_refused() -> None:
    _alice, bob, carol, _room, _events = _scene()
    entry = json.loads(decrypt_key_file(export_room_keys(bob.machine, "pw", rounds=ROUNDS), "pw"))[
        0
    ]
    text = encrypt_key_file(
        json.dumps([{**entry, "session_id": "not-this-one"}]).encode(), "pw", rounds=ROUNDS
    )
    report = import_room_keys(carol.machine, text, "pw")
    assert report.imported == () and report.refusals[0].code.value == "session_mismatch"
    assert carol.commit().inbound_sessions == ()


def test_nio_reads_what_gapline_writes_and_gapline_reads_what_nio_writes(tmp_path: Path) -> None:
    """The file format against matrix-nio's own implementation (pycryptodome, not ours).

    An ASCII passphrase: nio hands a ``str`` to pycryptodome's PBKDF2, which encodes it
    as Latin-1, where the format (and Element) use UTF-8."""
    data = json.dumps([{"hello": "wörld"}]).encode()
    ours = tmp_path / "ours.txt"
    ours.write_text(encrypt_key_file(data, "passphrase", rounds=ROUNDS))
    assert nio_export.decrypt_and_read(str(ours), "passphrase") == data
    theirs = tmp_path / "theirs.txt"
    nio_export.encrypt_and_save(data, str(theirs), "passphrase", count=ROUNDS)
    assert decrypt_key_file(theirs.read_text(), "passphrase") == data
    with pytest.raises(ValueError):
        nio_export.decrypt_and_read(str(ours), "wrong")
    with pytest.raises(KeyExportError):
        decrypt_key_file(theirs.read_text(), "wrong")
