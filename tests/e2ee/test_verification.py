"""Interactive SAS verification, message by message, between two machines and against
matrix-nio's own SAS implementation (no server: the messages are handed across)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from nio.crypto import OlmDevice
from nio.crypto.sas import Sas as NioSas
from nio.events import (
    KeyVerificationAccept,
    KeyVerificationKey,
    KeyVerificationMac,
    KeyVerificationStart,
)

from gapline.e2ee import (
    E2EE_MIGRATIONS,
    E2EE_SCHEMA,
    EMOJI,
    FLOW_TIMEOUT_MS,
    STEP_TIMEOUT_MS,
    CancelCode,
    CryptoMachine,
    DecryptedEvent,
    RefusalCode,
    SharingPolicy,
    TrustLevel,
    UnableToDecrypt,
    UtdReason,
    VerificationEvent,
    VerificationMessage,
    VerificationState,
    open_machine,
    save_changes,
)
from gapline.storage import Tx, open_backend

from .harness import Clock, Peer, connected, online
from .keyserver import KeyServer

S = VerificationState


@pytest.fixture
def clock() -> Clock:
    return Clock()


def _pair(clock: Clock, *ids: tuple[str, str]) -> tuple[Peer, Peer]:
    server = KeyServer()
    a, b = online(server, clock, *ids)
    for peer in (a, b):
        peer.machine.update_tracked_users([a.machine.user_id, b.machine.user_id])
        peer.pump()
    assert a.machine.device(*b.me) is not None and b.machine.device(*a.me) is not None
    return a, b


def _events(src: CryptoMachine, dst: CryptoMachine, *, tamper=None) -> list[VerificationEvent]:
    """What ``src`` sent that is addressed to ``dst``, as ``dst`` receives it."""
    out = []
    for msg in src.verification.take_outgoing():
        if msg.room_id is None and (msg.user_id, msg.device_id) != (dst.user_id, dst.device_id):
            continue
        content = tamper(msg) if tamper else msg.content
        out.append(VerificationEvent(src.user_id, msg.type, content, room_id=msg.room_id,
                                     event_id=f"$e{id(msg)}", origin_server_ts=1))  # fmt: skip
    return out


def _relay(src: Peer, dst: Peer, **kw: Any) -> list[Any]:
    return [dst.machine.verification.receive(e) for e in _events(src.machine, dst.machine, **kw)]


def _trust(viewer: Peer, of: Peer) -> TrustLevel:
    device = viewer.machine.device(*of.me)
    assert device is not None
    return device.trust


def _ready(a: Peer, b: Peer) -> str:
    """A asks B over to-device, B's person agrees: both ready."""
    flow = a.machine.verification.request(b.machine.user_id, (b.machine.device_id,)).flow_id
    _relay(a, b)
    assert b.machine.verification.status(flow).state is S.REQUESTED
    b.machine.verification.accept(flow)
    _relay(b, a)
    return flow


def _to_show_sas(a: Peer, b: Peer) -> str:
    """A requests, B readies, A starts, B accepts, keys cross: both show the short string."""
    va, vb = a.machine.verification, b.machine.verification
    flow = _ready(a, b)
    assert va.status(flow).state is S.READY and vb.status(flow).state is S.READY
    va.start_sas(flow)
    _relay(a, b)  # start: b accepts at once, the person agreed with the request
    assert vb.status(flow).state is S.ACCEPTED
    _relay(b, a)  # accept: a sends its key
    _relay(a, b)  # key: b sends its key and shows the string
    _relay(b, a)
    return flow


def test_two_users_verify_each_other_and_see_the_same_string(clock: Clock) -> None:
    a, b = _pair(clock, ("@alice:x", "A"), ("@bob:x", "B"))
    flow = _to_show_sas(a, b)
    sa, sb = a.machine.verification.status(flow), b.machine.verification.status(flow)
    assert sa.state is S.SHOW_SAS and sb.state is S.SHOW_SAS
    assert sa.short_string == sb.short_string and sa.short_string is not None
    assert len(sa.short_string.emoji) == 7 and all(e in EMOJI for e in sa.short_string.emoji)
    assert all(1000 <= n <= 9191 for n in sa.short_string.decimals)
    assert _trust(a, b) is TrustLevel.UNSIGNED
    a.machine.verification.confirm(flow)
    _relay(a, b)  # a's MAC waits at b until its person confirms
    assert b.machine.verification.status(flow).state is S.SHOW_SAS
    b.machine.verification.confirm(flow)
    _relay(b, a)  # b's MAC and done
    _relay(a, b)  # a's done
    assert a.machine.verification.status(flow).state is S.DONE
    assert b.machine.verification.status(flow).state is S.DONE
    assert a.machine.verification.status(flow).verified_devices == ("B",)
    assert _trust(a, b) is TrustLevel.VERIFIED
    assert _trust(b, a) is TrustLevel.VERIFIED
    # No cross-signing keys are held: nothing to sign, the mark alone says verified.
    assert a.machine.verification.status(flow).signatures is None


async def test_the_mark_is_one_sealed_row_and_survives_a_restart(
    clock: Clock, tmp_path: Path
) -> None:
    a, b = _pair(clock, ("@alice:x", "A"), ("@bob:x", "B"))
    flow = _to_show_sas(a, b)
    for p, q in ((a, b), (b, a)):
        p.machine.verification.confirm(flow)
        _relay(p, q)
    last = a.commit()
    assert [s.name for s in last.secrets] == ["gapline.verified_marks"]
    assert b"bob" not in last.secrets[0].sealed  # sealed like every held secret
    backend = await open_backend(str(tmp_path / "e2ee.db"))
    try:
        await backend.migrate(E2EE_SCHEMA, E2EE_MIGRATIONS)

        def save(tx: Tx) -> None:
            for changes in a.saved:
                save_changes(tx, changes)

        await backend.write(save)
        again = await open_machine(backend, a.store_key, user_id="@alice:x", device_id="A")
        device = again.device("@bob:x", "B")
        assert device is not None and device.trust is TrustLevel.VERIFIED
    finally:
        await backend.close()


def test_mismatch_cancels_on_both_sides(clock: Clock) -> None:
    a, b = _pair(clock, ("@alice:x", "A"), ("@bob:x", "B"))
    flow = _to_show_sas(a, b)
    a.machine.verification.mismatch(flow)
    (status,) = _relay(a, b)
    assert status.state is S.CANCELLED and status.cancel_code == "m.mismatched_sas"
    assert not status.cancelled_by_us
    mine = a.machine.verification.status(flow)
    assert mine.cancel_code == CancelCode.MISMATCHED_SAS and mine.cancelled_by_us
    assert _trust(b, a) is TrustLevel.UNSIGNED


def test_a_key_that_breaks_the_commitment_is_refused(clock: Clock) -> None:
    a, b = _pair(clock, ("@alice:x", "A"), ("@bob:x", "B"))
    va = a.machine.verification
    flow = _ready(a, b)
    va.start_sas(flow)
    _relay(a, b)
    _relay(b, a)
    _relay(a, b)
    other = CryptoMachine.create(b"\x01" * 32, "@eve:x", "E")  # any valid Curve25519 key
    forged = other.identity_keys["curve25519"]

    def swap_key(msg: VerificationMessage) -> dict[str, Any]:
        return {**msg.content, "key": forged} if msg.type.endswith(".key") else msg.content

    (status,) = _relay(b, a, tamper=swap_key)
    assert status.cancel_code == "m.mismatched_commitment"
    (cancel,) = va.take_outgoing()
    assert cancel.type == "m.key.verification.cancel"
    assert cancel.content["code"] == "m.mismatched_commitment"


def test_a_forged_mac_is_refused_with_key_mismatch(clock: Clock) -> None:
    a, b = _pair(clock, ("@alice:x", "A"), ("@bob:x", "B"))
    flow = _to_show_sas(a, b)
    a.machine.verification.confirm(flow)
    b.machine.verification.confirm(flow)

    def flip(msg: VerificationMessage) -> dict[str, Any]:
        if not msg.type.endswith(".mac"):
            return msg.content
        macs = {k: v[::-1] for k, v in msg.content["mac"].items()}
        return {**msg.content, "mac": macs}

    statuses = _relay(b, a, tamper=flip)
    assert statuses[0].state is S.CANCELLED and statuses[0].cancel_code == "m.key_mismatch"
    assert _trust(a, b) is TrustLevel.UNSIGNED
    (status,) = [s for s in _relay(a, b) if s is not None and s.state is S.CANCELLED]
    assert status.cancel_code == "m.key_mismatch"


def test_the_other_side_silent_for_a_minute_times_out(clock: Clock) -> None:
    a, b = _pair(clock, ("@alice:x", "A"), ("@bob:x", "B"))
    va = a.machine.verification
    flow = va.start_sas(user_id="@bob:x", device_id="B").flow_id
    _relay(a, b)  # bob's person has not accepted yet: his side waits on him, not on alice
    clock.advance(STEP_TIMEOUT_MS - 1)
    assert va.expire() == [] and b.machine.verification.expire() == []
    clock.advance(1)
    (expired,) = va.expire()
    assert expired.flow_id == flow and expired.cancel_code == "m.timeout"
    (status,) = _relay(a, b)
    assert status.state is S.CANCELLED and status.cancel_code == "m.timeout"


def test_a_flow_not_done_in_ten_minutes_times_out_even_while_the_person_looks(
    clock: Clock,
) -> None:
    a, b = _pair(clock, ("@alice:x", "A"), ("@bob:x", "B"))
    flow = _to_show_sas(a, b)
    clock.advance(FLOW_TIMEOUT_MS - STEP_TIMEOUT_MS)  # showing the string: no 1-minute rule
    assert a.machine.verification.expire() == []
    clock.advance(STEP_TIMEOUT_MS)
    assert [s.cancel_code for s in a.machine.verification.expire()] == ["m.timeout"]
    assert _relay(a, b)[0].cancel_code == "m.timeout"
    clock.advance(FLOW_TIMEOUT_MS)  # ended flows are kept ten minutes more, then forgotten
    assert [s.flow_id for s in a.machine.verification.flows()] == [flow]
    a.machine.verification.expire()
    assert a.machine.verification.flows() == []


def test_a_stale_request_is_ignored(clock: Clock) -> None:
    a, b = _pair(clock, ("@alice:x", "A"), ("@bob:x", "B"))
    a.machine.verification.request("@bob:x", ("B",))
    clock.advance(FLOW_TIMEOUT_MS + 1)
    assert _relay(a, b) == [None]
    assert b.machine.verification.flows() == []


def test_a_start_from_an_unknown_device_is_refused_and_logged(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    _a, b = _pair(clock, ("@alice:x", "A"), ("@bob:x", "B"))
    start = {"from_device": "GHOST", "method": "m.sas.v1", "transaction_id": "t1",
             "key_agreement_protocols": ["curve25519-hkdf-sha256"], "hashes": ["sha256"],
             "message_authentication_codes": ["hkdf-hmac-sha256.v2"],
             "short_authentication_string": ["emoji"]}  # fmt: skip
    with caplog.at_level(logging.WARNING, "gapline.e2ee.verification"):
        status = b.machine.verification.receive(
            VerificationEvent("@alice:x", "m.key.verification.start", start)
        )
    assert status is not None and status.state is S.CANCELLED
    assert status.cancel_code == "m.unexpected_message" and "unknown device" in caplog.text
    (cancel,) = b.machine.verification.take_outgoing()
    assert (cancel.type, cancel.user_id, cancel.device_id) == (
        "m.key.verification.cancel", "@alice:x", "GHOST")  # fmt: skip
    assert "@alice:x" in b.machine.devices.outdated()  # fetched again for a retry


def test_a_start_with_no_common_method_is_cancelled(clock: Clock) -> None:
    _a, b = _pair(clock, ("@alice:x", "A"), ("@bob:x", "B"))
    start = {"from_device": "A", "method": "m.sas.v1", "transaction_id": "t2",
             "key_agreement_protocols": ["curve25519"], "hashes": ["sha256"],
             "message_authentication_codes": ["hkdf-hmac-sha256.v2"],
             "short_authentication_string": ["emoji"]}  # fmt: skip
    status = b.machine.verification.receive(
        VerificationEvent("@alice:x", "m.key.verification.start", start)
    )
    assert status is not None and status.cancel_code == "m.unknown_method"


def test_an_event_out_of_order_is_cancelled(clock: Clock) -> None:
    a, b = _pair(clock, ("@alice:x", "A"), ("@bob:x", "B"))
    flow = a.machine.verification.request("@bob:x", ("B",)).flow_id
    _relay(a, b)
    mac = {"transaction_id": flow, "mac": {}, "keys": "x"}
    status = b.machine.verification.receive(
        VerificationEvent("@alice:x", "m.key.verification.mac", mac)
    )
    assert status is not None and status.cancel_code == "m.unexpected_message"


def test_another_user_cannot_act_in_a_flow(clock: Clock) -> None:
    a, _b = _pair(clock, ("@alice:x", "A"), ("@bob:x", "B"))
    flow = a.machine.verification.request("@bob:x", ("B",)).flow_id
    cancel = {"transaction_id": flow, "code": "m.user", "reason": "x"}
    ev = VerificationEvent("@mallory:x", "m.key.verification.cancel", cancel)
    assert a.machine.verification.receive(ev) is None
    assert a.machine.verification.status(flow).state is S.REQUESTED


def test_a_request_to_several_devices_tells_the_others_when_one_answers(clock: Clock) -> None:
    server = KeyServer()
    a, b1, b2 = online(server, clock, ("@alice:x", "A"), ("@bob:x", "B1"), ("@bob:x", "B2"))
    for p in (a, b1, b2):
        p.machine.update_tracked_users(["@alice:x", "@bob:x"])
        p.pump()
    flow = a.machine.verification.request("@bob:x").flow_id
    sent = a.machine.verification.take_outgoing()
    assert sorted(str(m.device_id) for m in sent) == ["B1", "B2"]
    for m in sent:
        target = b1 if m.device_id == "B1" else b2
        target.machine.verification.receive(VerificationEvent("@alice:x", m.type, m.content))
    b2.machine.verification.accept(flow)
    _relay(b2, a)
    (cancel,) = a.machine.verification.take_outgoing()
    assert (cancel.device_id, cancel.content["code"]) == ("B1", "m.accepted")
    assert a.machine.verification.status(flow).device_id == "B2"


def test_in_room_verification_between_two_users(clock: Clock) -> None:
    a, b = _pair(clock, ("@alice:x", "A"), ("@bob:x", "B"))
    va, vb = a.machine.verification, b.machine.verification
    msg = va.request_in_room("!room:x", "@bob:x")
    assert msg.content["msgtype"] == "m.key.verification.request"
    va.room_request_sent("!room:x", "@bob:x", "$req")
    req = VerificationEvent("@alice:x", "m.room.message", msg.content, "!room:x", "$req",
                            origin_server_ts=clock())  # fmt: skip
    received = vb.receive(req)
    assert received is not None and received.state is S.REQUESTED
    vb.accept("$req")
    _relay(b, a)
    va.start_sas("$req")
    for src, dst in ((a, b), (b, a), (a, b), (b, a)):
        sent = src.machine.verification.take_outgoing()
        assert all(m.content["m.relates_to"]["event_id"] == "$req" for m in sent)
        assert all(m.room_id == "!room:x" and "transaction_id" not in m.content for m in sent)
        src.machine.verification._out.extend(sent)  # hand them on below
        for e in _relay(src, dst):
            assert e is not None
    assert va.status("$req").short_string == vb.status("$req").short_string
    va.confirm("$req")
    vb.confirm("$req")
    _relay(a, b)  # a's MAC
    _relay(b, a)  # b's MAC and done
    _relay(a, b)  # a's done
    assert va.status("$req").state is S.DONE and vb.status("$req").state is S.DONE
    assert _trust(a, b) is TrustLevel.VERIFIED


# -- against matrix-nio's SAS (an implementation that is not ours) ----------------------------


def _nio_event(cls: Any, sender: str, msg: VerificationMessage) -> Any:
    return cls.from_dict({"sender": sender, "type": msg.type, "content": msg.content})


def test_gapline_starts_and_nio_accepts(clock: Clock) -> None:
    a, b = _pair(clock, ("@alice:x", "A"), ("@bob:x", "B"))  # b only lends a device to nio
    va = a.machine.verification
    bob_keys = b.machine.identity_keys
    alice = OlmDevice("@alice:x", "A", dict(a.machine.identity_keys))
    flow = va.start_sas(user_id="@bob:x", device_id="B").flow_id
    (start,) = va.take_outgoing()
    nio = NioSas.from_key_verification_start(
        "@bob:x",
        "B",
        bob_keys["ed25519"],
        alice,
        _nio_event(KeyVerificationStart, "@alice:x", start),
    )
    assert not nio.canceled
    accept = nio.accept_verification()
    va.receive(VerificationEvent("@bob:x", accept.type, accept.content))  # nio's hex commitment
    (key,) = va.take_outgoing()
    nio.receive_key_event(_nio_event(KeyVerificationKey, "@alice:x", key))
    assert not nio.canceled
    nkey = nio.share_key()
    status = va.receive(VerificationEvent("@bob:x", nkey.type, nkey.content))
    assert status is not None and status.state is S.SHOW_SAS and status.short_string
    assert status.short_string.decimals == nio.get_decimals()
    # vodozemac hands out the seven emoji indices already split from the SAS bytes; nio
    # splits them into 6-bit groups once more, so nio shows other emoji than the spec's
    # (and Element's). What nio shows is exactly that re-split of our indices:
    ours = [EMOJI.index(e) for e in status.short_string.emoji]
    bits = "".join(format(i, "08b") for i in ours)[:42]
    resplit = [EMOJI[int(bits[i : i + 6], 2)][0] for i in range(0, 42, 6)]
    assert resplit == [e[0] for e in nio.get_emoji()]
    nio.accept_sas()
    nmac = nio.get_mac()
    va.receive(VerificationEvent("@bob:x", nmac.type, nmac.content))
    status = va.confirm(flow)
    assert status.state is S.DONE and status.verified_devices == ("B",)
    (mac,) = va.take_outgoing()
    nio.receive_mac_event(_nio_event(KeyVerificationMac, "@alice:x", mac))
    assert nio.verified and nio.verified_devices == ["A"]


def test_nio_starts_and_gapline_accepts(clock: Clock) -> None:
    a, b = _pair(clock, ("@alice:x", "A"), ("@bob:x", "B"))
    va = a.machine.verification
    bob = OlmDevice("@bob:x", "B", dict(b.machine.identity_keys))
    nio = NioSas("@bob:x", "B", b.machine.identity_keys["ed25519"], OlmDevice(
        "@alice:x", "A", dict(a.machine.identity_keys)))  # fmt: skip
    start = nio.start_verification()
    status = va.receive(VerificationEvent("@bob:x", start.type, start.content))
    assert status is not None and status.state is S.STARTED and not status.we_started
    assert bob.user_id == "@bob:x"
    va.accept(status.flow_id)
    (accept,) = va.take_outgoing()
    nio.receive_accept_event(_nio_event(KeyVerificationAccept, "@alice:x", accept))
    assert not nio.canceled
    nkey = nio.share_key()
    va.receive(VerificationEvent("@bob:x", nkey.type, nkey.content))
    (key,) = va.take_outgoing()
    nio.receive_key_event(_nio_event(KeyVerificationKey, "@alice:x", key))
    # matrix-nio checks the commitment against its own hex form; ours is the spec's base64.
    assert nio.canceled and nio.cancel_code == "m.mismatched_commitment"


# -- trust decides sharing --------------------------------------------------------------------


def _verify(a: Peer, b: Peer) -> None:
    flow = _to_show_sas(a, b)
    for p, q in ((a, b), (b, a)):
        p.machine.verification.confirm(flow)
        _relay(p, q)
    _relay(a, b)
    assert a.machine.verification.status(flow).state is S.DONE


def test_by_default_every_device_gets_the_key_and_events_decrypt(clock: Clock) -> None:
    server = KeyServer()
    a, b = online(server, clock, ("@alice:x", "A"), ("@bob:x", "B"))
    room = connected([a, b])
    assert a.machine.sharing is SharingPolicy.ALL_DEVICES
    assert ("@bob:x", "B") in a.share(room).shared_with
    event = b.send(room, "hello")
    a.sync()
    result = a.read(room, event)
    assert isinstance(result, DecryptedEvent) and result.trust is TrustLevel.UNSIGNED


def test_trusted_only_shares_with_verified_devices_and_marks_the_rest_untrusted(
    clock: Clock,
) -> None:
    server = KeyServer()
    a, b = online(server, clock, ("@alice:x", "A"), ("@bob:x", "B"))
    room = connected([a, b])
    a.machine.sharing = SharingPolicy.TRUSTED_ONLY
    report = a.share(room)
    assert ("@bob:x", "B") not in report.shared_with
    secret = a.send(room, "for verified eyes")
    b.sync()
    utd = b.read(room, secret)
    assert isinstance(utd, UnableToDecrypt) and utd.reason is UtdReason.MISSING_ROOM_KEY
    event = b.send(room, "from an unverified device")
    a.sync()
    untrusted = a.read(room, event)
    assert isinstance(untrusted, UnableToDecrypt) and untrusted.reason is UtdReason.UNTRUSTED
    assert untrusted.refusal is RefusalCode.UNVERIFIED_DEVICE
    assert untrusted.to_wire()["UnableToDecrypt"]["reason"] == "Untrusted"
    _verify(a, b)
    healed = a.read(room, event)  # the same event again, now from a verified device
    assert (
        isinstance(healed, DecryptedEvent) and healed.content["body"] == "from an unverified device"
    )
    assert healed.trust is TrustLevel.VERIFIED
    assert ("@bob:x", "B") in a.share(room).shared_with
    later = a.send(room, "now bob reads")
    b.sync()
    assert b.body(room, later) == "now bob reads"


def test_a_device_losing_trust_rotates_the_session(clock: Clock) -> None:
    server = KeyServer()
    a, b = online(server, clock, ("@alice:x", "A"), ("@bob:x", "B"))
    room = connected([a, b])
    first = a.share(room)
    assert ("@bob:x", "B") in first.shared_with
    a.machine.sharing = SharingPolicy.TRUSTED_ONLY
    second = a.share(room)
    assert second.rotated and second.session_id != first.session_id
    assert ("@bob:x", "B") not in second.shared_with


def test_when_both_sides_start_the_smaller_user_and_device_wins(clock: Clock) -> None:
    a, b = _pair(clock, ("@alice:x", "A"), ("@bob:x", "B"))
    va, vb = a.machine.verification, b.machine.verification
    flow = _ready(a, b)
    va.start_sas(flow)
    vb.start_sas(flow)  # both at once: their starts cross
    from_a, from_b = _events(a.machine, b.machine), _events(b.machine, a.machine)
    for e in from_b:
        va.receive(e)  # bob's start is ignored: alice's (the smaller) stands
    assert va.status(flow).state is S.STARTED and va.status(flow).we_started
    assert va.take_outgoing() == []
    for e in from_a:
        vb.receive(e)  # bob gives his up and accepts alice's
    assert vb.status(flow).state is S.ACCEPTED and not vb.status(flow).we_started
    _relay(b, a)
    _relay(a, b)
    _relay(b, a)
    assert va.status(flow).short_string == vb.status(flow).short_string is not None
