"""The hot-path shortcuts produce exactly what their generic definitions produce.

- ``b64u_decode`` (alphabet by ``bytes.translate``, tail bits by table) against the
  definition: decode, re-encode, compare.
- The fixed-shape network-bound inputs (message AAD, envelope signing input, key-box
  info) against ``network_bound_bytes`` of the same dict, including inputs that must
  fall back (non-ASCII, quotes and control characters, unsafe or non-int numbers,
  ``str`` subclasses, extensions).
- The prebuilt C encoder inside ``canonical_json`` against the stdlib encoder.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gapline.meshline import (
    MAX_SAFE_INTEGER,
    BadRequest,
    EncryptedPayload,
    MeshlineError,
    MessageEnvelope,
    NetworkContext,
    b64u_decode,
    b64u_encode,
    canonical_json,
    envelope_signing_input,
    message_aad,
    network_bound_bytes,
)
from gapline.meshline._envelope import ENVELOPE_TYPE
from gapline.meshline._keybox import KEYBOX_ALG, MessageHeader, key_box_info
from gapline.meshline.testing import TEST_CONTEXT

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
URL_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"


def reference_b64u_decode(text: object, length: int | None) -> bytes:
    """The definition: only the URL alphabet, no padding, re-encodes to itself."""
    if not isinstance(text, str) or any(c not in URL_ALPHABET for c in text) or len(text) % 4 == 1:
        raise BadRequest("value: not canonical base64url")
    try:
        data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise BadRequest("value: not canonical base64url") from None
    if base64.urlsafe_b64encode(data).rstrip(b"=").decode() != text:
        raise BadRequest("value: non-canonical base64url (tail bits)")
    if length is not None and len(data) != length:
        raise BadRequest(f"value: expected {length} bytes, got {len(data)}")
    return data


def outcome(fn: Any, *args: Any, **kwargs: Any) -> tuple[str, object]:
    try:
        return ("ok", fn(*args, **kwargs))
    except MeshlineError as exc:
        return (type(exc).__name__, str(exc))


b64ish = st.text(alphabet=URL_ALPHABET + "+/= .\n\u00e9\ud800", max_size=14)


@SETTINGS
@given(text=b64ish | st.binary(max_size=40).map(b64u_encode), length=st.none() | st.integers(0, 9))
def test_b64u_decode_equals_the_reencode_definition(text: str, length: int | None) -> None:
    assert outcome(b64u_decode, text, length=length) == outcome(reference_b64u_decode, text, length)


@SETTINGS
@given(data=st.binary(max_size=100))
def test_b64u_encode_is_unpadded_urlsafe(data: bytes) -> None:
    assert b64u_encode(data) == base64.urlsafe_b64encode(data).rstrip(b"=").decode()
    assert b64u_decode(b64u_encode(data)) == data


def test_b64u_decode_refuses_every_tail_bit_spelling() -> None:
    # "AQ" is 0x01; "AR".."AZ" etc. set unused low bits and must be refused.
    assert b64u_decode("AQ") == b"\x01"
    for c in URL_ALPHABET:
        text = "A" + c
        if URL_ALPHABET.index(c) & 0x0F:
            with pytest.raises(BadRequest, match="tail bits"):
                b64u_decode(text)
        else:
            assert len(b64u_decode(text)) == 1
    with pytest.raises(BadRequest):
        b64u_decode(None)


# Values that take the fast path (ASCII identifiers) and values that must not.
strings = (
    st.from_regex(r"[A-Za-z0-9_:-]{0,30}", fullmatch=True)
    | st.text(max_size=12)
    | st.sampled_from(['a"b', "a\\b", "\n\t\x00", "\u2028", "\ue000", "\U0001f600", "\ud800"])
)
numbers = st.integers(min_value=-MAX_SAFE_INTEGER, max_value=MAX_SAFE_INTEGER) | st.sampled_from(
    [MAX_SAFE_INTEGER + 1, -MAX_SAFE_INTEGER - 1, True, False, 1.0, None]
)


class Sub(str):
    __slots__ = ()


def maybe_sub(value: Any, sub: bool) -> Any:
    return Sub(value) if sub and isinstance(value, str) else value


@SETTINGS
@given(
    message_id=strings,
    created_at=numbers,
    from_=strings,
    from_device_id=strings,
    to=strings,
    sub=st.booleans(),
)
def test_message_aad_equals_network_bound_bytes(
    message_id: str, created_at: int, from_: str, from_device_id: str, to: str, sub: bool
) -> None:
    fast = outcome(
        message_aad,
        message_id=maybe_sub(message_id, sub),
        created_at=created_at,
        from_=from_,
        from_device_id=from_device_id,
        to=to,
        context=TEST_CONTEXT,
    )
    generic = outcome(
        network_bound_bytes,
        {
            "$type": "meshline.message.aad",
            "message_id": maybe_sub(message_id, sub),
            "created_at": created_at,
            "from": from_,
            "from_device_id": from_device_id,
            "to": to,
        },
        TEST_CONTEXT,
    )
    assert fast == generic


@SETTINGS
@given(
    message_id=strings,
    created_at=numbers,
    from_=strings,
    from_device_id=strings,
    account=strings,
    device_id=strings,
    enc=strings,
)
def test_key_box_info_equals_network_bound_bytes(
    message_id: str,
    created_at: int,
    from_: str,
    from_device_id: str,
    account: str,
    device_id: str,
    enc: str,
) -> None:
    header = MessageHeader(message_id, created_at, from_, from_device_id)
    fast = outcome(
        key_box_info, header, account=account, device_id=device_id, enc=enc, context=TEST_CONTEXT
    )
    generic = outcome(
        network_bound_bytes,
        {
            "$type": "meshline.message.key_box.aad",
            "alg": KEYBOX_ALG,
            "payload_alg": "AES-256-GCM",
            "message_id": message_id,
            "created_at": created_at,
            "from": from_,
            "from_device_id": from_device_id,
            "account": account,
            "device_id": device_id,
            "enc": enc,
        },
        TEST_CONTEXT,
    )
    assert fast == generic


extension_maps = st.dictionaries(
    st.sampled_from(["x_a", "x_b", "zz"]), st.integers(0, 5) | st.text(max_size=4), max_size=2
)


@SETTINGS
@given(
    message_id=strings,
    created_at=numbers,
    from_=strings,
    from_device_id=strings,
    to=strings,
    nonce=strings,
    ciphertext=strings,
    alg=st.sampled_from(["AES-256-GCM", 'odd"alg']),
    envelope_ext=extension_maps,
    payload_ext=extension_maps,
)
def test_envelope_signing_input_equals_network_bound_bytes(
    message_id: str,
    created_at: int,
    from_: str,
    from_device_id: str,
    to: str,
    nonce: str,
    ciphertext: str,
    alg: str,
    envelope_ext: dict[str, Any],
    payload_ext: dict[str, Any],
) -> None:
    payload = EncryptedPayload(nonce=nonce, ciphertext=ciphertext, alg=alg, extensions=payload_ext)
    envelope = MessageEnvelope(
        message_id=message_id,
        created_at=created_at,
        from_=from_,
        from_device_id=from_device_id,
        to=to,
        payload=payload,
        device_signature="sig",
        extensions=envelope_ext,
    )
    generic = outcome(
        network_bound_bytes,
        {
            **envelope_ext,
            "$type": ENVELOPE_TYPE,
            "message_id": message_id,
            "created_at": created_at,
            "from": from_,
            "from_device_id": from_device_id,
            "to": to,
            "payload": {**payload_ext, "alg": alg, "nonce": nonce, "ciphertext": ciphertext},
        },
        TEST_CONTEXT,
    )
    assert outcome(envelope_signing_input, envelope, TEST_CONTEXT) == generic


def test_a_plain_str_context_binds_like_the_generic_path() -> None:
    # Typed as NetworkContext, but the generic path accepts any str: so must the fast one.
    plain = cast(NetworkContext, "neo:7:0x" + "ab" * 20)
    message_id, device_id = "msg_" + "A" * 22, "dev_" + "B" * 22
    fast = message_aad(
        message_id=message_id,
        created_at=5,
        from_="neo:7:x",
        from_device_id=device_id,
        to="neo:7:y",
        context=plain,
    )
    assert fast == network_bound_bytes(
        {
            "$type": "meshline.message.aad",
            "message_id": message_id,
            "created_at": 5,
            "from": "neo:7:x",
            "from_device_id": device_id,
            "to": "neo:7:y",
        },
        plain,
    )
    assert type(plain) is str and b'"$context":"neo:7:0x' in fast


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-MAX_SAFE_INTEGER, max_value=MAX_SAFE_INTEGER)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children)
    ),
    max_leaves=10,
)
_STDLIB = json.JSONEncoder(ensure_ascii=False, sort_keys=True, separators=(",", ":"))


@SETTINGS
@given(value=json_values)
def test_prebuilt_encoder_equals_the_stdlib_encoder(value: Any) -> None:
    try:
        expected = _STDLIB.encode(value).encode("utf-8")
    except UnicodeEncodeError:
        with pytest.raises(BadRequest):
            canonical_json(value)
        return
    if any(ord(c) >= 0xE000 for c in expected.decode("utf-8")):
        return  # key order may legitimately differ there: test_properties covers rfc8785
    assert canonical_json(value) == expected


def test_canonical_json_still_refuses_a_cycle() -> None:
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    with pytest.raises(RecursionError):
        canonical_json(cyclic)


def test_parse_json_skips_the_tree_walk_only_when_it_could_find_nothing() -> None:
    from gapline.meshline import parse_json
    from gapline.meshline._errors import BadRequest as _BadRequest

    deep = "[" * 17 + "0" + "]" * 17
    with pytest.raises(_BadRequest):
        parse_json(deep.encode())
    assert parse_json(("[" * 16 + "0" + "]" * 16).encode()) is not None
    with pytest.raises(_BadRequest):
        parse_json(b'{"a": "\\ud800"}')  # a lone surrogate from an escape
    with pytest.raises(_BadRequest):
        parse_json('{"a": "\ud800"}')  # a lone surrogate in a str input
    assert parse_json(b'{"a": "\\ud83d\\ude00"}') == {"a": "\U0001f600"}
