"""Unit tests: rate limiter, notification coalescing, error maps, CLI help."""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
from typing import Any, cast

import pytest

from gapline.meshline import HTTP_STATUS_BY_CODE, JSONRPC_CODE_BY_CODE
from gapline.relay import DEFAULT_NETWORK_CONTEXT
from gapline.relay._errors import RelayFailure, http_status, jsonrpc_code
from gapline.relay._ratelimit import RateLimiter
from gapline.relay._ws import WsConnection


def test_rate_limiter_refills_and_reports_whole_seconds() -> None:
    now = [0.0]
    limiter = RateLimiter(rate=2.0, burst=2, clock=lambda: now[0])
    assert limiter.take("s") == 0 and limiter.take("s") == 0
    assert limiter.take("s") == 1
    assert limiter.take("other") == 0  # buckets are per key
    now[0] += 0.5
    assert limiter.take("s") == 0


def test_rate_limiter_bounds_its_memory() -> None:
    limiter = RateLimiter(rate=1.0, burst=1, clock=lambda: 0.0, max_keys=10)
    for i in range(100):
        limiter.take(f"k{i}")
    assert len(limiter._buckets) <= 10


def test_every_spec_code_has_both_encodings() -> None:
    for code in HTTP_STATUS_BY_CODE:
        assert http_status(code) == HTTP_STATUS_BY_CODE[code]
        assert jsonrpc_code(code) == JSONRPC_CODE_BY_CODE[code]
    with pytest.raises(ValueError):
        RelayFailure("made_up", "x")


class _FakeWs:
    def __init__(self) -> None:
        self.sent: list[str] = []
        self.three = asyncio.Event()

    async def send_str(self, text: str) -> None:
        self.sent.append(text)
        if len(self.sent) >= 3:
            self.three.set()


class _FakeServer:
    class config:
        ws_queue = 2

    class metrics:
        class notifications:
            @staticmethod
            def labels(_: str) -> Any:
                return type("C", (), {"inc": staticmethod(lambda: None)})

    def track(self, conn: Any) -> None: ...
    def untrack(self, conn: Any) -> None: ...


async def test_notifications_coalesce_when_the_reader_is_slow() -> None:
    ws = _FakeWs()
    conn = WsConnection(cast(Any, _FakeServer()), cast(Any, ws), "test")
    conn.notify_enabled = True
    await conn.answer("r1")
    await conn.answer("r2")  # the queue (size 2) is now full
    for head in range(100):
        conn.notify("message.timeline.changed", {"head": head})
    assert conn.outbound.qsize() == 2  # the hints took no queue room
    async with asyncio.timeout(10), asyncio.TaskGroup() as group:
        group.create_task(conn.writer())
        await ws.three.wait()
        await conn.finish()  # the writer returns once everything queued before is sent
    # Responses keep their order; the hundred hints became one, with the newest head.
    assert [m for m in ws.sent if not m.startswith("{")] == ["r1", "r2"]
    notes = [m for m in ws.sent if m.startswith("{")]
    assert notes == ['{"jsonrpc":"2.0","method":"message.timeline.changed","params":{"head":99}}']


def test_relay_help_documents_every_flag() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "gapline.cli", "relay", "serve", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    from gapline.relay.cli import configure

    parser = argparse.ArgumentParser()
    configure(parser)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    serve = sub.choices["serve"]
    flags = [
        opt for action in serve._actions for opt in action.option_strings if opt.startswith("--")
    ]
    assert {"--listen", "--db", "--retention", "--network-context", "--relay-key"} <= set(flags)
    for flag in flags:
        assert flag in out
    for action in serve._actions:
        assert action.help, f"{action.option_strings} has no help text"
    assert DEFAULT_NETWORK_CONTEXT in " ".join(out.split())
    top = subprocess.run(
        [sys.executable, "-m", "gapline.cli", "relay", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "serve" in top


def test_bad_flags_are_clear_errors() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gapline.cli", "relay", "serve", "--db", "x.db", "--retention", "0"],
        capture_output=True,
        text=True,
    )
    assert (
        result.returncode == 2 and "positive" in result.stderr and "Traceback" not in result.stderr
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "gapline.cli",
            "relay",
            "serve",
            "--db",
            "x.db",
            "--retention",
            "5",
            "--network-context",
            "nope",
        ],
        capture_output=True,
        text=True,
    )
    assert (
        result.returncode == 2
        and "network-context" in result.stderr
        and "Traceback" not in result.stderr
    )
