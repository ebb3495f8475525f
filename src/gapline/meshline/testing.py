"""Test support: ready-made accounts, devices, certificates and send params.

Used by gapline's own tests, the relay's tests and the benchmarks. Keys are
random unless seeded; every object is produced through the public signing
paths, so what it makes is exactly what a real client would send.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gapline.meshline._canonical import NetworkContext
from gapline.meshline._certificates import (
    AccountDeviceState,
    DeviceCertificate,
    issue_certificate,
    sign_device_state,
)
from gapline.meshline._identity import AccountKey, DeviceKeys
from gapline.meshline._sealing import BoxTarget, SendParams, seal_message
from gapline.meshline._timeline import LocalDevice, SyncPage, TimelineEntry

__all__ = [
    "TEST_CONTEXT",
    "TestAccount",
    "TestDevice",
    "local_device",
    "make_account",
    "make_send_params",
    "sync_page",
    "timeline_entry",
]

#: A format-valid local network context (zero registry hash), as the relay's dev default might be.
TEST_CONTEXT = NetworkContext("neo:860833102:0x0000000000000000000000000000000000000000")


@dataclass(frozen=True, slots=True)
class TestDevice:
    __test__ = False  # not a pytest test class

    keys: DeviceKeys
    certificate: DeviceCertificate
    device_id: str

    @property
    def target(self) -> BoxTarget:
        return BoxTarget(self.device_id, self.keys.encryption_public_key)


@dataclass(frozen=True, slots=True)
class TestAccount:
    context: NetworkContext
    key: AccountKey
    account: str
    devices: tuple[TestDevice, ...]
    state: AccountDeviceState

    __test__ = False  # not a pytest test class

    def device(self, index: int = 0) -> TestDevice:
        return self.devices[index]

    def new_state(self, devices: Sequence[TestDevice], *, revision: int) -> AccountDeviceState:
        """A signed device state listing ``devices`` (e.g. after adding or removing one)."""
        return sign_device_state(
            self.key, [d.certificate for d in devices], self.context, revision=revision
        )

    def add_device(
        self, *, not_before: int | None = None, lifetime: int = 30 * 86400
    ) -> TestDevice:
        """Issue a certificate for a fresh device (not yet in ``state``)."""
        return _make_device(self.key, self.context, not_before, lifetime)


def _make_device(
    key: AccountKey, context: NetworkContext, not_before: int | None, lifetime: int
) -> TestDevice:
    keys = DeviceKeys.generate()
    start = int(time.time()) - 60 if not_before is None else not_before
    cert = issue_certificate(key, keys, context, not_before=start, expires_at=start + lifetime)
    return TestDevice(keys, cert, cert.device_id(context))


def make_account(
    devices: int = 1,
    *,
    context: NetworkContext = TEST_CONTEXT,
    not_before: int | None = None,
    lifetime: int = 30 * 86400,
    revision: int | None = None,
    key: AccountKey | None = None,
) -> TestAccount:
    """An account with ``devices`` certified devices and a signed device state."""
    key = AccountKey.generate() if key is None else key
    made = tuple(_make_device(key, context, not_before, lifetime) for _ in range(devices))
    state = sign_device_state(
        key,
        [d.certificate for d in made],
        context,
        revision=int(time.time() * 1000) if revision is None else revision,
    )
    return TestAccount(context, key, key.account_id(context), made, state)


def make_send_params(
    sender: TestAccount,
    recipient: TestAccount,
    *,
    text: str = "hello",
    content: Mapping[str, Any] | None = None,
    device: int = 0,
    sender_boxes: bool = True,
    created_at: int | None = None,
    message_id: str | None = None,
    recipient_devices: Sequence[TestDevice] | None = None,
    sender_devices: Sequence[TestDevice] | None = None,
) -> SendParams:
    """Valid ``message.send`` params from ``sender``'s device to ``recipient``.

    Recipient boxes go to every recipient device; sender boxes (unless
    disabled, and never for self-delivery) to every sender device.
    """
    dev = sender.devices[device]
    body = content or {
        "$type": "meshline.message.direct",
        "body": {"content_type": "text/plain", "text": text},
    }
    self_delivery = sender.account == recipient.account
    senders = None
    if sender_boxes and not self_delivery:
        senders = [d.target for d in (sender_devices or sender.devices)]
    return seal_message(
        body,
        device_keys=dev.keys,
        from_=sender.account,
        from_device_id=dev.device_id,
        to=recipient.account,
        recipients=[d.target for d in (recipient_devices or recipient.devices)],
        senders=senders,
        context=sender.context,
        created_at=created_at,
        message_id=message_id,
    )


def local_device(account: TestAccount, index: int = 0) -> LocalDevice:
    """The processing-flow identity of one of ``account``'s devices."""
    dev = account.devices[index]
    return LocalDevice(account.context, account.account, dev.device_id, dev.keys.encryption_key)


def timeline_entry(
    params: SendParams, device_id: str, sequence: int, *, accepted_at: int | None = None
) -> TimelineEntry:
    """The record a relay returns to ``device_id``: the envelope plus that device's box
    (recipient boxes first, then sender boxes)."""
    boxes = [*params.recipient_boxes, *(params.sender_boxes or ())]
    box = next(b for b in boxes if b.device_id == device_id)
    return TimelineEntry(
        sequence=sequence,
        envelope=params.envelope,
        key_box=box,
        accepted_at=int(time.time()) if accepted_at is None else accepted_at,
    )


def sync_page(
    entries: Sequence[TimelineEntry],
    certificates: Sequence[DeviceCertificate],
    *,
    has_more: bool = False,
    has_retention_gap: bool = False,
) -> SyncPage:
    """A page with exactly the given certificates (deduplicate them yourself to craft faults)."""
    return SyncPage(tuple(entries), tuple(certificates), has_more, has_retention_gap)
