"""The narrow views are enforced by the type checker, not by convention.

ty runs over small fixture modules (excluded from the project's normal ty run): the
in-bounds one must pass, and each collaborator reaching outside its view must fail
with exactly the missing attributes it reached for.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parent / "ty_fixtures"


def _ty() -> str:
    beside = Path(sys.executable).parent / "ty"
    found = str(beside) if beside.exists() else shutil.which("ty")
    if found is None:
        pytest.fail("ty is a dev dependency and must be installed to check the views")
    return found


async def _check(name: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        _ty(),
        "check",
        "--output-format",
        "concise",
        str(FIXTURES / name),
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode()


async def test_collaborators_within_their_views_type_check() -> None:
    code, out = await _check("views_in_bounds.py")
    assert code == 0, out


async def test_hydrator_cannot_reach_the_outbox() -> None:
    code, out = await _check("hydrator_reaches_enqueue.py")
    assert code != 0
    errors = [line for line in out.splitlines() if "error" in line]
    assert len(errors) == 1, out
    assert "HydrationView" in errors[0] and "enqueue" in errors[0]


async def test_delivery_worker_cannot_admit_or_settle() -> None:
    code, out = await _check("worker_reaches_admit.py")
    assert code != 0
    errors = [line for line in out.splitlines() if "error" in line]
    assert len(errors) == 2, out
    assert all("DeliveryView" in e for e in errors)
    assert any("`admit`" in e for e in errors) and any("`settle`" in e for e in errors)


async def test_approvals_cannot_reach_the_generic_outbox_or_the_worker() -> None:
    code, out = await _check("approvals_reach_the_outbox.py")
    assert code != 0
    errors = [line for line in out.splitlines() if "error" in line]
    assert len(errors) == 2, out
    assert all("ApprovalDeliveryView" in e for e in errors)
    assert any("`enqueue`" in e for e in errors) and any("`claim`" in e for e in errors)


def test_there_are_eleven_views_ten_beside_the_membership_view() -> None:
    """The seed's eleven, counted rather than quoted: ten in ``_views`` and the
    membership view beside its fence."""
    from typing import Protocol

    from gapline.journal import _membership, _views

    def protocols(module: object) -> set[str]:
        return {
            name
            for name, value in vars(module).items()
            if isinstance(value, type)
            and Protocol in getattr(value, "__mro__", ())
            and value.__module__ == getattr(module, "__name__", None)
        }

    assert protocols(_views) == {
        "AdmissionView",
        "ReplayView",
        "DispatchView",
        "PendingTurnView",
        "RelationView",
        "ConversationReadView",
        "HistoryRecoveryRecordView",
        "HydrationView",
        "MatrixDeliveryView",
        "ApprovalDeliveryView",
    }
    assert protocols(_membership) == {"MembershipView"}
