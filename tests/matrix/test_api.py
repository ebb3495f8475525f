"""The pure request builders: paths, queries, bodies, and where the token goes."""

from __future__ import annotations

import json

import pytest

from gapline.matrix import Direction, Request, api


def test_every_path_segment_is_quoted_with_nothing_safe() -> None:
    req = api.messages("!a/b#c?d:ex.org", from_="t1-1_0", limit=50)
    assert req.path == "/_matrix/client/v3/rooms/%21a%2Fb%23c%3Fd%3Aex.org/messages"
    assert req.method == "GET"
    assert dict(req.query) == {"from": "t1-1_0", "dir": "b", "limit": "50"}


def test_event_ids_with_slash_and_hash_stay_one_segment() -> None:
    req = api.get_event("!r:x", "$ab/c#d+e=")
    assert req.path == "/_matrix/client/v3/rooms/%21r%3Ax/event/%24ab%2Fc%23d%2Be%3D"
    rel = api.relations("!r:x", "$p/q", rel_type="m.thread", event_type="m.room.message")
    assert rel.path == (
        "/_matrix/client/v1/rooms/%21r%3Ax/relations/%24p%2Fq/m.thread/m.room.message"
    )


def test_send_is_put_with_txn_and_idempotent() -> None:
    req = api.send_event("!r:x", "m.room.message", {"body": "hi"}, "txn/1")
    assert req.method == "PUT"
    assert req.path == "/_matrix/client/v3/rooms/%21r%3Ax/send/m.room.message/txn%2F1"
    assert req.json == {"body": "hi"}
    assert req.idempotent


def test_non_idempotent_requests_are_marked() -> None:
    assert not api.create_room(name="x").idempotent
    assert not api.invite("!r:x", "@u:x").idempotent
    assert not api.upload_media(b"data").idempotent
    assert not api.login_password("u", "p").idempotent
    assert api.login_password("u", "p", device_id="DEV").idempotent
    assert api.redact("!r:x", "$e", "t").idempotent


def test_no_builder_puts_a_token_anywhere() -> None:
    requests = [
        api.sync(since="s1", timeout_ms=30000),
        api.messages("!r:x"),
        api.whoami(),
        api.login_password("@u:x", "secret-pw", device_id="D"),
        api.download_media("x", "media"),
    ]
    for req in requests:
        assert "access_token" not in req.target
        assert all(key != "access_token" for key, _ in req.query)
    login = api.login_password("@u:x", "secret-pw")
    assert "secret-pw" not in repr(login.query) and "secret-pw" not in login.target
    assert not login.authenticated and api.messages("!r:x").authenticated


def test_sync_inline_filter_and_timeline_limit() -> None:
    req = api.sync(since="s5", timeout_ms=30000, timeline_limit=3, full_state=False)
    query = dict(req.query)
    assert query["since"] == "s5"
    assert query["timeout"] == "30000"
    assert query["full_state"] == "false"
    assert json.loads(query["filter"]) == {"room": {"timeline": {"limit": 3}}}
    assert req.long_poll_ms == 30000
    merged = api.sync(filter={"room": {"state": {"lazy_load_members": True}}}, timeline_limit=2)
    assert json.loads(dict(merged.query)["filter"]) == {
        "room": {"state": {"lazy_load_members": True}, "timeline": {"limit": 2}}
    }
    assert dict(api.sync(filter="7").query)["filter"] == "7"
    with pytest.raises(ValueError):
        api.sync(filter="7", timeline_limit=2)


def test_messages_direction_and_filter() -> None:
    req = api.messages("!r:x", dir=Direction.FORWARD, to="t9", filter={"types": ["m.room.message"]})
    query = dict(req.query)
    assert query["dir"] == "f" and query["to"] == "t9"
    assert json.loads(query["filter"]) == {"types": ["m.room.message"]}
    with pytest.raises(ValueError):
        api.messages("!r:x", dir="sideways")


def test_relations_query() -> None:
    req = api.relations("!r:x", "$e", dir="f", from_="r5", limit=20, recurse=True)
    assert req.path == "/_matrix/client/v1/rooms/%21r%3Ax/relations/%24e"
    assert dict(req.query) == {"dir": "f", "from": "r5", "limit": "20", "recurse": "true"}
    with pytest.raises(ValueError):
        api.relations("!r:x", "$e", event_type="m.room.message")


def test_state_paths_with_empty_and_odd_state_keys() -> None:
    assert api.get_state("!r:x", "m.room.name").path == (
        "/_matrix/client/v3/rooms/%21r%3Ax/state/m.room.name/"
    )
    put = api.put_state("!r:x", "m.room.member", {"membership": "join"}, state_key="@u:x")
    assert put.method == "PUT" and put.path.endswith("/state/m.room.member/%40u%3Ax")


def test_other_endpoints() -> None:
    assert api.join("#alias:x", via=["x", "y"]).path == "/_matrix/client/v3/join/%23alias%3Ax"
    assert api.join("#alias:x", via=["x", "y"]).query == (("via", "x"), ("via", "y"))
    assert api.leave("!r:x").path.endswith("/rooms/%21r%3Ax/leave")
    assert api.invite("!r:x", "@u:x").json == {"user_id": "@u:x"}
    assert api.joined_members("!r:x").method == "GET"
    markers = api.set_read_markers("!r:x", fully_read="$a", read="$b")
    assert markers.path.endswith("/read_markers")
    assert markers.json == {"m.fully_read": "$a", "m.read": "$b"}
    receipt = api.send_receipt("!r:x", "$e", thread_id="main")
    assert receipt.path.endswith("/receipt/m.read/%24e") and receipt.json == {"thread_id": "main"}
    assert api.account_data("@u:x", "m.direct").path == (
        "/_matrix/client/v3/user/%40u%3Ax/account_data/m.direct"
    )
    room_data = api.put_account_data("@u:x", "m.tag", {"a": 1}, room_id="!r:x")
    assert room_data.path == "/_matrix/client/v3/user/%40u%3Ax/rooms/%21r%3Ax/account_data/m.tag"
    upload = api.upload_media(b"abc", content_type="text/plain", filename="a b.txt")
    assert upload.path == "/_matrix/media/v3/upload"
    assert upload.query == (("filename", "a b.txt"),) and upload.content == b"abc"
    assert "abc" not in repr(upload)
    assert api.download_media("x.org", "m/1").path == (
        "/_matrix/client/v1/media/download/x.org/m%2F1"
    )
    reg = api.register("bob", "pw")
    assert reg.json is not None and reg.json["auth"] == {"type": "m.login.dummy"}
    assert not reg.authenticated
    assert api.context("!r:x", "$e", limit=4).query == (("limit", "4"),)
    assert api.logout().method == "POST"
    assert api.create_room(name="n", invite=["@b:x"], preset="private_chat").json == {
        "name": "n",
        "preset": "private_chat",
        "invite": ["@b:x"],
    }


def test_request_is_frozen_value() -> None:
    req = api.whoami()
    assert req == Request("GET", "/_matrix/client/v3/account/whoami")
    with pytest.raises(AttributeError):
        req.method = "POST"  # ty: ignore[invalid-assignment]
