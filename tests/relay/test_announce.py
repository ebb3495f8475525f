"""The libp2p address a relay advertises: the bound one, or ``--p2p-announce``'s; a
listener on every interface (0.0.0.0, ::) never advertises that, which no peer can dial."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from gapline.meshline import b58encode
from gapline.relay import RelayConfig
from gapline.relay._p2p._identity import PeerIdentity
from gapline.relay.devserver import RelayStartError
from tests.relay.federation import Network, metric, wait_for


def _config(**fields: Any) -> RelayConfig:
    return RelayConfig(dsn="relay.db", retention=3600, **fields)


def test_the_configuration_refuses_what_cannot_be_dialled() -> None:
    with pytest.raises(ValueError, match="--p2p-announce"):
        _config(p2p_listen=("0.0.0.0", 4001))
    with pytest.raises(ValueError, match="--p2p-announce"):
        _config(p2p_listen=("::", 4001))
    with pytest.raises(ValueError, match="not dialable"):
        _config(p2p_listen=("0.0.0.0", 4001), p2p_announce=("/ip4/0.0.0.0/tcp/4001",))
    with pytest.raises(ValueError, match="p2p-announce"):
        _config(p2p_listen=("0.0.0.0", 4001), p2p_announce=("/ip4/1.2.3.4/udp/4001",))
    with pytest.raises(ValueError, match="needs --p2p-listen"):
        _config(p2p_announce=("/dns/relay.example/tcp/4001",))
    # A name, or a bound address, is dialable as it is.
    _config(p2p_listen=("relay.example", 4001))
    _config(p2p_listen=("0.0.0.0", 4001), p2p_announce=("/dns/relay.example/tcp/4001",))


async def test_a_relay_on_every_interface_advertises_its_announce_address(
    tmp_path: Path,
) -> None:
    net = Network(tmp_path, [str(tmp_path / "a.db"), str(tmp_path / "b.db")])
    a, b = net.members
    wildcard = ["--p2p-listen", f"0.0.0.0:{a.p2p_port}"]
    with pytest.raises(RelayStartError, match="--p2p-announce"):
        net.start(a, *wildcard)
    try:
        announce = f"/ip4/127.0.0.1/tcp/{a.p2p_port}"
        proc = net.start(a, *wildcard, "--p2p-announce", announce)
        peer_id = b58encode(PeerIdentity.from_relay_key(a.key).peer_id)
        assert proc.info["p2p"] == [f"{announce}/p2p/{peer_id}"]
        async with httpx.AsyncClient() as http:
            endpoints = (await http.get(proc.url + "/relay/descriptor")).json()["endpoints"]
        assert [e for e in endpoints if e.startswith("/")] == [f"{announce}/p2p/{peer_id}"]
        assert not any("0.0.0.0" in e for e in endpoints)
        # Another relay dials the advertised address (its bootstrap) and is believed.
        net.start(b)

        async def peered() -> bool:
            return (
                await metric(a, "meshline_relay_peers")
                == 1
                == await metric(b, "meshline_relay_peers")
            )

        await wait_for(peered, "A and B to peer through A's announced address")
    finally:
        net.stop_all()


async def test_an_announce_address_naming_another_peer_id_stops_the_start(
    tmp_path: Path,
) -> None:
    net = Network(tmp_path, [str(tmp_path / "a.db"), str(tmp_path / "b.db")])
    a, b = net.members
    other = b58encode(PeerIdentity.from_relay_key(b.key).peer_id)
    with pytest.raises(RelayStartError, match="another Peer ID"):
        net.start(a, "--p2p-announce", f"/ip4/127.0.0.1/tcp/{a.p2p_port}/p2p/{other}")
