"""`gapline bridge` opens the store before it logs in: a wrong passphrase is a clear
error before any network request.

The homeserver is a bare TCP listener on 127.0.0.1 that counts connections and
refuses every request with ``403 M_FORBIDDEN``. With the store's own passphrase
the bridge reaches it (the login is refused); with a wrong one it never connects.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from gapline.history import Engine
from gapline.storage import KdfParams

pytestmark = pytest.mark.timeout(120)

USER = "@alice:example.org"


class CountingServer:
    """Accepts connections, counts them, answers each request 403 M_FORBIDDEN."""

    def __init__(self) -> None:
        self.connections = 0
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> CountingServer:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    @property
    def url(self) -> str:
        assert self.server is not None
        host, port = self.server.sockets[0].getsockname()[:2]
        return f"http://{host}:{port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            await reader.readexactly(length)
            body = json.dumps({"errcode": "M_FORBIDDEN", "error": "refused by the test"}).encode()
            writer.write(
                b"HTTP/1.1 403 Forbidden\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)
            )
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def run_bridge(url: str, store: Path, passphrase: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gapline.cli", "bridge",
        "--homeserver", url, "--user", USER, "--password", "pw",
        "--store", str(store), "--passphrase", passphrase,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(b'"Shutdown"\n'), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_wrong_passphrase_fails_before_any_network_request(tmp_path: Path) -> None:
    store = tmp_path / "store"
    async with Engine.open(
        store, None, passphrase="one", sync=False, kdf_cost=KdfParams.cheap()
    ) as engine:
        assert engine.sync_count == 0

    async with CountingServer() as server:
        status, out, err = await run_bridge(server.url, store, "two")
        assert status == 1
        assert out == ""
        assert "wrong passphrase" in err
        assert "Traceback" not in err
        assert server.connections == 0

        # The control: with the store's passphrase the bridge does reach the server.
        status, out, err = await run_bridge(server.url, store, "one")
        assert status == 1
        assert out == ""
        assert f"login as {USER} failed" in err
        assert "Traceback" not in err
        assert server.connections >= 1
