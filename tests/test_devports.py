"""Ports chosen before their server starts stay clear of the kernel's port-0 choices."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from gapline import devports
from gapline.devports import free_port


def test_the_ephemeral_range_is_read_from_the_kernel_file(tmp_path: Path) -> None:
    ranges = tmp_path / "range"
    ranges.write_text("32768\t60999\n")
    assert devports._ephemeral_low(str(ranges)) == 32768
    assert devports._ephemeral_low(str(tmp_path / "missing")) is None
    ranges.write_text("garbage")
    assert devports._ephemeral_low(str(ranges)) is None


def test_a_chosen_port_is_below_the_ephemeral_range_and_bindable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A server started earlier may bind port 0 (a relay's peer listener): the kernel
    picks from the range, so a port chosen below it is never the one that one gets."""
    monkeypatch.setattr(devports, "_ephemeral_low", lambda: 32768)
    for _ in range(20):
        port = free_port()
        assert 10_000 <= port < 32768
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_without_a_known_range_the_kernel_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    """No range to stay below (another system): the port is the kernel's port-0 choice,
    so it lies in the range the kernel really uses."""
    low = devports._ephemeral_low()
    if low is None:
        pytest.fail("this test reads the Linux ephemeral range; none found")
    monkeypatch.setattr(devports, "_ephemeral_low", lambda: None)
    assert free_port() >= low
