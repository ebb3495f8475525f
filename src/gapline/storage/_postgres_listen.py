"""PostgreSQL LISTEN: one dedicated connection, owned by a thread that waits on its socket.

``tx.notify`` is ``pg_notify``: PostgreSQL delivers it at COMMIT to every
listening session, in this process or another. The listener feeds what it
hears into a ``NotificationHub`` that ``PostgresBackend.subscribe`` reads.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
from typing import Any

import psycopg
from psycopg import sql as pgsql

from gapline.storage._errors import (
    BackendClosed,
    BackendUnavailable,
)
from gapline.storage._notify import NotificationHub
from gapline.storage._postgres_tx import connect_postgres, map_postgres_error

__all__: list[str] = []


class _Listener:
    """One LISTEN connection on its own thread, feeding the in-process hub.

    The thread waits on the connection's socket and a wake pipe, so a new
    ``LISTEN`` is sent at once and a notification is read as soon as it lands.
    If the connection is lost, the thread reconnects (with backoff) and listens
    again on every channel; notifications sent while it was away are lost, as
    with any LISTEN client, so subscribers treat a payload as a hint to re-read.
    """

    def __init__(self, dsn: str, hub: NotificationHub) -> None:
        self._dsn = dsn
        self._hub = hub
        self._conn: psycopg.Connection[Any] | None = self._connect()
        self._wake_r, self._wake_w = os.pipe()
        self._lock = threading.Lock()
        self._pending: list[tuple[str, threading.Event, list[BaseException]]] = []
        self._channels: set[str] = set()
        self._stop = False
        self.reconnects = 0
        self._thread = threading.Thread(target=self._run, name="gapline-pg-listener", daemon=True)
        self._thread.start()

    def _connect(self) -> psycopg.Connection[Any]:
        conn = connect_postgres(self._dsn, autocommit=True, name="gapline-listener")
        hub = self._hub
        # Notifications that arrive while a LISTEN statement runs come this way.
        conn.add_notify_handler(lambda n: hub.publish([(n.channel, n.payload)]))
        return conn

    def listen(self, channel: str, timeout: float = 10.0) -> None:
        """Block until the server acknowledged ``LISTEN channel`` (a local round trip)."""
        with self._lock:
            if channel in self._channels:
                return
            done = threading.Event()
            errors: list[BaseException] = []
            self._pending.append((channel, done, errors))
        os.write(self._wake_w, b"x")
        if not done.wait(timeout):
            raise BackendUnavailable(f"LISTEN {channel!r} was not acknowledged in {timeout} s")
        if errors:
            raise errors[0]

    def _run(self) -> None:
        backoff = 0.05
        try:
            while not self._stop:
                try:
                    if self._conn is None:
                        self._conn = self._connect()
                        with self._lock:
                            channels = sorted(self._channels)
                        for channel in channels:
                            self._listen_now(self._conn, channel)
                        self.reconnects += 1
                    backoff = 0.05
                    self._pump(self._conn)
                except Exception as exc:  # noqa: BLE001 - connection lost: report, retry
                    self._fail_pending(map_postgres_error(exc))
                    if self._conn is not None:
                        with contextlib.suppress(Exception):
                            self._conn.close()
                        self._conn = None
                    select.select([self._wake_r], [], [], backoff)  # woken early by close()
                    backoff = min(backoff * 2, 2.0)
        finally:
            self._fail_pending(BackendClosed("the backend is closed"))
            if self._conn is not None:
                with contextlib.suppress(Exception):
                    self._conn.close()

    def _pump(self, conn: psycopg.Connection[Any]) -> None:
        pgconn = conn.pgconn
        sock = pgconn.socket
        while not self._stop:
            readable, _, _ = select.select([sock, self._wake_r], [], [])
            if self._wake_r in readable:
                os.read(self._wake_r, 4096)
                self._serve_pending(conn)
            if sock in readable and not self._stop:
                pgconn.consume_input()  # raises when the server closed the connection
                notes: list[tuple[str, str]] = []
                while (n := pgconn.notifies()) is not None:
                    notes.append((n.relname.decode(), n.extra.decode()))
                if notes:
                    self._hub.publish(notes)
                if pgconn.status != psycopg.pq.ConnStatus.OK:
                    raise psycopg.OperationalError("the LISTEN connection was closed")

    @staticmethod
    def _listen_now(conn: psycopg.Connection[Any], channel: str) -> None:
        conn.execute(pgsql.SQL("LISTEN {}").format(pgsql.Identifier(channel)))

    def _serve_pending(self, conn: psycopg.Connection[Any]) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        for i, (channel, done, errors) in enumerate(pending):
            try:
                self._listen_now(conn, channel)
            except psycopg.Error as exc:
                if conn.closed or conn.broken:
                    with self._lock:  # served again once reconnected
                        self._pending[:0] = pending[i:]
                    raise
                errors.append(map_postgres_error(exc))
            else:
                with self._lock:
                    self._channels.add(channel)
            done.set()

    def _fail_pending(self, error: BaseException) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        for _channel, done, errors in pending:
            errors.append(error)
            done.set()

    def close(self) -> None:
        self._stop = True
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")
        self._thread.join(timeout=10)
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
