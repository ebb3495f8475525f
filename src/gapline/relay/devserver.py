"""Run `gapline relay serve` as a subprocess on 127.0.0.1 (tests, benchmarks, demos).

``RelayProcess.start(dsn, ...)`` launches the command, waits for the one JSON line it
prints on stdout once listening, and ``stop()`` sends SIGTERM, which the relay answers
with a graceful shutdown (in-flight writes finish, WebSockets close 1001). The relay's
stderr goes to an anonymous temporary file (``log_text()``, ``log_tail()``): nothing is
left behind however the relay ends, a SIGKILL included.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import IO, Any, Self

from gapline.devports import free_port

__all__ = ["RelayProcess", "RelayStartError", "free_port"]


class RelayStartError(RuntimeError):
    pass


class RelayProcess:
    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        info: dict[str, Any],
        log_file: IO[bytes],
    ) -> None:
        self.proc = proc
        self.info = info
        self._log_file = log_file
        self._final_log: str | None = None
        """The log as it stood at :meth:`stop`, which closes its file."""

    @property
    def url(self) -> str:
        return str(self.info["url"])

    @property
    def ws_url(self) -> str:
        return str(self.info["ws_url"])

    @property
    def relay_id(self) -> str:
        return str(self.info["relay_id"])

    @classmethod
    def start(
        cls,
        dsn: str,
        *,
        retention: int = 86400,
        port: int | None = None,
        network_context: str | None = None,
        extra_args: Sequence[str] = (),
        timeout: float = 30.0,
    ) -> Self:
        port = free_port() if port is None else port
        argv = [
            sys.executable,
            "-m",
            "gapline.cli",
            "relay",
            "serve",
            "--listen",
            f"127.0.0.1:{port}",
            "--db",
            dsn,
            "--retention",
            str(retention),
        ]
        if network_context is not None:
            argv += ["--network-context", network_context]
        argv += list(extra_args)
        # Anonymous: gone with its last descriptor, even after a SIGKILL of both sides.
        log_file = tempfile.TemporaryFile(prefix="gapline-relay-", suffix=".log")  # noqa: SIM115 - closed by stop()
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log_file)
        assert proc.stdout is not None
        deadline = time.monotonic() + timeout
        line = b""
        # The first stdout line is the listening announcement.
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if line or proc.poll() is not None:
                break
        if not line.startswith(b'{"listening"'):
            proc.kill()
            proc.wait()
            text = _read_all(log_file)
            log_file.close()
            raise RelayStartError(f"relay did not start (exit {proc.returncode}): {text[-2000:]}")
        return cls(proc, json.loads(line)["listening"], log_file)

    def stop(self, grace: float = 15.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._final_log is None:
            self._final_log = _read_all(self._log_file)  # for log_tail after the stop
            self._log_file.close()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return int(self.proc.returncode)

    def log_text(self) -> str:
        """Everything the relay wrote to stderr so far (or, once stopped, in all)."""
        if self._final_log is not None:
            return self._final_log
        return _read_all(self._log_file)

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _read_all(log_file: IO[bytes]) -> str:
    # pread: the relay appends through the same open file, whose offset must not move.
    fd = log_file.fileno()
    return os.pread(fd, os.fstat(fd).st_size, 0).decode(errors="replace")
