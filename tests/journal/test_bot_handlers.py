"""Handlers, the crash hook and sidecars: the runtime's small pure parts."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gapline.journal import (
    BUILTIN_HANDLERS,
    Final,
    HandlerError,
    Progress,
    SidecarUnresolved,
    TriggerMessage,
    echo,
    resolve_handler,
)
from gapline.journal._sidecar import attach_sidecar, resolve_sidecar, sidecar_ref, split_large_body


class NoConversation:
    async def read(self, **kwargs: object) -> list[object]:
        raise AssertionError("echo reads nothing")


def message(body: str) -> TriggerMessage:
    return TriggerMessage("!r:x", "$e:x", "@a:x", body, None, 0)


async def test_echo_streams_at_least_two_progress_steps_then_the_answer() -> None:
    items = [item async for item in echo(NoConversation(), message("hello there"))]  # ty: ignore[invalid-argument-type]
    assert all(isinstance(i, Progress) for i in items[:-1]) and len(items) >= 3
    assert items[-1] == Final("echo: hello there")


def test_handlers_resolve_by_builtin_name_or_module_path() -> None:
    assert resolve_handler("echo") is echo is BUILTIN_HANDLERS["echo"]
    assert resolve_handler("gapline.journal._handlers:echo") is echo
    for bad in ("nope", "no.such.module:f", "gapline.journal._handlers:missing", "x:"):
        with pytest.raises(HandlerError):
            resolve_handler(bad)


def _run_fault(env: dict[str, str]) -> int:
    code = "from gapline.journal import FaultPoint, fault_point; fault_point(FaultPoint.AFTER_CLAIM_BEFORE_SEND)"
    return subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, **env}, timeout=60
    ).returncode


def test_the_fault_hook_kills_only_at_its_boundary(tmp_path: Path) -> None:
    assert _run_fault({"GAPLINE_FAULT": "after_claim_before_send"}) == -signal.SIGKILL
    assert _run_fault({"GAPLINE_FAULT": "after_acknowledgement"}) == 0
    once = str(tmp_path / "fired")
    env = {"GAPLINE_FAULT": "after_claim_before_send", "GAPLINE_FAULT_ONCE": once}
    assert _run_fault(env) == -signal.SIGKILL
    assert _run_fault(env) == 0  # the marker exists: the restart runs through


async def test_a_sidecar_round_trips_and_a_tampered_one_is_unresolved() -> None:
    stored: dict[str, bytes] = {}

    async def upload(data: bytes, content_type: str) -> str:
        stored["mxc://x/1"] = data
        return "mxc://x/1"

    async def download(url: str) -> bytes:
        return stored[url]

    text = "ü" * 50
    assert split_large_body(text, 50) is None
    body, extra = await attach_sidecar(text, 10, upload)
    assert len(body) < len(text) + 30 and body != text
    ref = sidecar_ref(extra)
    assert ref is not None and ref.size == len(text.encode())
    assert ref.sha256 == hashlib.sha256(text.encode()).hexdigest()
    assert await resolve_sidecar(ref, download) == text
    stored["mxc://x/1"] = b"x" * ref.size
    with pytest.raises(SidecarUnresolved):
        await resolve_sidecar(ref, download)
    assert sidecar_ref({"io.gapline.sidecar": {"url": "http://not-mxc"}}) is None
