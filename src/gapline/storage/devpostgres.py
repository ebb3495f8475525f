"""A throwaway PostgreSQL cluster from the local server binaries, for tests, benchmarks and the demo.

``start_cluster()`` runs ``initdb`` into a fresh temporary directory and starts
the server with ``pg_ctl`` on a free 127.0.0.1 port plus a unix socket in that
directory; ``cluster.stop()`` (or leaving ``with start_cluster() as c:``) stops
it and deletes the directory. ``fsync`` stays ON, so durability figures measured
against it are honest.

Binaries: ``pg_ctl``/``initdb`` on PATH, else the newest
``/usr/lib/postgresql/*/bin``; ``GAPLINE_PG_BINDIR`` overrides both.

Root: ``initdb`` refuses to run as root. When the effective uid is 0 the
temporary directory is handed to the ``postgres`` system user and every server
binary runs as ``runuser -u postgres --``; clients still connect from root over
TCP or the socket with ``trust`` authentication (loopback only).

Collation: the cluster defaults to ``C.UTF-8`` (byte order). Code that must not
depend on collation is tested against a database whose default collation is
ICU ``en-US`` (case-insensitive-first order, ``'a' < 'B'``), which differs from
byte order: ``cluster.create_database(icu_locale="en-US")``. This Debian image
has no glibc locale besides C/C.UTF-8/POSIX, so ICU is the non-C collation.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from gapline.devports import free_port

__all__ = ["DevPostgresError", "PostgresCluster", "find_bindir", "start_cluster"]


class DevPostgresError(RuntimeError):
    """The throwaway cluster could not be created or started (the message says why)."""


def find_bindir() -> Path:
    """The directory holding ``initdb``, ``pg_ctl`` and ``postgres``."""
    override = os.environ.get("GAPLINE_PG_BINDIR")
    if override:
        path = Path(override)
        if (path / "pg_ctl").exists():
            return path
        raise DevPostgresError(f"GAPLINE_PG_BINDIR={override} holds no pg_ctl")
    on_path = shutil.which("pg_ctl")
    if on_path and shutil.which("initdb"):
        return Path(os.path.realpath(on_path)).parent
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"),
        key=lambda p: (
            int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0
        ),
    )
    if candidates:
        return Path(candidates[-1]).parent
    raise DevPostgresError(
        "no PostgreSQL server binaries found (pg_ctl/initdb not on PATH and no "
        "/usr/lib/postgresql/*/bin); install the postgresql server package"
    )


def _as_server_user() -> list[str]:
    if os.geteuid() != 0:
        return []
    runuser = shutil.which("runuser")
    if runuser is None:
        raise DevPostgresError("running as root needs `runuser` to start PostgreSQL as `postgres`")
    return [runuser, "-u", "postgres", "--"]


def _chown_tree(path: Path) -> None:
    import pwd

    try:
        entry = pwd.getpwnam("postgres")
    except KeyError as exc:
        raise DevPostgresError(
            "running as root, but there is no `postgres` system user to own the cluster"
        ) from exc
    for root, dirs, files in os.walk(path):
        os.chown(root, entry.pw_uid, entry.pw_gid)
        for name in dirs + files:
            os.chown(os.path.join(root, name), entry.pw_uid, entry.pw_gid)


@dataclass
class PostgresCluster:
    """A running throwaway cluster. Superuser ``postgres``, trust auth, loopback only."""

    bindir: Path
    base: Path
    port: int
    host: str = "127.0.0.1"
    user: str = "postgres"
    _prefix: list[str] = field(default_factory=list)

    @property
    def datadir(self) -> Path:
        return self.base / "data"

    @property
    def socket_dir(self) -> Path:
        return self.base / "sock"

    @property
    def logfile(self) -> Path:
        return self.base / "server.log"

    def dsn(self, dbname: str = "postgres") -> str:
        """A ``postgresql://`` URL over TCP to ``dbname``."""
        return f"postgresql://{self.user}@{self.host}:{self.port}/{dbname}"

    def create_database(self, name: str | None = None, *, icu_locale: str | None = None) -> str:
        """Create a fresh, empty database and return its DSN.

        ``icu_locale`` (e.g. ``"en-US"``) gives it an ICU default collation that
        differs from byte order; otherwise it copies ``template1`` (C.UTF-8).
        """
        import psycopg
        from psycopg import sql

        name = name or f"t_{uuid.uuid4().hex[:16]}"
        stmt = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if icu_locale:
            stmt = sql.SQL(
                "CREATE DATABASE {} TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE {}"
                " LOCALE 'C.UTF-8'"
            ).format(sql.Identifier(name), sql.Literal(icu_locale))
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(stmt)
        return self.dsn(name)

    def drop_database(self, name: str) -> None:
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )

    def stop(self) -> None:
        """Stop the server (fast shutdown) and delete its directory. Idempotent."""
        atexit.unregister(self.stop)
        if self.datadir.exists():
            subprocess.run(
                [
                    *self._prefix,
                    str(self.bindir / "pg_ctl"),
                    "-D",
                    str(self.datadir),
                    "-m",
                    "fast",
                    "-w",
                    "stop",
                ],
                capture_output=True,
                timeout=60,
                check=False,
            )
        shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> PostgresCluster:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def start_cluster(
    *,
    icu_locale: str | None = None,
    base_dir: str | os.PathLike[str] | None = None,
    settings: dict[str, str] | None = None,
    timeout: float = 60.0,
) -> PostgresCluster:
    """initdb + pg_ctl start a fresh cluster; raise :class:`DevPostgresError` saying why not.

    ``icu_locale`` makes ICU (e.g. ``"en-US"``) the cluster's default collation.
    ``settings`` are extra server settings (``-c name=value``).
    """
    bindir = find_bindir()
    prefix = _as_server_user()
    base = Path(tempfile.mkdtemp(prefix="gapline-pg-", dir=base_dir))
    try:
        (base / "sock").mkdir()
        if prefix:
            os.chmod(base, 0o700)
            _chown_tree(base)
        initdb = [
            *prefix,
            str(bindir / "initdb"),
            "-D",
            str(base / "data"),
            "-U",
            "postgres",
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C.UTF-8",
            "--no-sync",  # initdb's own flush only; the server below runs with fsync on
        ]
        if icu_locale:
            initdb += ["--locale-provider=icu", f"--icu-locale={icu_locale}"]
        result = subprocess.run(
            initdb, capture_output=True, text=True, timeout=timeout, check=False
        )
        if result.returncode != 0:
            raise DevPostgresError(
                f"initdb failed: {result.stderr.strip() or result.stdout.strip()}"
            )
        options = {
            "listen_addresses": "127.0.0.1",
            "unix_socket_directories": str(base / "sock"),
            "fsync": "on",
            "synchronous_commit": "on",
            "max_connections": "300",
            "shared_buffers": "64MB",
        }
        options.update(settings or {})
        last_error = ""
        for _attempt in range(5):
            port = free_port()
            opts = " ".join(f"-c {k}={v}" for k, v in {**options, "port": str(port)}.items())
            start = subprocess.run(
                [
                    *prefix,
                    str(bindir / "pg_ctl"),
                    "-D",
                    str(base / "data"),
                    "-l",
                    str(base / "server.log"),
                    "-o",
                    opts,
                    "-w",
                    "-t",
                    str(int(timeout)),
                    "start",
                ],
                capture_output=True,
                text=True,
                timeout=timeout + 10,
                check=False,
            )
            if start.returncode == 0:
                cluster = PostgresCluster(bindir=bindir, base=base, port=port, _prefix=prefix)
                # A process that forgets stop() (or dies of an exception) must not
                # leave a server running; SIGKILL still can, which is why the
                # directory name says gapline-pg-.
                atexit.register(cluster.stop)
                _wait_ready(cluster, timeout)
                return cluster
            log = (
                (base / "server.log").read_text(errors="replace")[-2000:]
                if (base / "server.log").exists()
                else ""
            )
            last_error = f"{start.stderr.strip()} {log.strip()}"
            if "could not bind" not in log and "already in use" not in log:
                break
        raise DevPostgresError(f"pg_ctl start failed: {last_error}")
    except BaseException:
        with contextlib.suppress(Exception):
            subprocess.run(
                [
                    *prefix,
                    str(bindir / "pg_ctl"),
                    "-D",
                    str(base / "data"),
                    "-m",
                    "immediate",
                    "stop",
                ],
                capture_output=True,
                timeout=30,
                check=False,
            )
        shutil.rmtree(base, ignore_errors=True)
        raise


def _wait_ready(cluster: PostgresCluster, timeout: float) -> None:
    import psycopg

    deadline = time.monotonic() + timeout
    while True:
        try:
            with psycopg.connect(cluster.dsn(), connect_timeout=5) as conn:
                conn.execute("SELECT 1")
            return
        except psycopg.OperationalError as exc:
            if time.monotonic() > deadline:
                raise DevPostgresError(
                    f"the server started but accepts no connection: {exc}"
                ) from exc
            time.sleep(0.1)


def _serve_until_stopped() -> None:
    """Manual use: print a DSN and keep the cluster until Ctrl-C, SIGTERM or SIGHUP."""
    import signal

    # A flag, not a threading.Event: a second signal arriving while the first one's
    # handler held the event's lock would wait for that lock for ever.
    stopped: list[int] = []
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, lambda signum, _: stopped.append(signum))
    with start_cluster() as c:
        print(c.dsn(), flush=True)
        while not stopped:
            time.sleep(0.2)


if __name__ == "__main__":
    _serve_until_stopped()
