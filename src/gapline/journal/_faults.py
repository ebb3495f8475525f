"""Crash points for the crash-matrix tests: a test hook, not a feature.

Setting ``GAPLINE_FAULT=<boundary>`` in a bot's environment makes the process
``SIGKILL`` itself the first time it reaches that boundary. SIGKILL, not an
exception: nothing after the boundary may run — no ``finally``, no flush — so
the restart sees exactly what a power cut would leave. The boundaries are the
durable steps of one answer, in order:

``after_admission_before_dispatch``
    the message is committed to the journal; the handler has not run.
``after_handler_result_before_enqueue``
    the handler's final text is durable in the turn store; nothing is enqueued.
``after_enqueue_before_claim``
    the final delivery is in the outbox and the source is settled.
``after_claim_before_send``
    the delivery row is ``attempted`` (payload and txn id frozen); nothing sent.
``after_send_before_acknowledgement``
    the homeserver has the final edit; the outbox does not know it yet.
``after_acknowledgement``
    acknowledgement and the terminal turn record are committed.

The delivery boundaries (claim, send, acknowledgement) fire for the FINAL
stage by default; ``<boundary>@initial`` moves them to the INITIAL placeholder.

An approval has one boundary of its own (:class:`ApprovalFaultPoint`):

``after_approval_decision_before_continuation``
    an answer's decision, the card's resolution edit and the answer's settlement are
    committed; the waiting turn has not resumed and nothing of it is delivered.

End-to-end encryption has three (:class:`CryptoFaultPoint`):

``after_to_device_before_commit``
    a sync that carried to-device events was processed: Olm sessions advanced and
    room keys received in memory, its timeline admitted (decrypted) and retained
    failures upgraded; the crypto state and the sync token are not committed.
``after_key_share_before_to_device``
    a new room key's Olm-encrypted to-device messages are committed (queued); none
    has been sent.
``after_seal_before_send``
    an answer's ciphertext and the Megolm step that made it are committed in its
    outbox row; the event has not been sent.

With ``GAPLINE_FAULT_ONCE=<path>`` the fault fires only if ``path`` does not
exist yet (it is created just before the kill), so one environment can be
reused across a restart.
"""

from __future__ import annotations

import enum
import os
import signal

__all__ = [
    "FAULT_ENV",
    "FAULT_ONCE_ENV",
    "ApprovalFaultPoint",
    "CryptoFaultPoint",
    "FaultPoint",
    "fault_point",
]

FAULT_ENV = "GAPLINE_FAULT"
FAULT_ONCE_ENV = "GAPLINE_FAULT_ONCE"


class FaultPoint(enum.StrEnum):
    AFTER_ADMISSION_BEFORE_DISPATCH = "after_admission_before_dispatch"
    AFTER_HANDLER_RESULT_BEFORE_ENQUEUE = "after_handler_result_before_enqueue"
    AFTER_ENQUEUE_BEFORE_CLAIM = "after_enqueue_before_claim"
    AFTER_CLAIM_BEFORE_SEND = "after_claim_before_send"
    AFTER_SEND_BEFORE_ACKNOWLEDGEMENT = "after_send_before_acknowledgement"
    AFTER_ACKNOWLEDGEMENT = "after_acknowledgement"


class ApprovalFaultPoint(enum.StrEnum):
    AFTER_DECISION_BEFORE_CONTINUATION = "after_approval_decision_before_continuation"


class CryptoFaultPoint(enum.StrEnum):
    AFTER_TO_DEVICE_BEFORE_COMMIT = "after_to_device_before_commit"
    AFTER_KEY_SHARE_BEFORE_TO_DEVICE = "after_key_share_before_to_device"
    AFTER_SEAL_BEFORE_SEND = "after_seal_before_send"


def fault_point(
    point: FaultPoint | ApprovalFaultPoint | CryptoFaultPoint, *, stage: str = "final"
) -> None:
    """Kill this process with SIGKILL if ``GAPLINE_FAULT`` names ``point`` (at ``stage``)."""
    wanted = os.environ.get(FAULT_ENV)
    if not wanted:
        return
    name, _, wanted_stage = wanted.partition("@")
    if name != point.value or (wanted_stage or "final") != stage:
        return
    once = os.environ.get(FAULT_ONCE_ENV)
    if once:
        try:
            fd = os.open(once, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            return
        os.close(fd)
    os.kill(os.getpid(), signal.SIGKILL)
