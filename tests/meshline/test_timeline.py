"""The processing flow over crafted pages: every refusal rule, dedup, order, gaps, positions."""

from __future__ import annotations

import dataclasses

import pytest

from gapline.meshline import BadRequest, DecryptionFailed, InvalidPage, InvalidSignature
from gapline.meshline._content import DeviceStateChanged, DirectMessage, UnknownContent
from gapline.meshline._envelope import sign_envelope
from gapline.meshline._timeline import (
    Direction,
    GapState,
    PolicyDecision,
    SyncPage,
    envelope_digest,
    process_page,
)
from gapline.meshline.testing import (
    TestAccount,
    local_device,
    make_account,
    make_send_params,
    sync_page,
    timeline_entry,
)

RELAY = "0x" + "11" * 20


@pytest.fixture(scope="module")
def alice() -> TestAccount:
    return make_account(2)


@pytest.fixture(scope="module")
def bob() -> TestAccount:
    return make_account(1)


@pytest.fixture(scope="module")
def carol() -> TestAccount:
    return make_account(1)


def nothing_known(key: tuple[str, str]) -> None:
    return None


def run(
    page: SyncPage,
    me: TestAccount,
    *,
    after: int = -1,
    device: int = 0,
    known=nothing_known,
    policy=None,
):
    return process_page(
        page,
        local=local_device(me, device),
        relay_id=RELAY,
        after=after,
        known=known,
        policy=policy,
    )


def test_inbound_message_accepted(alice: TestAccount, bob: TestAccount) -> None:
    params = make_send_params(bob, alice, text="hi alice")
    page = sync_page(
        [timeline_entry(params, alice.device(0).device_id, 5)], [bob.device(0).certificate]
    )
    outcome = run(page, alice)
    assert [m.sequence for m in outcome.accepted] == [5]
    message = outcome.accepted[0]
    assert message.direction is Direction.INBOUND
    assert isinstance(message.content, DirectMessage)
    assert message.content.body is not None and message.content.body.text == "hi alice"
    assert message.key == (bob.account, params.envelope.message_id)
    assert outcome.position == 5 and not outcome.rejected and outcome.gap is None


def test_sent_record_read_through_sender_box(alice: TestAccount, bob: TestAccount) -> None:
    params = make_send_params(alice, bob, text="to bob")
    # alice's second device reads the sent record; the certificate is her first device's.
    page = sync_page(
        [timeline_entry(params, alice.device(1).device_id, 0)], [alice.device(0).certificate]
    )
    outcome = run(page, alice, device=1)
    assert outcome.accepted[0].direction is Direction.OUTBOUND
    assert outcome.position == 0


def test_self_delivery(alice: TestAccount) -> None:
    params = make_send_params(alice, alice, text="note to self")
    assert params.sender_boxes is None
    page = sync_page(
        [timeline_entry(params, alice.device(1).device_id, 3)], [alice.device(0).certificate]
    )
    assert run(page, alice, device=1).accepted[0].direction is Direction.SELF
    # A DeviceStateChanged is not one of the objects self-delivery may carry.
    bad = make_send_params(
        alice, alice, content={"$type": "meshline.device.state.changed", "revision": 1}
    )
    outcome = run(
        sync_page(
            [timeline_entry(bad, alice.device(1).device_id, 4)], [alice.device(0).certificate]
        ),
        alice,
        device=1,
    )
    assert not outcome.accepted and isinstance(outcome.rejected[0].error, BadRequest)
    assert outcome.position == 4


def test_device_state_changed_inbound_is_known_content(
    alice: TestAccount, bob: TestAccount
) -> None:
    params = make_send_params(
        bob, alice, content={"$type": "meshline.device.state.changed", "revision": 7}
    )
    outcome = run(
        sync_page(
            [timeline_entry(params, alice.device(0).device_id, 1)], [bob.device(0).certificate]
        ),
        alice,
    )
    assert isinstance(outcome.accepted[0].content, DeviceStateChanged)
    assert outcome.accepted[0].content.revision == 7


def test_missing_certificate_refuses_page(
    alice: TestAccount, bob: TestAccount, carol: TestAccount
) -> None:
    one = make_send_params(bob, alice)
    two = make_send_params(carol, alice)
    page = sync_page(
        [
            timeline_entry(one, alice.device(0).device_id, 1),
            timeline_entry(two, alice.device(0).device_id, 2),
        ],
        [bob.device(0).certificate],  # carol's device is referenced but not certified
    )
    with pytest.raises(InvalidPage, match="no certificate"):
        run(page, alice)


def test_certificate_of_another_account_refuses_page(
    alice: TestAccount, bob: TestAccount, carol: TestAccount
) -> None:
    """Carol's device signs an envelope claiming to be from bob: her certificate covers
    the device id, but its account is not the record's sender."""
    params = make_send_params(carol, alice)
    wire = params.envelope.to_wire()
    wire["from"] = bob.account
    forged = sign_envelope(wire, carol.device(0).keys, carol.context)
    entry = dataclasses.replace(
        timeline_entry(params, alice.device(0).device_id, 1), envelope=forged
    )
    with pytest.raises(InvalidPage, match="another account"):
        run(sync_page([entry], [carol.device(0).certificate]), alice)


def test_bad_or_duplicate_certificates_refuse_page(alice: TestAccount, bob: TestAccount) -> None:
    params = make_send_params(bob, alice)
    entry = timeline_entry(params, alice.device(0).device_id, 1)
    cert = bob.device(0).certificate
    from gapline.meshline import issue_certificate

    renewed = issue_certificate(
        bob.key,
        bob.device(0).keys,
        bob.context,
        not_before=cert.not_before + 1,
        expires_at=cert.expires_at + 1,
    )
    assert renewed.device_id(bob.context) == bob.device(0).device_id  # renewal keeps the id
    with pytest.raises(InvalidPage, match="two page certificates"):
        run(sync_page([entry], [cert, renewed]), alice)
    tampered = dataclasses.replace(cert, expires_at=cert.expires_at - 1)
    with pytest.raises(InvalidPage, match="does not verify"):
        run(sync_page([entry], [tampered]), alice)


def test_key_box_for_another_device_rejected(alice: TestAccount, bob: TestAccount) -> None:
    params = make_send_params(bob, alice)
    entry = timeline_entry(params, alice.device(0).device_id, 9)
    outcome = run(sync_page([entry], [bob.device(0).certificate]), alice, device=1)
    assert not outcome.accepted
    assert (
        outcome.rejected[0].sequence == 9 and "another device" in outcome.rejected[0].error.message
    )
    assert outcome.position == 9  # the record is finished: rejected, never applied


@pytest.mark.parametrize("field", ["created_at", "to", "message_id"])
def test_tampered_aad_rejected(alice: TestAccount, bob: TestAccount, field: str) -> None:
    """The sender's device re-signs an envelope whose AAD fields changed after encryption:
    the signature verifies, the key box or payload does not authenticate."""
    params = make_send_params(bob, alice)
    wire = params.envelope.to_wire()
    if field == "created_at":
        wire["created_at"] += 1
    elif field == "message_id":
        wire["message_id"] = "msg_" + "A" * 22
    else:
        wire["to"] = bob.account  # then the record is not ours at all
    resigned = sign_envelope(wire, bob.device(0).keys, bob.context)
    entry = dataclasses.replace(
        timeline_entry(params, alice.device(0).device_id, 2), envelope=resigned
    )
    outcome = run(sync_page([entry], [bob.device(0).certificate]), alice)
    assert not outcome.accepted
    assert isinstance(outcome.rejected[0].error, DecryptionFailed | BadRequest)


def test_tampered_payload_aad_only(alice: TestAccount, bob: TestAccount) -> None:
    """A valid box but a payload sealed under another message's AAD fails authentication."""
    params = make_send_params(bob, alice, message_id="msg_" + "B" * 22)
    other = make_send_params(bob, alice, message_id="msg_" + "C" * 22)
    wire = params.envelope.to_wire()
    wire["payload"] = other.envelope.payload.to_wire()
    resigned = sign_envelope(wire, bob.device(0).keys, bob.context)
    entry = dataclasses.replace(
        timeline_entry(params, alice.device(0).device_id, 2), envelope=resigned
    )
    outcome = run(sync_page([entry], [bob.device(0).certificate]), alice)
    assert isinstance(outcome.rejected[0].error, DecryptionFailed)


def test_bad_envelope_signature_rejected(alice: TestAccount, bob: TestAccount) -> None:
    params = make_send_params(bob, alice)
    wire = params.envelope.to_wire()
    wire["created_at"] += 1  # not re-signed
    from gapline.meshline import MessageEnvelope

    entry = dataclasses.replace(
        timeline_entry(params, alice.device(0).device_id, 2),
        envelope=MessageEnvelope.from_wire(wire),
    )
    outcome = run(sync_page([entry], [bob.device(0).certificate]), alice)
    assert isinstance(outcome.rejected[0].error, InvalidSignature)


def test_duplicate_with_different_content_never_overwrites(
    alice: TestAccount, bob: TestAccount
) -> None:
    mid = "msg_" + "D" * 22
    first = make_send_params(bob, alice, text="first", message_id=mid)
    second = make_send_params(bob, alice, text="second", message_id=mid)
    cert = bob.device(0).certificate
    dev = alice.device(0).device_id
    # Same page: the first copy wins, the second is a conflict, not applied.
    outcome = run(
        sync_page([timeline_entry(first, dev, 1), timeline_entry(second, dev, 2)], [cert]), alice
    )
    assert [m.sequence for m in outcome.accepted] == [1]
    assert outcome.duplicates[0].sequence == 2 and outcome.duplicates[0].conflict
    assert outcome.position == 2
    # Another relay later: the store knows the first digest.
    accepted = {first.envelope.key: envelope_digest(first.envelope)}
    later = run(sync_page([timeline_entry(second, dev, 40)], [cert]), alice, known=accepted.get)
    assert not later.accepted and later.duplicates[0].conflict
    same = run(sync_page([timeline_entry(first, dev, 41)], [cert]), alice, known=accepted.get)
    assert not same.accepted and not same.duplicates[0].conflict


def test_out_of_order_sequences_refuse_page(alice: TestAccount, bob: TestAccount) -> None:
    dev = alice.device(0).device_id
    a, b = make_send_params(bob, alice), make_send_params(bob, alice)
    cert = bob.device(0).certificate
    with pytest.raises(InvalidPage, match="ascending"):
        run(sync_page([timeline_entry(a, dev, 5), timeline_entry(b, dev, 3)], [cert]), alice)
    with pytest.raises(InvalidPage, match="ascending"):
        run(sync_page([timeline_entry(a, dev, 5), timeline_entry(b, dev, 5)], [cert]), alice)
    with pytest.raises(InvalidPage, match="ascending"):
        run(sync_page([timeline_entry(a, dev, 5)], [cert]), alice, after=5)
    ok = run(sync_page([timeline_entry(a, dev, 3), timeline_entry(b, dev, 5)], [cert]), alice)
    assert [m.sequence for m in ok.accepted] == [3, 5]  # applied in the relay's order


def test_empty_page_keeps_position(alice: TestAccount) -> None:
    outcome = run(sync_page([], []), alice, after=12)
    assert outcome.position == 12 and not outcome.accepted and outcome.gap is None
    with pytest.raises(InvalidPage, match="has_more"):
        run(sync_page([], [], has_more=True), alice, after=12)


def test_retention_gap_is_surfaced(alice: TestAccount, bob: TestAccount) -> None:
    params = make_send_params(bob, alice)
    page = sync_page(
        [timeline_entry(params, alice.device(0).device_id, 30)],
        [bob.device(0).certificate],
        has_retention_gap=True,
    )
    outcome = run(page, alice, after=4)
    assert outcome.gap is not None
    assert (outcome.gap.after, outcome.gap.before, outcome.gap.state) == (
        4,
        30,
        GapState.UNAVAILABLE,
    )
    assert outcome.accepted[0].sequence == 30  # readable records still come through
    empty = run(sync_page([], [], has_retention_gap=True), alice, after=4)
    assert empty.gap is not None and empty.gap.before is None and empty.position == 4


def test_record_not_ours_rejected(alice: TestAccount, bob: TestAccount, carol: TestAccount) -> None:
    params = make_send_params(bob, carol)
    entry = dataclasses.replace(
        timeline_entry(params, carol.device(0).device_id, 1),
        key_box=dataclasses.replace(params.recipient_boxes[0], device_id=alice.device(0).device_id),
    )
    outcome = run(sync_page([entry], [bob.device(0).certificate]), alice)
    assert not outcome.accepted and "neither from nor to" in outcome.rejected[0].error.message


def test_sent_record_must_be_from_local_account(alice: TestAccount, bob: TestAccount) -> None:
    """A record that carries a sender box for us but is from bob to carol is not ours."""
    carol = make_account(1)
    params = make_send_params(bob, carol)
    page = sync_page(
        [timeline_entry(params, carol.device(0).device_id, 1)], [bob.device(0).certificate]
    )
    outcome = run(page, alice)
    assert not outcome.accepted and outcome.rejected


class Deny:
    def decide(self, sender, content):
        return PolicyDecision.DENY


class DeferSecond:
    def __init__(self) -> None:
        self.calls = 0

    def decide(self, sender, content):
        self.calls += 1
        return PolicyDecision.ALLOW if self.calls == 1 else PolicyDecision.DEFER


def test_inbound_policy(alice: TestAccount, bob: TestAccount) -> None:
    dev = alice.device(0).device_id
    a, b, c = (make_send_params(bob, alice) for _ in range(3))
    page = sync_page(
        [timeline_entry(a, dev, 1), timeline_entry(b, dev, 2), timeline_entry(c, dev, 3)],
        [bob.device(0).certificate],
    )
    denied = run(page, alice, policy=Deny())
    assert not denied.accepted and len(denied.rejected) == 3 and denied.position == 3
    deferred = run(page, alice, policy=DeferSecond())
    assert [m.sequence for m in deferred.accepted] == [1]
    assert deferred.stalled and deferred.position == 1  # never past an unfinished record
    # Our own sent records are not subject to the inbound policy.
    sent = make_send_params(alice, bob)
    own = run(
        sync_page(
            [timeline_entry(sent, alice.device(1).device_id, 4)], [alice.device(0).certificate]
        ),
        alice,
        device=1,
        policy=Deny(),
    )
    assert own.accepted


def test_unknown_and_invalid_content(alice: TestAccount, bob: TestAccount) -> None:
    dev = alice.device(0).device_id
    unknown = make_send_params(bob, alice, content={"$type": "example.future.thing", "x": 1})
    invalid = make_send_params(
        bob,
        alice,
        content={
            "$type": "meshline.message.direct",
            "body": {"content_type": "text/plain", "text": "   "},
        },
    )
    outcome = run(
        sync_page(
            [timeline_entry(unknown, dev, 1), timeline_entry(invalid, dev, 2)],
            [bob.device(0).certificate],
        ),
        alice,
    )
    assert (
        isinstance(outcome.accepted[0].content, UnknownContent)
        and not outcome.accepted[0].applicable
    )
    assert outcome.rejected[0].sequence == 2 and isinstance(outcome.rejected[0].error, BadRequest)


def test_page_round_trips_through_json(alice: TestAccount, bob: TestAccount) -> None:
    params = make_send_params(bob, alice)
    page = sync_page(
        [timeline_entry(params, alice.device(0).device_id, 1)],
        [bob.device(0).certificate],
        has_retention_gap=True,
    )
    from gapline.meshline import canonical_json

    assert SyncPage.from_json(canonical_json(page.to_wire())) == page
