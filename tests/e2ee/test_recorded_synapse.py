"""Real Synapse answers (recorded by data/record_synapse_keys.py) through the sans-I/O machine.

The devices in them are a matrix-nio device and a gapline device; their objects
carry what Synapse adds (``unsigned``), so the signature checks meet real input.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import msgspec

from gapline.e2ee import CryptoMachine, RefusalCode, RequestKind, ShareState, TrustLevel

DATA = json.loads((Path(__file__).parent / "data" / "synapse_keys.json").read_text())
ROOM = "!recorded:localhost"


def _reader() -> CryptoMachine:
    machine = CryptoMachine.create(os.urandom(32), "@reader:localhost", "READER")
    machine.update_tracked_users(DATA["query_users"])
    return machine


def _answer(machine: CryptoMachine, kind: RequestKind, body: dict[str, Any]) -> Any:
    machine.take_changes()
    (request,) = [r for r in machine.outgoing_requests() if r.kind is kind]
    parsed = msgspec.json.decode(json.dumps(body), type=request.response_type)
    return machine.mark_request_as_sent(request.request_id, parsed)


def _query(machine: CryptoMachine, body: dict[str, Any]) -> Any:
    body = copy.deepcopy(body)
    body["device_keys"].setdefault("@reader:localhost", {})
    return _answer(machine, RequestKind.KEYS_QUERY, body)


def test_a_recorded_query_answer_is_accepted_with_its_signatures() -> None:
    machine = _reader()
    updates = _query(machine, DATA["keys_query"])
    assert updates.refusals == ()
    for user, device_id in DATA["devices"].items():
        device = machine.device(user, device_id)
        assert device is not None and device.trust is TrustLevel.UNSIGNED
        listed = DATA["keys_query"]["device_keys"][user][device_id]["keys"]
        assert device.ed25519 == listed[f"ed25519:{device_id}"]


def test_a_recorded_answer_with_one_flipped_signature_byte_refuses_that_device_only() -> None:
    machine = _reader()
    body = copy.deepcopy(DATA["keys_query"])
    nio_user = "@niouser:localhost"
    nio_device = DATA["devices"][nio_user]
    signatures = body["device_keys"][nio_user][nio_device]["signatures"][nio_user]
    key_id, signature = next(iter(signatures.items()))
    signatures[key_id] = ("A" if signature[0] != "A" else "B") + signature[1:]
    updates = _query(machine, body)
    assert [(r.code, r.sender) for r in updates.refusals] == [(RefusalCode.BAD_SIGNATURE, nio_user)]
    assert machine.device(nio_user, nio_device) is None
    assert machine.device("@gapuser:localhost", DATA["devices"]["@gapuser:localhost"]) is not None


def test_a_recorded_claim_answer_opens_olm_sessions_and_the_share_reaches_both() -> None:
    machine = _reader()
    _query(machine, DATA["keys_query"])
    machine.set_room_encryption(ROOM, {"algorithm": "m.megolm.v1.aes-sha2"})
    members = [*DATA["query_users"], "@reader:localhost"]
    assert machine.share_room_key(ROOM, members).state is ShareState.NEEDS_KEYS_CLAIM
    _answer(machine, RequestKind.KEYS_CLAIM, DATA["keys_claim"])
    report = machine.share_room_key(ROOM, members)
    assert report.state is ShareState.READY and report.withheld == ()
    assert sorted(report.shared_with) == sorted(DATA["devices"].items())
    machine.take_changes()
    (to_device,) = [r for r in machine.outgoing_requests() if r.kind is RequestKind.TO_DEVICE]
    assert set(to_device.request.json["messages"]) == set(DATA["devices"])
