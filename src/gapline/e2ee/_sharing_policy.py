"""`SharingPolicy`: whether trust decides who gets our room keys and whose events count.

``ALL_DEVICES`` (the default, as Element does): every device of every member gets
the room key, and events decrypt whatever their sender's trust (`DecryptedEvent.trust`
says it). ``TRUSTED_ONLY``: only devices that are verified (interactively, or
cross-signed under a master key we trust) or cross-signed by their owner get the
key (a device that loses that standing rotates the session, as a removed device
does), and an event from any other device comes out as `UnableToDecrypt` with
reason ``Untrusted`` (refusal ``UNVERIFIED_DEVICE``). Such an event is decrypted
again, like any retained event, once its device is verified.
"""

from __future__ import annotations

import enum

from ._types import DecryptedEvent, Device, RefusalCode, TrustLevel, UnableToDecrypt, UtdReason

__all__ = ["TRUSTED_LEVELS", "SharingPolicy", "apply_policy"]

TRUSTED_LEVELS = frozenset({TrustLevel.OWN, TrustLevel.VERIFIED, TrustLevel.CROSS_SIGNED})


class SharingPolicy(enum.StrEnum):
    ALL_DEVICES = "all_devices"
    TRUSTED_ONLY = "trusted_only"

    def may_receive(self, device: Device) -> bool:
        return self is SharingPolicy.ALL_DEVICES or device.trust in TRUSTED_LEVELS


def apply_policy(
    policy: SharingPolicy, result: DecryptedEvent | UnableToDecrypt
) -> DecryptedEvent | UnableToDecrypt:
    """``result``, or an ``Untrusted`` UTD when the policy requires a trusted sender."""
    if (
        policy is SharingPolicy.ALL_DEVICES
        or not isinstance(result, DecryptedEvent)
        or result.trust in TRUSTED_LEVELS
    ):
        return result
    return UnableToDecrypt(
        result.event_id,
        result.room_id,
        result.session_id,
        UtdReason.UNTRUSTED,
        f"sent by {result.sender} {result.sender_device}, a device that is {result.trust}",
        refusal=RefusalCode.UNVERIFIED_DEVICE,
    )
