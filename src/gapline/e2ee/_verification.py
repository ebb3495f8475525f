"""`Verifications`: interactive key verification (``m.key.verification.*``, ``m.sas.v1``).

Sans-I/O like the rest of the machine: the caller feeds the verification events it
received (`VerificationEvent`: plaintext or Olm-decrypted to-device events, and room
events for verifying another user in a room), calls the person's answers (`accept`,
`confirm`, `mismatch`, `cancel`), calls `expire` now and then, and sends what
`take_outgoing` returns. Each step returns the flow's `VerificationStatus`.

The flow, either side: request → ready → start → accept (with a commitment to the
acceptor's key) → key, key → both people compare the emoji or numbers → MAC, MAC →
done, done. A to-device flow may also begin at the start (matrix-nio does).

Rules that answer the other side (``m.key.verification.cancel``):

- a method, hash, key agreement or MAC we do not speak: ``m.unknown_method``;
- an event out of order, or a start or request naming a device whose keys we do
  not hold (refused and logged; the user's device list is fetched again):
  ``m.unexpected_message``;
- the key not matching the commitment: ``m.mismatched_commitment``;
- the person saying the strings differ: ``m.mismatched_sas``;
- a MAC that does not check, or checks no key we know: ``m.key_mismatch``;
- 10 minutes since the flow began, or 1 minute without an answer while the next
  move is the other side's (by the machine's clock): ``m.timeout``;
- another of the user's devices answering a request first: ``m.accepted`` to the rest.

On success the other device (and, when its MAC covered it, the user's master key)
is marked verified (`VerifiedMarks`), and the status carries the signatures to
upload: our own device signed with our self-signing key, another user's master key
with our user-signing key.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ._account import AccountMachine
from ._cross_signing import CrossSigning
from ._devices import DeviceTracker
from ._sas import (
    HASH,
    KEY_AGREEMENT,
    MAC_METHODS,
    SAS_METHOD,
    SHORT_STRINGS,
    SasKeys,
    ShortString,
    commitment,
    commitment_matches,
    mac_info,
)
from ._verification_types import (
    PREFIX,
    CancelCode,
    VerificationEvent,
    VerificationMessage,
    VerificationState,
    VerificationStatus,
)
from ._verified import VerifiedMarks

__all__ = ["FLOW_TIMEOUT_MS", "STEP_TIMEOUT_MS", "Verifications"]

log = logging.getLogger("gapline.e2ee.verification")

FLOW_TIMEOUT_MS = 10 * 60 * 1000  # a flow (and a request's timestamp) is stale after this
STEP_TIMEOUT_MS = 60 * 1000  # the other side must answer each step within this
_FUTURE_MS = 5 * 60 * 1000  # a request stamped further ahead than this is ignored
_S = VerificationState
_ACTIVE = {_S.REQUESTED, _S.READY, _S.STARTED, _S.ACCEPTED, _S.SHOW_SAS, _S.CONFIRMED}


class _Cancelled(Exception):
    def __init__(self, code: CancelCode, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


@dataclass
class _Flow:
    flow_id: str
    user_id: str
    device_id: str | None
    room_id: str | None
    began_ms: int
    state: VerificationState
    with_request: bool
    we_requested: bool = False
    requested_devices: tuple[str, ...] = ()
    waiting_peer: bool = False
    last_peer_ms: int = 0
    we_started: bool = False
    start_content: dict[str, Any] = field(default_factory=dict)
    sas: SasKeys | None = None
    mac_method: str = ""
    their_commitment: str = ""
    short: ShortString | None = None
    their_mac: dict[str, Any] | None = None
    confirmed: bool = False
    mac_ok: bool = False
    their_done: bool = False
    cancel_code: str | None = None
    cancel_reason: str | None = None
    cancelled_by_us: bool = False
    verified_devices: tuple[str, ...] = ()
    verified_master: str | None = None
    signatures: dict[str, dict[str, Any]] | None = None


class Verifications:
    def __init__(self, account: AccountMachine, devices: DeviceTracker,
                 cross_signing: CrossSigning, marks: VerifiedMarks,
                 clock: Callable[[], int]) -> None:  # fmt: skip
        self._account = account
        self._devices = devices
        self._cross = cross_signing
        self.marks = marks
        self._clock = clock
        self._flows: dict[str, _Flow] = {}
        self._out: list[VerificationMessage] = []

    @property
    def _me(self) -> tuple[str, str]:
        return (self._account.user_id, self._account.device_id)

    # -- what the caller asks ----------------------------------------------------------------

    def flows(self) -> list[VerificationStatus]:
        return [self._status(f) for f in self._flows.values()]

    def status(self, flow_id: str) -> VerificationStatus:
        return self._status(self._flow(flow_id))

    def take_outgoing(self) -> list[VerificationMessage]:
        """The messages to send, in order (each once; send them before the next step)."""
        out, self._out = self._out, []
        return out

    def request(self, user_id: str, device_ids: tuple[str, ...] = ()) -> VerificationStatus:
        """Ask ``user_id``'s devices (all known ones by default) to verify over to-device."""
        if not device_ids:
            device_ids = tuple(
                d.device_id for d in self._devices.devices_of(user_id)
                if (d.user_id, d.device_id) != self._me
            )  # fmt: skip
        if not device_ids:
            raise ValueError(f"no device of {user_id} is known to verify")
        now = self._clock()
        flow = _Flow(uuid.uuid4().hex, user_id, None, None, now, _S.REQUESTED, True,
                     we_requested=True, requested_devices=device_ids)  # fmt: skip
        self._flows[flow.flow_id] = flow
        content = {"from_device": self._me[1], "methods": [SAS_METHOD], "timestamp": now}
        for device_id in device_ids:
            self._send(flow, "request", content, device_id=device_id)
        return self._status(flow)

    def request_in_room(self, room_id: str, user_id: str) -> VerificationMessage:
        """The ``m.room.message`` request to send into a room shared with ``user_id``;
        report the event ID it got with `room_request_sent`."""
        content = {"msgtype": PREFIX + "request", "to": user_id, "from_device": self._me[1],
                   "methods": [SAS_METHOD],
                   "body": f"{self._me[0]} is asking to verify your keys."}  # fmt: skip
        return VerificationMessage("m.room.message", content, room_id=room_id)

    def room_request_sent(self, room_id: str, user_id: str, event_id: str) -> VerificationStatus:
        flow = _Flow(event_id, user_id, None, room_id, self._clock(), _S.REQUESTED, True,
                     we_requested=True)  # fmt: skip
        self._flows[event_id] = flow
        return self._status(flow)

    def start_sas(self, flow_id: str | None = None, *, user_id: str | None = None,
                  device_id: str | None = None) -> VerificationStatus:  # fmt: skip
        """Send the SAS start: in a ready flow, or straight to one device (no request)."""
        if flow_id is None:
            if (
                user_id is None
                or device_id is None
                or self._devices.get(user_id, device_id) is None
            ):
                raise ValueError("start_sas needs a flow or a known (user, device)")
            flow = _Flow(uuid.uuid4().hex, user_id, device_id, None, self._clock(), _S.READY,
                         False)  # fmt: skip
            self._flows[flow.flow_id] = flow
        else:
            flow = self._flow(flow_id)
        if flow.state is not _S.READY:
            raise ValueError(f"flow {flow.flow_id} is {flow.state}, not ready")
        flow.we_started = True
        flow.sas = SasKeys()
        content = {"from_device": self._me[1], "method": SAS_METHOD,
                   "key_agreement_protocols": [KEY_AGREEMENT], "hashes": [HASH],
                   "message_authentication_codes": list(MAC_METHODS),
                   "short_authentication_string": list(SHORT_STRINGS)}  # fmt: skip
        flow.start_content = self._send(flow, "start", content)
        self._move(flow, _S.STARTED, waiting_peer=True)
        return self._status(flow)

    def accept(self, flow_id: str) -> VerificationStatus:
        """The person agreed: answer a received request (ready) or start (accept)."""
        flow = self._flow(flow_id)
        try:
            if flow.state is _S.REQUESTED and not flow.we_requested:
                self._send(flow, "ready", {"from_device": self._me[1], "methods": [SAS_METHOD]})
                self._move(flow, _S.READY, waiting_peer=True)
            elif flow.state is _S.STARTED and not flow.we_started:
                self._send_accept(flow)
            else:
                raise ValueError(f"flow {flow_id} has nothing to accept ({flow.state})")
        except _Cancelled as c:
            self._cancel(flow, c.code, c.reason)
        return self._status(flow)

    def confirm(self, flow_id: str) -> VerificationStatus:
        """The person said both screens show the same: send our MAC, check theirs."""
        flow = self._flow(flow_id)
        if flow.state is not _S.SHOW_SAS:
            raise ValueError(f"flow {flow_id} shows no short string ({flow.state})")
        flow.confirmed = True
        self._send_mac(flow)
        self._move(flow, _S.CONFIRMED, waiting_peer=True)
        try:
            if flow.their_mac is not None:
                self._check_mac(flow)
        except _Cancelled as c:
            self._cancel(flow, c.code, c.reason)
        return self._status(flow)

    def mismatch(self, flow_id: str) -> VerificationStatus:
        """The person said the strings differ."""
        flow = self._flow(flow_id)
        self._cancel(flow, CancelCode.MISMATCHED_SAS, "the short authentication strings differ")
        return self._status(flow)

    def cancel(self, flow_id: str, reason: str = "cancelled by the user") -> VerificationStatus:
        flow = self._flow(flow_id)
        if flow.state in _ACTIVE:
            self._cancel(flow, CancelCode.USER, reason)
        return self._status(flow)

    def expire(self) -> list[VerificationStatus]:
        """Cancel (``m.timeout``) the flows past the 10-minute or 1-minute rule.

        Ended flows are kept for a status and for late events for 10 minutes more, then
        forgotten (any flow has ended 10 minutes after it began)."""
        now = self._clock()
        for flow_id in [f.flow_id for f in self._flows.values()
                        if now - f.began_ms >= 2 * FLOW_TIMEOUT_MS]:  # fmt: skip
            del self._flows[flow_id]
        out = []
        for flow in self._flows.values():
            if flow.state not in _ACTIVE:
                continue
            if now - flow.began_ms >= FLOW_TIMEOUT_MS:
                why = "the verification did not complete within 10 minutes"
            elif flow.waiting_peer and now - flow.last_peer_ms >= STEP_TIMEOUT_MS:
                why = "the other side did not answer within a minute"
            else:
                continue
            self._cancel(flow, CancelCode.TIMEOUT, why)
            out.append(self._status(flow))
        return out

    # -- what arrived -------------------------------------------------------------------------

    def receive(self, event: VerificationEvent) -> VerificationStatus | None:
        """One received event; the flow's status, or None for an event ignored (logged)."""
        if not event.is_verification:
            return None
        kind = "request" if event.type == "m.room.message" else event.type[len(PREFIX) :]
        if event.room_id is not None:
            if event.sender == self._me[0]:
                return None  # our own echo, or one of our devices talking to someone else
            rel = event.content.get("m.relates_to")
            flow_id = event.event_id if kind == "request" else (
                rel.get("event_id") if isinstance(rel, dict) else None)  # fmt: skip
        else:
            flow_id = event.content.get("transaction_id")
        if not isinstance(flow_id, str) or not flow_id:
            log.warning("verification %s from %s without a flow ID: ignored", kind, event.sender)
            return None
        flow = self._flows.get(flow_id)
        if flow is None:
            return self._new_flow(kind, flow_id, event)
        if event.sender != flow.user_id or (event.room_id or None) != flow.room_id:
            log.warning("verification %s for %s from %s, not %s: ignored", kind, flow_id,
                        event.sender, flow.user_id)  # fmt: skip
            return None
        if flow.state not in _ACTIVE:
            return self._status(flow)
        if kind == "cancel":
            flow.state = _S.CANCELLED
            flow.cancel_code = str(event.content.get("code") or CancelCode.USER)
            flow.cancel_reason = str(event.content.get("reason") or "")
            log.info("verification %s cancelled by %s: %s %s", flow_id, event.sender,
                     flow.cancel_code, flow.cancel_reason)  # fmt: skip
            return self._status(flow)
        flow.last_peer_ms = self._clock()
        try:
            self._step(flow, kind, event)
        except _Cancelled as c:
            self._cancel(flow, c.code, c.reason)
        return self._status(flow)

    def _new_flow(
        self, kind: str, flow_id: str, event: VerificationEvent
    ) -> VerificationStatus | None:
        if kind not in ("request", "start") or (kind == "start" and event.room_id is not None):
            log.info("verification %s for unknown flow %s from %s: ignored", kind, flow_id,
                     event.sender)  # fmt: skip
            return None
        device_id = event.content.get("from_device")
        now = self._clock()
        if kind == "request":
            if event.room_id is not None and event.content.get("to") != self._me[0]:
                return None  # a request in a shared room for someone else
            ts = (
                event.origin_server_ts
                if event.room_id is not None
                else event.content.get("timestamp")
            )
            if not isinstance(ts, int) or now - ts > FLOW_TIMEOUT_MS or ts - now > _FUTURE_MS:
                log.info("verification request %s from %s stamped %s: stale, ignored", flow_id,
                         event.sender, ts)  # fmt: skip
                return None
        flow = _Flow(flow_id, event.sender, device_id if isinstance(device_id, str) else None,
                     event.room_id, now, _S.REQUESTED if kind == "request" else _S.STARTED,
                     kind == "request", last_peer_ms=now)  # fmt: skip
        self._flows[flow_id] = flow
        try:
            self._known_device(flow, device_id)
            if kind == "request":
                methods = event.content.get("methods")
                if not isinstance(methods, list) or SAS_METHOD not in methods:
                    raise _Cancelled(CancelCode.UNKNOWN_METHOD, "only m.sas.v1 is supported")
            else:
                self._receive_start(flow, event.content)
        except _Cancelled as c:
            self._cancel(flow, c.code, c.reason)
        return self._status(flow)

    def _known_device(self, flow: _Flow, device_id: object) -> None:
        if not isinstance(device_id, str) or self._devices.get(flow.user_id, device_id) is None:
            # Refused: a device we hold no keys for cannot be verified. Fetch its owner's
            # device list again, so a retry after the next key query can succeed.
            log.warning("verification %s refused: unknown device %s of %s", flow.flow_id,
                        device_id, flow.user_id)  # fmt: skip
            self._devices.mark_changed([flow.user_id])
            if isinstance(device_id, str) and flow.device_id is None:
                flow.device_id = device_id
            raise _Cancelled(CancelCode.UNEXPECTED_MESSAGE,
                             f"unknown device {device_id}: its keys are not known")  # fmt: skip

    def _step(self, flow: _Flow, kind: str, event: VerificationEvent) -> None:
        c = event.content
        if kind == "ready" and flow.state is _S.REQUESTED and flow.we_requested:
            device_id = c.get("from_device")
            methods = c.get("methods")
            if flow.room_id is None and device_id not in flow.requested_devices:
                raise _Cancelled(CancelCode.UNEXPECTED_MESSAGE, "ready from a device not asked")
            self._known_device(flow, device_id)
            assert isinstance(device_id, str)
            flow.device_id = device_id
            for other in flow.requested_devices:  # the others need not answer any more
                if other != device_id:
                    self._send(flow, "cancel", {"code": CancelCode.ACCEPTED.value,
                               "reason": "another device answered"}, device_id=other)  # fmt: skip
            if not isinstance(methods, list) or SAS_METHOD not in methods:
                raise _Cancelled(CancelCode.UNKNOWN_METHOD, "only m.sas.v1 is supported")
            self._move(flow, _S.READY, waiting_peer=False)
        elif kind == "start" and flow.state is _S.READY and not flow.we_started:
            self._known_device(flow, c.get("from_device"))
            if c.get("from_device") != flow.device_id:
                raise _Cancelled(CancelCode.UNEXPECTED_MESSAGE, "start from another device")
            self._receive_start(flow, c)
            self._send_accept(flow)  # the person already agreed with the request
        elif kind == "start" and flow.state is _S.STARTED and flow.we_started:
            # Both sides started: the spec keeps the start of the lexicographically
            # smaller (user ID, device ID).
            theirs = (flow.user_id, str(c.get("from_device")))
            if theirs < self._me:
                flow.we_started = False
                flow.sas = None
                self._receive_start(flow, c)
                self._send_accept(flow)
        elif kind == "accept" and flow.state is _S.STARTED and flow.we_started:
            self._receive_accept(flow, c)
            assert flow.sas is not None
            self._send(flow, "key", {"key": flow.sas.public_key})
            self._move(flow, _S.ACCEPTED, waiting_peer=True)
        elif kind == "key" and flow.state is _S.ACCEPTED and flow.sas is not None:
            self._receive_key(flow, c)
        elif kind == "mac" and flow.state in (_S.SHOW_SAS, _S.CONFIRMED) and flow.their_mac is None:
            flow.their_mac = c
            if flow.confirmed:
                self._check_mac(flow)
        elif kind == "done" and flow.state is _S.CONFIRMED and flow.with_request:
            flow.their_done = True
            if flow.mac_ok:
                self._move(flow, _S.DONE, waiting_peer=False)
        else:
            raise _Cancelled(CancelCode.UNEXPECTED_MESSAGE, f"unexpected {kind} in {flow.state}")

    # -- the SAS steps ------------------------------------------------------------------------

    def _receive_start(self, flow: _Flow, c: dict[str, Any]) -> None:
        def offered(name: str) -> list[Any]:
            value = c.get(name)
            return value if isinstance(value, list) else []

        macs = [m for m in MAC_METHODS if m in offered("message_authentication_codes")]
        if (c.get("method") != SAS_METHOD or KEY_AGREEMENT not in offered("key_agreement_protocols")
                or HASH not in offered("hashes") or not macs
                or not set(SHORT_STRINGS) & set(offered("short_authentication_string"))):  # fmt: skip
            raise _Cancelled(CancelCode.UNKNOWN_METHOD, "no common SAS method")
        flow.start_content = dict(c)
        flow.mac_method = macs[0]
        flow.state = _S.STARTED

    def _send_accept(self, flow: _Flow) -> None:
        flow.sas = SasKeys()
        content = {"method": SAS_METHOD, "key_agreement_protocol": KEY_AGREEMENT,
                   "hash": HASH, "message_authentication_code": flow.mac_method,
                   "short_authentication_string": list(SHORT_STRINGS),
                   "commitment": commitment(flow.sas.public_key, flow.start_content)}  # fmt: skip
        self._send(flow, "accept", content)
        self._move(flow, _S.ACCEPTED, waiting_peer=True)

    def _receive_accept(self, flow: _Flow, c: dict[str, Any]) -> None:
        mac = c.get("message_authentication_code")
        if (c.get("key_agreement_protocol") != KEY_AGREEMENT or c.get("hash") != HASH
                or mac not in MAC_METHODS or not isinstance(c.get("commitment"), str)):  # fmt: skip
            raise _Cancelled(CancelCode.UNKNOWN_METHOD, "the accept names a method not offered")
        flow.mac_method = str(mac)
        flow.their_commitment = str(c["commitment"])

    def _receive_key(self, flow: _Flow, c: dict[str, Any]) -> None:
        assert flow.sas is not None
        key = c.get("key")
        if not isinstance(key, str):
            raise _Cancelled(CancelCode.INVALID_MESSAGE, "the key event has no key")
        if flow.we_started and not commitment_matches(
            flow.their_commitment, key, flow.start_content
        ):
            raise _Cancelled(
                CancelCode.MISMATCHED_COMMITMENT, "the key does not match the commitment"
            )
        try:
            flow.sas.agree(key)
        except ValueError as exc:
            raise _Cancelled(CancelCode.INVALID_MESSAGE, str(exc)) from None
        if not flow.we_started:
            self._send(flow, "key", {"key": flow.sas.public_key})
        assert flow.device_id is not None
        mine = (*self._me, flow.sas.public_key)
        theirs = (flow.user_id, flow.device_id, key)
        starter, acceptor = (mine, theirs) if flow.we_started else (theirs, mine)
        flow.short = flow.sas.short_string(starter, acceptor, flow.flow_id)
        self._move(flow, _S.SHOW_SAS, waiting_peer=False)

    def _send_mac(self, flow: _Flow) -> None:
        assert flow.sas is not None and flow.device_id is not None
        info = mac_info(self._me, (flow.user_id, flow.device_id), flow.flow_id)
        keys = {f"ed25519:{self._me[1]}": self._account.ed25519}
        master = self._cross.trusted_master_key()
        if master is not None:
            keys[f"ed25519:{master}"] = master
        method = flow.mac_method
        macs = {kid: flow.sas.mac(method, key, info + kid) for kid, key in keys.items()}
        key_ids = flow.sas.mac(method, ",".join(sorted(keys)), info + "KEY_IDS")
        self._send(flow, "mac", {"mac": macs, "keys": key_ids})

    def _check_mac(self, flow: _Flow) -> None:
        assert flow.sas is not None and flow.device_id is not None and flow.their_mac is not None
        c = flow.their_mac
        macs, key_ids = c.get("mac"), c.get("keys")
        if not isinstance(macs, dict) or not isinstance(key_ids, str):
            raise _Cancelled(CancelCode.INVALID_MESSAGE, "the MAC event is malformed")
        info = mac_info((flow.user_id, flow.device_id), self._me, flow.flow_id)
        method = flow.mac_method
        if not flow.sas.mac_matches(method, ",".join(sorted(macs)), info + "KEY_IDS", key_ids):
            raise _Cancelled(CancelCode.KEY_MISMATCH, "the MAC of the key list does not match")
        device = self._devices.get(flow.user_id, flow.device_id)
        listed = self._cross_master(flow.user_id)
        device_ok, master_ok = False, None
        for kid, tag in sorted(macs.items()):
            if kid == f"ed25519:{flow.device_id}" and device is not None:
                expected = device.ed25519
            elif listed is not None and kid == f"ed25519:{listed}":
                expected = listed
            else:
                log.info("verification %s: MAC for unknown key %s skipped", flow.flow_id, kid)
                continue
            if not isinstance(tag, str) or not flow.sas.mac_matches(
                method, expected, info + kid, tag
            ):
                raise _Cancelled(CancelCode.KEY_MISMATCH, f"the MAC of {kid} does not match")
            if expected == listed:
                master_ok = listed
            else:
                device_ok = True
        if not device_ok and master_ok is None:
            raise _Cancelled(CancelCode.KEY_MISMATCH, "the MAC covers no key we know")
        flow.mac_ok = True
        self._apply(flow, device_ok, master_ok)
        if flow.with_request:
            self._send(flow, "done", {})
            if flow.their_done:
                self._move(flow, _S.DONE, waiting_peer=False)
        else:
            self._move(flow, _S.DONE, waiting_peer=False)

    def _cross_master(self, user_id: str) -> str | None:
        keys = self._devices.cross_signing_keys(user_id).get("master")
        found = keys.get("keys") if isinstance(keys, dict) else None
        if not isinstance(found, dict) or len(found) != 1:
            return None
        (value,) = found.values()
        return value if isinstance(value, str) else None

    def _apply(self, flow: _Flow, device_ok: bool, master: str | None) -> None:
        assert flow.device_id is not None
        if device_ok:
            device = self._devices.get(flow.user_id, flow.device_id)
            assert device is not None
            self.marks.mark_device(flow.user_id, flow.device_id, device.ed25519)
            flow.verified_devices = (flow.device_id,)
        if master is not None:
            self.marks.mark_master(flow.user_id, master)
            flow.verified_master = master
        if flow.user_id == self._me[0]:
            flow.signatures = self._cross.sign_device(flow.device_id) if device_ok else None
        elif master is not None:
            flow.signatures = self._cross.sign_user(flow.user_id)
        log.info("verification %s: %s %s verified (master key %s)", flow.flow_id, flow.user_id,
                 flow.verified_devices, master)  # fmt: skip

    # -- plumbing ----------------------------------------------------------------------------

    def _flow(self, flow_id: str) -> _Flow:
        flow = self._flows.get(flow_id)
        if flow is None:
            raise KeyError(f"no verification flow {flow_id}")
        return flow

    def _move(self, flow: _Flow, state: VerificationState, *, waiting_peer: bool) -> None:
        flow.state = state
        flow.waiting_peer = waiting_peer
        if waiting_peer:
            flow.last_peer_ms = self._clock()

    def _cancel(self, flow: _Flow, code: CancelCode, reason: str) -> None:
        log.info("verification %s with %s cancelled: %s %s", flow.flow_id, flow.user_id,
                 code, reason)  # fmt: skip
        content = {"code": code.value, "reason": reason}
        if flow.device_id is None and flow.room_id is None:
            for device_id in flow.requested_devices:
                self._send(flow, "cancel", content, device_id=device_id)
        elif flow.device_id is not None or flow.room_id is not None:
            self._send(flow, "cancel", content)
        flow.state = _S.CANCELLED
        flow.cancel_code, flow.cancel_reason, flow.cancelled_by_us = code.value, reason, True

    def _send(self, flow: _Flow, kind: str, content: dict[str, Any],
              device_id: str | None = None) -> dict[str, Any]:  # fmt: skip
        body = dict(content)
        if flow.room_id is not None:
            body["m.relates_to"] = {"rel_type": "m.reference", "event_id": flow.flow_id}
            msg = VerificationMessage(PREFIX + kind, body, room_id=flow.room_id,
                                      flow_id=flow.flow_id)  # fmt: skip
        else:
            body["transaction_id"] = flow.flow_id
            target = device_id or flow.device_id
            msg = VerificationMessage(PREFIX + kind, body, flow.user_id, target,
                                      flow_id=flow.flow_id)  # fmt: skip
        self._out.append(msg)
        return body

    def _status(self, flow: _Flow) -> VerificationStatus:
        return VerificationStatus(
            flow.flow_id, flow.user_id, flow.device_id, flow.room_id, flow.state,
            flow.we_started, flow.short, flow.cancel_code, flow.cancel_reason,
            flow.cancelled_by_us, flow.verified_devices, flow.verified_master, flow.signatures,
        )  # fmt: skip
