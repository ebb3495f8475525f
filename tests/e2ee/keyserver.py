"""A homeserver's key endpoints in memory, answering `gapline.matrix` request values.

Tests put two or three `CryptoMachine`s in front of it: every request a machine
builds is answered here from the recorded state (uploaded keys, one-time keys,
to-device inboxes), and every answer goes through the same msgspec parsing as a
real one. Behaviour follows Synapse where the spec leaves room: a one-time key is
handed out once, then the fallback key (marked ``fallback``, reusable); a
repeated sendToDevice transaction ID is delivered once; uploading device keys
for a device notifies every device of a user sharing... here, simply every
registered device (``device_lists.changed``).

Fault knobs: ``edit_query`` / ``edit_claim`` rewrite an answer before it is
parsed; ``hold_to_device`` keeps to-device messages back until released.
"""

from __future__ import annotations

import copy
import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import httpx
import msgspec

from gapline.matrix import Request, SyncResponse, parse

Answer = dict[str, Any]


@dataclass
class KeyServer:
    device_keys: dict[str, dict[str, Answer]] = field(default_factory=dict)
    one_time_keys: dict[tuple[str, str], dict[str, Answer]] = field(default_factory=dict)
    fallback_keys: dict[tuple[str, str], tuple[str, Answer, bool]] = field(default_factory=dict)
    master_keys: dict[str, Answer] = field(default_factory=dict)
    self_signing_keys: dict[str, Answer] = field(default_factory=dict)
    inbox: dict[tuple[str, str], list[Answer]] = field(default_factory=dict)
    changed: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    txns: set[tuple[str, str, str]] = field(default_factory=set)
    requests: list[tuple[tuple[str, str], Request]] = field(default_factory=list)
    edit_query: Callable[[Answer], Answer] | None = None
    edit_claim: Callable[[Answer], Answer] | None = None
    hold_to_device: bool = False
    held: list[tuple[tuple[str, str], Answer]] = field(default_factory=list)
    _batch: itertools.count = field(default_factory=itertools.count)

    def register(self, user_id: str, device_id: str) -> None:
        self.inbox.setdefault((user_id, device_id), [])
        self.changed.setdefault((user_id, device_id), [])

    def remove_device(self, user_id: str, device_id: str) -> None:
        self.device_keys.get(user_id, {}).pop(device_id, None)
        self._notify(user_id)

    def _notify(self, user_id: str) -> None:
        for observer in self.changed:
            self.changed[observer].append(user_id)

    # -- the endpoints -----------------------------------------------------------------------

    def handle(self, sender: tuple[str, str], request: Request, response_type: type) -> Any:
        self.requests.append((sender, request))
        answer = self._answer(sender, request.path, copy.deepcopy(request.json))
        return parse(msgspec.json.encode(answer), response_type)

    def transport(self, sender: tuple[str, str]) -> httpx.MockTransport:
        """The same endpoints over HTTP, for a `MatrixClient` logged in as ``sender``."""

        def handler(request: httpx.Request) -> httpx.Response:
            body = json.loads(request.content) if request.content else None
            return httpx.Response(
                200, json=self._answer(sender, request.url.raw_path.decode(), body)
            )

        return httpx.MockTransport(handler)

    def _answer(self, sender: tuple[str, str], raw_path: str, body: Any) -> Answer:
        path = raw_path.removeprefix("/_matrix/client/v3/")
        if path == "keys/upload":
            answer = self._upload(sender, body)
        elif path == "keys/query":
            answer = self._query(sender, body)
            if self.edit_query is not None:
                answer = self.edit_query(answer)
        elif path == "keys/claim":
            answer = self._claim(body)
            if self.edit_claim is not None:
                answer = self.edit_claim(answer)
        elif path.startswith("sendToDevice/"):
            _, event_type, txn = (unquote(p) for p in path.split("/"))
            answer = self._send_to_device(sender, event_type, txn, body)
        else:
            raise AssertionError(f"the key server does not serve {raw_path}")
        return answer

    def _upload(self, sender: tuple[str, str], body: Answer) -> Answer:
        user, device = sender
        if "device_keys" in body:
            self.device_keys.setdefault(user, {})[device] = body["device_keys"]
            self._notify(user)
        stock = self.one_time_keys.setdefault(sender, {})
        for key_id, key in body.get("one_time_keys", {}).items():
            if key_id in stock and stock[key_id] != key:
                raise AssertionError(f"one-time key {key_id} uploaded twice with different keys")
            stock[key_id] = key
        for key_id, key in body.get("fallback_keys", {}).items():
            self.fallback_keys[sender] = (key_id, key, False)
        return {"one_time_key_counts": {"signed_curve25519": len(stock)}}

    def _query(self, sender: tuple[str, str], body: Answer) -> Answer:
        answer: Answer = {
            "device_keys": {},
            "master_keys": {},
            "self_signing_keys": {},
            "failures": {},
        }
        for user in body["device_keys"]:
            answer["device_keys"][user] = copy.deepcopy(self.device_keys.get(user, {}))
            if user in self.master_keys:
                answer["master_keys"][user] = copy.deepcopy(self.master_keys[user])
            if user in self.self_signing_keys:
                answer["self_signing_keys"][user] = copy.deepcopy(self.self_signing_keys[user])
        return answer

    def _claim(self, body: Answer) -> Answer:
        answer: Answer = {"one_time_keys": {}, "failures": {}}
        for user, devices in body["one_time_keys"].items():
            for device in devices:
                stock = self.one_time_keys.get((user, device), {})
                if stock:
                    key_id = min(stock)
                    claimed = {key_id: stock.pop(key_id)}
                elif (user, device) in self.fallback_keys:
                    key_id, key, _ = self.fallback_keys[(user, device)]
                    self.fallback_keys[(user, device)] = (key_id, key, True)
                    claimed = {key_id: key}
                else:
                    continue
                answer["one_time_keys"].setdefault(user, {})[device] = claimed
        return answer

    def _send_to_device(
        self, sender: tuple[str, str], event_type: str, txn: str, body: Answer
    ) -> Answer:
        if (*sender, txn) in self.txns:
            return {}
        self.txns.add((*sender, txn))
        for user, devices in body["messages"].items():
            for device, content in devices.items():
                targets = list(self.device_keys.get(user, {})) if device == "*" else [device]
                for target in targets:
                    event = {"sender": sender[0], "type": event_type, "content": content}
                    if self.hold_to_device:
                        self.held.append(((user, target), event))
                    else:
                        self.inbox.setdefault((user, target), []).append(event)
        return {}

    def release_to_device(self) -> None:
        for target, event in self.held:
            self.inbox.setdefault(target, []).append(event)
        self.held.clear()

    def sync(self, user_id: str, device_id: str) -> SyncResponse:
        me = (user_id, device_id)
        events, self.inbox[me] = self.inbox.get(me, []), []
        changed, self.changed[me] = sorted(set(self.changed.get(me, []))), []
        fallback = self.fallback_keys.get(me)
        body = {
            "next_batch": f"s{next(self._batch)}",
            "to_device": {"events": events},
            "device_lists": {"changed": changed, "left": []},
            "device_one_time_keys_count": {
                "signed_curve25519": len(self.one_time_keys.get(me, {}))
            },
            "device_unused_fallback_key_types": ["signed_curve25519"]
            if fallback and not fallback[2]
            else [],
        }
        return parse(json.dumps(body).encode(), SyncResponse)
