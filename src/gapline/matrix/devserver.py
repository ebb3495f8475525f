"""A throwaway Synapse homeserver on 127.0.0.1, for tests, benchmarks and ``gapline demo``.

``SynapseServer.start()`` runs ``python -m synapse.app.homeserver`` from the
installed ``matrix-synapse`` package (the ``synapse`` dependency group) in its
own process group, with a config generated into a temporary directory:

- ``server_name: localhost``; one plain-HTTP ``client`` listener on a free
  127.0.0.1 port and no federation listener; ``trusted_key_servers: []`` so
  nothing reaches the network;
- an in-memory SQLite database (the server forgets everything when it stops),
  or with ``persistent=True`` a database file in the directory, so that
  `resume()` brings the same server back (same port, users, rooms, tokens);
- open registration without verification, ``bcrypt_rounds: 4``;
- every rate limiter lifted (tests send hundreds of events, logins and joins);
- ``sync_response_cache_duration: 0``: otherwise a finished ``/sync`` answer is
  cached for two minutes and a restarted client on the same device can be
  handed its predecessor's long-poll result;
- the signing key generated here (an ed25519 seed in Synapse's key-file
  format), which saves a second Synapse start with ``--generate-keys``.

Readiness is ``GET /_matrix/client/versions`` answering 200. Synapse's output
goes to ``synapse.log`` in the directory; a server that fails to start raises
`SynapseStartError` carrying the log's tail. `stop()` terminates the whole
process group (SIGTERM, then SIGKILL); `halt()` and `resume()` stop the
processes and start them again from the same config (a test of a homeserver
going away and coming back).

The async helpers (`register_user`, `create_room`, `send_messages`, ...) go
through `MatrixClient`, so they exercise the same code the engines use.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import httpx

from gapline.devports import free_port

from ._client import MatrixClient, Session

__all__ = ["SynapseServer", "SynapseStartError", "synapse_available", "synapse_config"]

_UNLIMITED = {"per_second": 100_000, "burst_count": 100_000}

# Every limiter Synapse 1.163 reads (synapse/config/ratelimiting.py). A key
# left out keeps its default, which for logins is 5 per ~5 minutes per IP.
_RATE_LIMITS: dict[str, Any] = {
    "rc_message": _UNLIMITED,
    "rc_registration": _UNLIMITED,
    "rc_registration_token_validity": _UNLIMITED,
    "rc_login": {
        "address": _UNLIMITED,
        "account": _UNLIMITED,
        "failed_attempts": _UNLIMITED,
    },
    "rc_admin_redaction": _UNLIMITED,
    "rc_joins": {"local": _UNLIMITED, "remote": _UNLIMITED},
    "rc_joins_per_room": _UNLIMITED,
    "rc_key_requests": _UNLIMITED,
    "rc_3pid_validation": _UNLIMITED,
    "rc_invites": {
        "per_room": _UNLIMITED,
        "per_user": _UNLIMITED,
        "per_issuer": _UNLIMITED,
    },
    "rc_third_party_invite": _UNLIMITED,
    "rc_media_create": _UNLIMITED,
    "rc_presence": {"per_user": _UNLIMITED},
    "rc_delayed_event_mgmt": _UNLIMITED,
    "rc_room_creation": _UNLIMITED,
    "rc_reports": _UNLIMITED,
    "rc_user_directory": _UNLIMITED,
    "rc_profile": _UNLIMITED,
    "rc_federation": {
        "window_size": 1000,
        "sleep_limit": 10_000,
        "sleep_delay": 0,
        "reject_limit": 100_000,
        "concurrent": 100,
    },
    "federation_rr_transactions_per_room_per_second": 100_000,
}


class SynapseStartError(RuntimeError):
    """Synapse could not be started; ``log_tail`` holds the end of its output."""

    def __init__(self, message: str, log_tail: str = "") -> None:
        self.log_tail = log_tail
        super().__init__(
            f"{message}\n--- synapse log tail ---\n{log_tail}" if log_tail else message
        )


def synapse_available() -> bool:
    """True when the ``matrix-synapse`` package is importable by this interpreter."""
    import importlib.util

    return importlib.util.find_spec("synapse") is not None


def synapse_config(
    directory: Path, *, port: int, server_name: str = "localhost", persistent: bool = False
) -> dict[str, Any]:
    """The homeserver config `SynapseServer` writes (JSON is valid YAML)."""
    database = str(directory / "homeserver.db") if persistent else ":memory:"
    return {
        "server_name": server_name,
        "public_baseurl": f"http://127.0.0.1:{port}/",
        "pid_file": str(directory / "homeserver.pid"),
        "listeners": [
            {
                "port": port,
                "bind_addresses": ["127.0.0.1"],
                "type": "http",
                "tls": False,
                "x_forwarded": False,
                "resources": [{"names": ["client"], "compress": False}],
            }
        ],
        "database": {"name": "sqlite3", "args": {"database": database}},
        "media_store_path": str(directory / "media"),
        "signing_key_path": str(directory / "signing.key"),
        "trusted_key_servers": [],
        "suppress_key_server_warning": True,
        "report_stats": False,
        "enable_metrics": False,
        "enable_registration": True,
        "enable_registration_without_verification": True,
        "bcrypt_rounds": 4,
        "macaroon_secret_key": secrets.token_hex(32),
        "form_secret": secrets.token_hex(32),
        "registration_shared_secret": secrets.token_hex(32),
        "sync_response_cache_duration": 0,
        "presence": {"enabled": False},
        "url_preview_enabled": False,
        **_RATE_LIMITS,
    }


def _write_signing_key(path: Path) -> None:
    # Synapse's key file: "<alg> <version> <unpadded base64 of the 32-byte ed25519 seed>".
    seed = base64.b64encode(os.urandom(32)).decode().rstrip("=")
    path.write_text(f"ed25519 a_{secrets.token_hex(2)} {seed}\n")


def _launch(workdir: Path, python: str) -> subprocess.Popen[bytes]:
    with (workdir / "synapse.log").open("ab") as log_file:
        return subprocess.Popen(
            [
                python,
                "-m",
                "synapse.app.homeserver",
                "--config-path",
                str(workdir / "homeserver.yaml"),
            ],
            cwd=workdir,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # own process group: stop() kills it whole
        )


@dataclass
class SynapseServer:
    """A running throwaway Synapse. Use `start()` (blocking, ~3 s) and `stop()`,
    or ``with SynapseServer.start() as server:``."""

    base_url: str
    server_name: str
    port: int
    directory: Path
    process: subprocess.Popen[bytes] = field(repr=False)
    start_seconds: float
    _owns_directory: bool = field(default=False, repr=False)
    _python: str = field(default=sys.executable, repr=False)
    _counter: itertools.count[int] = field(default_factory=itertools.count, repr=False)

    @property
    def log_path(self) -> Path:
        return self.directory / "synapse.log"

    # -- lifecycle -------------------------------------------------------------------------

    @classmethod
    def start(
        cls,
        directory: Path | None = None,
        *,
        server_name: str = "localhost",
        startup_timeout: float = 90.0,
        python: str = sys.executable,
        persistent: bool = False,
    ) -> SynapseServer:
        """Start Synapse and wait until it answers ``/_matrix/client/versions``.

        ``directory`` receives the config, key, media store and log; a fresh
        temporary one (removed by `stop`) is made when none is given.
        ``persistent`` keeps the database in a file there (see `resume`).
        """
        if not synapse_available():
            raise SynapseStartError(
                "matrix-synapse is not installed (install the 'synapse' dependency group)"
            )
        owns = directory is None
        workdir = (
            Path(tempfile.mkdtemp(prefix="gapline-synapse-")) if directory is None else directory
        )
        workdir.mkdir(parents=True, exist_ok=True)
        last_error: SynapseStartError | None = None
        # A port picked free can be taken before Synapse binds it; try a few.
        for _ in range(3):
            try:
                server = cls._start_once(
                    workdir, server_name, startup_timeout, python, persistent=persistent
                )
            except SynapseStartError as exc:
                last_error = exc
                if "Address already in use" not in exc.log_tail:
                    break
                continue
            server._owns_directory = owns
            return server
        if owns:
            shutil.rmtree(workdir, ignore_errors=True)
        assert last_error is not None
        raise last_error

    @classmethod
    def _start_once(
        cls,
        workdir: Path,
        server_name: str,
        startup_timeout: float,
        python: str,
        *,
        persistent: bool = False,
    ) -> SynapseServer:
        port = free_port()
        (workdir / "media").mkdir(exist_ok=True)
        _write_signing_key(workdir / "signing.key")
        config_path = workdir / "homeserver.yaml"
        config_path.write_text(
            json.dumps(
                synapse_config(workdir, port=port, server_name=server_name, persistent=persistent),
                indent=2,
            )
        )
        started = time.monotonic()
        process = _launch(workdir, python)
        server = cls(
            base_url=f"http://127.0.0.1:{port}",
            server_name=server_name,
            port=port,
            directory=workdir,
            process=process,
            start_seconds=0.0,
            _python=python,
        )
        try:
            server._wait_ready(started + startup_timeout)
        except BaseException:
            # Never leave a half-started server behind, whatever interrupted us.
            server._terminate()
            raise
        server.start_seconds = time.monotonic() - started
        return server

    @classmethod
    async def astart(cls, directory: Path | None = None, **kwargs: Any) -> SynapseServer:
        """`start` from async code, without blocking the event loop."""
        import asyncio

        return await asyncio.to_thread(cls.start, directory, **kwargs)

    async def astop(self) -> None:
        """`stop` from async code, without blocking the event loop."""
        import asyncio

        await asyncio.to_thread(self.stop)

    def _wait_ready(self, deadline: float) -> None:
        url = f"{self.base_url}/_matrix/client/versions"
        with httpx.Client(timeout=2.0, trust_env=False) as http:
            while True:
                code = self.process.poll()
                if code is not None:
                    raise SynapseStartError(
                        f"Synapse exited with status {code} during start", self.log_tail()
                    )
                with contextlib.suppress(httpx.TransportError):
                    if http.get(url).status_code == 200:
                        return
                if time.monotonic() > deadline:
                    raise SynapseStartError("Synapse did not become ready in time", self.log_tail())
                time.sleep(0.05)

    def halt(self) -> None:
        """Terminate the server's processes, keeping its directory (`resume` starts it)."""
        self._terminate()

    def resume(self, startup_timeout: float = 90.0) -> None:
        """Start a halted server again from the same config (same port).

        Only a ``persistent`` server comes back with its users and rooms; an
        in-memory one comes back empty.
        """
        if self.process.poll() is None:
            raise RuntimeError("the server is running; halt() it first")
        started = time.monotonic()
        self.process = _launch(self.directory, self._python)
        try:
            self._wait_ready(started + startup_timeout)
        except BaseException:
            self._terminate()
            raise

    async def ahalt(self) -> None:
        """`halt` from async code, without blocking the event loop."""
        import asyncio

        await asyncio.to_thread(self.halt)

    async def aresume(self, startup_timeout: float = 90.0) -> None:
        """`resume` from async code, without blocking the event loop."""
        import asyncio

        await asyncio.to_thread(self.resume, startup_timeout)

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def _terminate(self, grace: float = 10.0) -> None:
        if self.process.poll() is not None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, sig)
            try:
                self.process.wait(timeout=grace)
                return
            except subprocess.TimeoutExpired:
                continue

    def stop(self) -> None:
        """Stop the server (its whole process group) and remove a temp directory it made."""
        self._terminate()
        if self._owns_directory:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- helpers ---------------------------------------------------------------------------

    def unique_localpart(self, prefix: str = "user") -> str:
        """A localpart no other caller of this server has been handed."""
        return f"{prefix}{next(self._counter)}_{secrets.token_hex(3)}"

    def user_id(self, localpart: str) -> str:
        return f"@{localpart}:{self.server_name}"

    def client(self, session: Session | None = None, **kwargs: Any) -> MatrixClient:
        """A `MatrixClient` on this server, logged in as ``session`` when given.

        Proxy variables are ignored: the server is on loopback.
        """
        kwargs.setdefault("trust_env", False)
        return MatrixClient(self.base_url, session=session, **kwargs)

    async def register_user(
        self, localpart: str | None = None, password: str = "password"
    ) -> Session:
        """Register a user (a unique localpart when none is given) and return its session."""
        async with self.client() as client:
            return await client.register(localpart or self.unique_localpart(), password)

    async def login(
        self, user: str, password: str = "password", *, device_id: str | None = None
    ) -> Session:
        async with self.client() as client:
            return await client.login(user, password, device_id=device_id)

    async def create_room(
        self,
        session: Session,
        *,
        name: str | None = None,
        invite: Iterable[str] = (),
        preset: str | None = "private_chat",
        extra: Mapping[str, Any] | None = None,
    ) -> str:
        async with self.client(session) as client:
            return await client.create_room(name=name, invite=invite, preset=preset, extra=extra)

    async def invite(self, session: Session, room_id: str, user_id: str) -> None:
        async with self.client(session) as client:
            await client.invite(room_id, user_id)

    async def join(self, session: Session, room_id: str) -> str:
        async with self.client(session) as client:
            return await client.join(room_id)

    async def invite_and_join(self, inviter: Session, room_id: str, invitee: Session) -> None:
        await self.invite(inviter, room_id, invitee.user_id)
        await self.join(invitee, room_id)

    async def send_messages(
        self, session: Session, room_id: str, bodies: Iterable[str]
    ) -> list[str]:
        """Send ``m.text`` messages one after another (never concurrently: concurrent
        sends can fork the room DAG and make /sync and /messages disagree on order).
        Returns the event IDs in send order."""
        event_ids: list[str] = []
        async with self.client(session) as client:
            for body in bodies:
                event_ids.append(await client.send_text(room_id, body))
        return event_ids
