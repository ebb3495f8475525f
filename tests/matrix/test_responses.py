"""Parsing answers into typed values; bad bodies become typed errors."""

from __future__ import annotations

import pytest

from gapline.matrix import (
    ClientEvent,
    Forbidden,
    LoginResponse,
    MatrixHTTPError,
    MatrixProtocolError,
    MessagesResponse,
    NotFound,
    RateLimited,
    RelationsResponse,
    SyncResponse,
    UnknownToken,
    parse,
)
from gapline.matrix._responses import parse_error

EVENT = (
    b'{"event_id":"$e","type":"m.room.message","sender":"@a:x","origin_server_ts":5,'
    b'"content":{"body":"hi"}}'
)


def test_sync_shape() -> None:
    body = (
        b'{"next_batch":"s9","rooms":{"join":{"!r:x":{'
        b'"timeline":{"events":[' + EVENT + b'],"limited":true,"prev_batch":"t3"},'
        b'"state":{"events":[]},'
        b'"ephemeral":{"events":[{"type":"m.receipt","content":{"$e":{"m.read":{"@b:x":{"ts":1}}}}}]},'
        b'"account_data":{"events":[{"type":"m.fully_read","content":{"event_id":"$e"}}]}'
        b'}},"invite":{"!i:x":{"invite_state":{"events":[{"type":"m.room.member","state_key":"@a:x",'
        b'"sender":"@b:x","content":{"membership":"invite"}}]}}},"leave":{"!l:x":{}}},'
        b'"unknown_extra":1}'
    )
    sync = parse(body, SyncResponse)
    room = sync.rooms.join["!r:x"]
    assert sync.next_batch == "s9"
    assert room.timeline.limited and room.timeline.prev_batch == "t3"
    assert room.timeline.events[0].content == {"body": "hi"}
    assert room.fully_read == "$e"
    assert room.receipts == {"$e": {"m.read": {"@b:x": {"ts": 1}}}}
    assert sync.rooms.invite["!i:x"].invite_state.events[0].state_key == "@a:x"
    assert sync.rooms.leave["!l:x"].timeline.events == []


def test_minimal_sync_defaults() -> None:
    sync = parse(b'{"next_batch":"s1"}', SyncResponse)
    assert sync.rooms.join == {} and sync.account_data.events == []


def test_messages_end_is_optional() -> None:
    page = parse(b'{"chunk":[],"start":"t1"}', MessagesResponse)
    assert page.end is None and page.chunk == []


def test_relations_recursion_depth() -> None:
    rel = parse(b'{"chunk":[' + EVENT + b'],"recursion_depth":3}', RelationsResponse)
    assert rel.recursion_depth == 3 and rel.next_batch is None


@pytest.mark.parametrize(
    "body",
    [
        b'{"chunk":[{"type":"m.room.message"}],"start":"t"}',  # event lacks event_id
        b'{"chunk":"nope","start":"t"}',
        b'{"chunk":[],"start":5}',
        b"[]",
        b'{"chunk":[',  # truncated
        b"<html>bad gateway</html>",
        b"",
    ],
)
def test_malformed_messages_is_protocol_error(body: bytes) -> None:
    with pytest.raises(MatrixProtocolError):
        parse(body, MessagesResponse)


def test_malformed_sync_is_protocol_error() -> None:
    with pytest.raises(MatrixProtocolError):
        parse(b'{"rooms":{}}', SyncResponse)  # no next_batch
    with pytest.raises(MatrixProtocolError):
        parse(
            b'{"next_batch":"s","rooms":{"join":{"!r:x":{"timeline":{"events":[{}]}}}}}',
            SyncResponse,
        )


def test_login_repr_hides_token() -> None:
    login = parse(b'{"user_id":"@a:x","access_token":"SECRET","device_id":"D"}', LoginResponse)
    assert login.access_token == "SECRET"
    assert "SECRET" not in repr(login)


def test_redaction_helpers() -> None:
    v11 = parse(
        b'{"event_id":"$r","type":"m.room.redaction","sender":"@a:x","origin_server_ts":1,'
        b'"content":{"redacts":"$t"}}',
        ClientEvent,
    )
    old = parse(
        b'{"event_id":"$r","type":"m.room.redaction","sender":"@a:x","origin_server_ts":1,'
        b'"content":{},"redacts":"$t"}',
        ClientEvent,
    )
    assert v11.redacted_event_id == "$t" == old.redacted_event_id
    redacted = parse(
        b'{"event_id":"$t","type":"m.room.message","sender":"@a:x","origin_server_ts":1,'
        b'"content":{},"unsigned":{"redacted_because":{"event_id":"$r"}}}',
        ClientEvent,
    )
    assert redacted.redacted_because == {"event_id": "$r"}
    assert not redacted.is_state


@pytest.mark.parametrize(
    ("status", "body", "cls"),
    [
        (401, b'{"errcode":"M_UNKNOWN_TOKEN","error":"gone"}', UnknownToken),
        (403, b'{"errcode":"M_FORBIDDEN","error":"no"}', Forbidden),
        (403, b"", Forbidden),
        (404, b'{"errcode":"M_NOT_FOUND","error":"?"}', NotFound),
        (429, b'{"errcode":"M_LIMIT_EXCEEDED","retry_after_ms":1500}', RateLimited),
        (400, b'{"errcode":"M_INVALID_PARAM","error":"bad"}', MatrixHTTPError),
        (404, b'{"errcode":"M_UNRECOGNIZED"}', MatrixHTTPError),
    ],
)
def test_error_mapping(status: int, body: bytes, cls: type[MatrixHTTPError]) -> None:
    error = parse_error(status, body)
    assert type(error) is cls
    assert error.status == status


def test_error_fields_and_retry_after_header() -> None:
    error = parse_error(429, b'{"errcode":"M_LIMIT_EXCEEDED","error":"slow","retry_after_ms":1500}')
    assert (error.errcode, error.error, error.retry_after_ms) == ("M_LIMIT_EXCEEDED", "slow", 1500)
    from_header = parse_error(429, b"not json", "2")
    assert isinstance(from_header, RateLimited) and from_header.retry_after_ms == 2000
    assert "M_LIMIT_EXCEEDED" in str(error)
