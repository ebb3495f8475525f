"""Property tests: canonical JSON round trips of every object; any single-byte change to a
signed or sealed field is detected."""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gapline.meshline import (
    AccountDeviceState,
    BadRequest,
    DeviceCertificate,
    EncryptedPayload,
    MeshlineError,
    MessageEnvelope,
    MessageKeyBox,
    SendParams,
    SyncPage,
    b64u_decode,
    b64u_encode,
    canonical_json,
    open_envelope,
    parse_json,
    verify_certificate,
    verify_device_state,
)
from gapline.meshline.testing import make_account, make_send_params, sync_page, timeline_entry

ALICE = make_account(2)
BOB = make_account(1)
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Extension fields: names that are not protocol fields, JSON values within the safe range.
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53 - 1), max_value=2**53 - 1)
    | st.text(max_size=12),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=8,
)
extension_names = st.text(min_size=1, max_size=10).filter(
    lambda n: not n.startswith("$") and n.isidentifier() and n.startswith("x")
)
extensions = st.dictionaries(extension_names, json_values, max_size=3)
texts = st.text(min_size=1, max_size=200).filter(lambda t: not t.isspace())


def _has_null(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, dict):
        return any(_has_null(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_null(v) for v in value)
    return False


def roundtrip(obj: Any) -> None:
    data = obj.to_json() if hasattr(obj, "to_json") else canonical_json(obj.to_wire())
    assert canonical_json(parse_json(data)) == data  # already canonical
    again = (
        type(obj).from_json(data)
        if hasattr(type(obj), "from_json")
        else type(obj).from_wire(parse_json(data))
    )
    assert again == obj
    assert canonical_json(again.to_wire()) == data


@SETTINGS
@given(text=texts, created_at=st.integers(0, 2**40), ext=extensions, box_ext=extensions)
def test_objects_round_trip_through_canonical_json(
    text: str, created_at: int, ext: dict, box_ext: dict
) -> None:
    params = make_send_params(BOB, ALICE, text=text, created_at=created_at)
    envelope = dataclasses.replace(params.envelope, extensions=ext)
    box = dataclasses.replace(params.recipient_boxes[0], extensions=box_ext)
    for obj in (
        envelope,
        envelope.payload,
        box,
        BOB.device(0).certificate,
        ALICE.state,
        dataclasses.replace(params, extensions=ext),
    ):
        roundtrip(obj)
    page = sync_page(
        [timeline_entry(params, ALICE.device(0).device_id, created_at)], [BOB.device(0).certificate]
    )
    roundtrip(dataclasses.replace(page, extensions=ext))
    assert SyncPage.from_json(canonical_json(page.to_wire())) == page
    assert SendParams.from_json(params.to_json()) == params
    assert EncryptedPayload.from_json(envelope.payload.to_json()) == envelope.payload
    assert MessageKeyBox.from_json(box.to_json()) == box


def flip(text: str, index: int, mask: int) -> str:
    raw = bytearray(b64u_decode(text))
    raw[index % len(raw)] ^= mask
    return b64u_encode(bytes(raw))


def open_as_recipient(
    params: SendParams, envelope: MessageEnvelope, box: MessageKeyBox, signing_key: bytes
) -> bytes:
    return open_envelope(
        envelope,
        box,
        sender_signing_key=signing_key,
        box_account=ALICE.account,
        encryption_key=ALICE.device(0).keys.encryption_key,
        context=ALICE.context,
    )


SEALED_FIELDS = [
    "device_signature",
    "payload.nonce",
    "payload.ciphertext",
    "box.enc",
    "box.sealed_key",
    "signing_key",
]
TEXT_FIELDS = ["message_id", "from_device_id", "from", "to", "created_at"]


@SETTINGS
@given(
    field=st.sampled_from(SEALED_FIELDS + TEXT_FIELDS),
    index=st.integers(0, 10_000),
    mask=st.integers(1, 255),
)
def test_any_single_byte_change_to_a_sealed_message_is_detected(
    field: str, index: int, mask: int
) -> None:
    params = make_send_params(BOB, ALICE, text="property")
    signing_key = BOB.device(0).keys.signing_public_key
    wire = params.envelope.to_wire()
    box = params.recipient_boxes[0]
    assert open_as_recipient(params, params.envelope, box, signing_key)
    if field == "device_signature":
        wire["device_signature"] = flip(wire["device_signature"], index, mask)
    elif field.startswith("payload."):
        name = field.split(".")[1]
        wire["payload"][name] = flip(wire["payload"][name], index, mask)
    elif field.startswith("box."):
        name = field.split(".")[1]
        box = dataclasses.replace(box, **{name: flip(getattr(box, name), index, mask)})
    elif field == "signing_key":
        raw = bytearray(signing_key)
        raw[index % 32] ^= mask
        signing_key = bytes(raw)
    elif field == "created_at":
        wire["created_at"] ^= mask
    else:
        text = wire[field]
        position = 4 + index % (len(text) - 4)  # keep the prefix so the format still parses
        alphabet = "ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz123456789"
        offset = 1 + mask % (len(alphabet) - 1)  # never a whole turn: always another character
        replacement = alphabet[(alphabet.find(text[position]) + offset) % len(alphabet)]
        assert replacement != text[position]
        wire[field] = text[:position] + replacement + text[position + 1 :]
    try:
        tampered = MessageEnvelope.from_wire(wire)
        open_as_recipient(params, tampered, box, signing_key)
    except MeshlineError:
        return
    raise AssertionError(f"change to {field} went undetected")


CERT_FIELDS = [
    "account_public_key",
    "signing_public_key",
    "encryption_public_key",
    "device_signature",
    "account_signature",
]


@SETTINGS
@given(
    field=st.sampled_from(
        [*CERT_FIELDS, "not_before", "expires_at", "state_signature", "revision"]
    ),
    index=st.integers(0, 10_000),
    mask=st.integers(1, 255),
)
def test_any_single_byte_change_to_a_certificate_or_state_is_detected(
    field: str, index: int, mask: int
) -> None:
    cert_wire = ALICE.device(0).certificate.to_wire()
    state_wire = ALICE.state.to_wire()
    if field in CERT_FIELDS:
        cert_wire[field] = flip(cert_wire[field], index, mask)
    elif field in ("not_before", "expires_at"):
        cert_wire[field] -= mask
    elif field == "state_signature":
        state_wire["account_signature"] = flip(state_wire["account_signature"], index, mask)
    else:
        state_wire["revision"] ^= mask
    if field in ("state_signature", "revision"):
        try:
            verify_device_state(AccountDeviceState.from_wire(state_wire), ALICE.context)
        except MeshlineError:
            return
    else:
        try:
            verify_certificate(DeviceCertificate.from_wire(cert_wire), ALICE.context)
        except (MeshlineError, BadRequest):
            return
    raise AssertionError(f"change to {field} went undetected")


any_text = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=8)
any_json = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**53 - 1), max_value=2**53 - 1) | any_text,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(any_text, children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(value=any_json)
def test_fast_canonical_json_equals_rfc8785(value: Any) -> None:
    from gapline.meshline._canonical import canonical_json_reference

    assert canonical_json(value) == canonical_json_reference(value)


def test_utf16_key_order_uses_the_reference() -> None:
    """U+1F600 sorts before U+FB01 in UTF-16 code units but after it by code point."""
    value = {"\ufb01": 1, "\U0001f600": 2}
    assert canonical_json(value) == '{"\U0001f600":2,"\ufb01":1}'.encode()
