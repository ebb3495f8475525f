"""Ports chosen before their relay starts stay clear of the kernel's port-0 choices."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from gapline.relay import devserver
from gapline.relay.devserver import free_port


def test_the_ephemeral_range_is_read_from_the_kernel_file(tmp_path: Path) -> None:
    ranges = tmp_path / "range"
    ranges.write_text("32768\t60999\n")
    assert devserver._ephemeral_low(str(ranges)) == 32768
    assert devserver._ephemeral_low(str(tmp_path / "missing")) is None
    ranges.write_text("garbage")
    assert devserver._ephemeral_low(str(ranges)) is None


def test_a_chosen_port_is_below_the_ephemeral_range_and_bindable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An earlier relay's peer listener binds port 0: the kernel picks from the range,
    so a port chosen below it is never the one that listener gets."""
    monkeypatch.setattr(devserver, "_ephemeral_low", lambda: 32768)
    for _ in range(20):
        port = free_port()
        assert 10_000 <= port < 32768
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_without_a_known_range_the_kernel_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devserver, "_ephemeral_low", lambda: None)
    port = free_port()
    assert 0 < port < 65536
