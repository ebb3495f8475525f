"""No traceback reaches a user for an expected failure: each is one line on stderr,
``gapline COMMAND: ...``, and its own exit status (the README's table).

Every command runs as a user runs it: a child process in a session of its own, so
there is no terminal to ask on (as under a service manager or in CI).
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from gapline.clikit import Exit
from gapline.relay.devserver import RelayProcess
from tests.journal.test_cli_journal import BOT, ROOM, message, seed

UNREACHABLE = "http://127.0.0.1:9"  # the discard port: nothing listens, a refusal at once
USER = "@alice:example.org"


def gapline(*args: str, **env: str) -> tuple[int, str, str]:
    done = subprocess.run(
        [sys.executable, "-m", "gapline.cli", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        start_new_session=True,
        env={**os.environ, "NO_PROXY": "127.0.0.1", **env},
    )
    return done.returncode, done.stdout, done.stderr


def one_line(err: str, prog: str) -> str:
    """The error line: the only line on stderr that is not a log or a warning."""
    assert "Traceback" not in err, err
    lines = [
        line
        for line in err.splitlines()
        if line.startswith(f"{prog}: ") and not line.startswith(f"{prog}: warning:")
    ]
    assert len(lines) == 1, err
    return lines[0]


def only_line(err: str, prog: str) -> str:
    assert len(err.splitlines()) == 1, err
    return one_line(err, prog)


# -- bridge ---------------------------------------------------------------------------------


def bridge(store: Path | str, *extra: str, **env: str) -> tuple[int, str, str]:
    return gapline(
        "bridge", "--homeserver", UNREACHABLE, "--user", USER, "--store", str(store), *extra,
        **{"GAPLINE_PASSWORD": "pw", "GAPLINE_PASSPHRASE": "pp", **env},
    )  # fmt: skip


def test_bridge_store_that_is_a_regular_file(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.write_text("not a directory")
    code, out, err = bridge(store)
    assert (code, out) == (Exit.STORE, "")
    assert only_line(err, "gapline bridge") == (
        f"gapline bridge: --store {store} exists and is not a directory"
    )


def test_bridge_store_below_a_regular_file(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    code, _, err = bridge(tmp_path / "file" / "store")
    assert code == Exit.STORE
    assert "a parent of it is a file" in only_line(err, "gapline bridge")


def test_bridge_store_that_cannot_be_created(tmp_path: Path) -> None:
    code, _, err = bridge("/proc/gapline-store")  # not even root creates directories here
    assert code == Exit.STORE
    assert only_line(err, "gapline bridge").startswith("gapline bridge: cannot create --store")


def test_bridge_store_that_is_not_a_store(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    (store / "history.sqlite3").write_text("this is not a database " * 100)
    code, _, err = bridge(store)
    assert code == Exit.STORE
    assert one_line(err, "gapline bridge").startswith(
        f"gapline bridge: cannot open the store in {store}"
    )


def test_bridge_unreachable_homeserver(tmp_path: Path) -> None:
    code, out, err = bridge(tmp_path / "store")
    assert (code, out) == (Exit.FAILED, "")
    assert one_line(err, "gapline bridge").startswith(
        f"gapline bridge: cannot reach the homeserver at {UNREACHABLE}:"
    )


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--homeserver", "127.0.0.1:8008", "http:// or https:// URL"),
        ("--user", "alice", "Matrix user ID"),
        ("--user", "@alice", "full Matrix user ID"),
        ("--page-size", "0", "page_size"),
    ],
)
def test_bridge_bad_values(tmp_path: Path, flag: str, value: str, says: str) -> None:
    argv = {"--homeserver": UNREACHABLE, "--user": USER, "--store": str(tmp_path / "s")}
    argv[flag] = value
    code, _, err = gapline(
        "bridge", *(x for pair in argv.items() for x in pair), GAPLINE_PASSWORD="pw"
    )
    assert code == Exit.USAGE
    assert says in only_line(err, "gapline bridge")


# -- tui and demo ---------------------------------------------------------------------------


def test_tui_without_a_terminal_or_a_password(tmp_path: Path) -> None:
    code, out, err = gapline(
        "tui", "--homeserver", UNREACHABLE, "--user", USER, "--store", str(tmp_path / "s")
    )
    assert (code, out) == (Exit.NO_TERMINAL, "")
    assert "there is no terminal to ask on" in only_line(err, "gapline tui")


def test_tui_store_that_is_a_regular_file(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.write_text("")
    code, _, err = gapline(
        "tui", "--homeserver", UNREACHABLE, "--user", USER, "--store", str(store),
        GAPLINE_PASSWORD="pw", GAPLINE_PASSPHRASE="pp",
    )  # fmt: skip
    assert code == Exit.STORE
    assert "is not a directory" in only_line(err, "gapline tui")


def test_tui_invalid_room_id(tmp_path: Path) -> None:
    code, _, err = gapline(
        "tui", "--homeserver", UNREACHABLE, "--user", USER, "--room", "#alias:example.org"
    )
    assert code == Exit.USAGE
    assert "room ID" in only_line(err, "gapline tui")


def test_demo_without_a_terminal(tmp_path: Path) -> None:
    code, out, err = gapline("demo", TMPDIR=str(tmp_path))
    assert (code, out) == (Exit.NO_TERMINAL, "")
    assert "--headless" in only_line(err, "gapline demo")
    assert list(tmp_path.iterdir()) == []  # nothing was started


# -- bot ------------------------------------------------------------------------------------


def bot(store: str, *extra: str) -> tuple[int, str, str]:
    return gapline(
        "bot", "--homeserver", UNREACHABLE, "--user", BOT, "--store", store,
        "--handler", "echo", *extra, GAPLINE_PASSWORD="pw",
    )  # fmt: skip


def test_bot_store_that_cannot_be_opened(tmp_path: Path) -> None:
    code, _, err = bot(str(tmp_path))  # a directory, not a database file
    assert code == Exit.STORE
    assert one_line(err, "gapline bot").startswith(f"gapline bot: cannot open --store {tmp_path}")


@pytest.mark.parametrize("dsn", ["mysql://db/journal", ":memory:", "file:journal.db"])
def test_bot_dsn_it_cannot_use(tmp_path: Path, dsn: str) -> None:
    code, _, err = bot(dsn)
    assert code == Exit.USAGE
    assert "--store" in only_line(err, "gapline bot")
    assert list(tmp_path.iterdir()) == []


def test_bot_password_on_the_command_line_warns_in_its_json_log(tmp_path: Path) -> None:
    code, _, err = gapline(
        "bot", "--homeserver", UNREACHABLE, "--user", BOT, "--password", "pw",
        "--store", str(tmp_path / "j.db"), "--handler", "echo",
    )  # fmt: skip
    assert code == Exit.FAILED  # the unreachable homeserver, logged
    records = [json.loads(line) for line in err.splitlines()]
    assert records[0]["level"] == "warning" and "other local users" in records[0]["msg"]
    assert records[-1]["msg"] == "bot failed"


# -- journal read ---------------------------------------------------------------------------


def journal_read(store: str, *extra: str) -> tuple[int, str, str]:
    return gapline("journal", "read", "--store", store, "--principal", BOT, "--room", ROOM, *extra)


def test_read_of_a_path_that_does_not_exist_creates_nothing(tmp_path: Path) -> None:
    store = tmp_path / "missing" / "j.sqlite3"
    code, out, err = journal_read(str(store))
    assert (code, out) == (Exit.STORE, "")
    assert only_line(err, "gapline journal read") == (
        f"gapline journal read: no journal at --store {store}: the file does not exist"
    )
    assert list(tmp_path.iterdir()) == []


def test_read_of_an_empty_file_leaves_it_empty(tmp_path: Path) -> None:
    store = tmp_path / "j.sqlite3"
    store.touch()
    code, _, err = journal_read(str(store))
    assert code == Exit.STORE and "there is no journal in it" in only_line(
        err, "gapline journal read"
    )
    assert store.stat().st_size == 0 and sorted(tmp_path.iterdir()) == [store]


def test_read_of_another_gapline_database_adds_no_journal(tmp_path: Path) -> None:
    store = tmp_path / "relay.db"
    with RelayProcess.start(str(store)):
        pass  # a relay database: gapline's bookkeeping, no journal
    before = sqlite3.connect(store).execute("SELECT name FROM sqlite_master").fetchall()
    code, _, err = journal_read(str(store))
    assert code == Exit.STORE
    assert only_line(err, "gapline journal read") == (
        f"gapline journal read: --store {store} holds no journal"
    )
    after = sqlite3.connect(store).execute("SELECT name FROM sqlite_master").fetchall()
    assert after == before


def test_read_of_a_file_that_is_not_a_database(tmp_path: Path) -> None:
    store = tmp_path / "notes.txt"
    store.write_text("hello\n")
    code, _, err = journal_read(str(store))
    assert code == Exit.STORE
    assert one_line(err, "gapline journal read").startswith(
        f"gapline journal read: cannot open --store {store}"
    )
    assert store.read_text() == "hello\n"


@pytest.mark.postgres
def test_read_of_an_empty_postgres_database_creates_no_table(postgres_dsn: str) -> None:
    import psycopg

    code, _, err = journal_read(postgres_dsn)
    assert code == Exit.STORE and "holds no journal" in only_line(err, "gapline journal read")
    with psycopg.connect(postgres_dsn) as conn:
        tables = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
        ).fetchall()
    assert tables == []


def test_read_of_a_journal_from_a_newer_gapline(tmp_path: Path) -> None:
    store = tmp_path / "j.sqlite3"
    seed(store, [message(0, "hello")])
    with sqlite3.connect(store) as db:
        db.execute("INSERT INTO gapline_schema_migrations VALUES ('journal', 999, 'future', '')")
    code, out, err = journal_read(str(store))
    assert (code, out) == (Exit.STORE, "")
    assert one_line(err, "gapline journal read").startswith(
        f"gapline journal read: cannot read --store {store}"
    )


def test_read_of_an_unreachable_postgres_server() -> None:
    code, _, err = journal_read("postgresql://gapline@127.0.0.1:9/journal")
    assert code == Exit.STORE
    assert one_line(err, "gapline journal read").startswith("gapline journal read: cannot open")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--before", "99999999999999999999999:$x"], "out of range"),
        (["--before", "12:"], "not a cursor"),
        (["--thread", "root"], "event ID"),
        (["--limit", "-1"], "positive"),
    ],
)
def test_read_bad_values(tmp_path: Path, args: list[str], says: str) -> None:
    store = tmp_path / "j.sqlite3"
    seed(store, [message(0, "hello")])
    code, out, err = journal_read(str(store), *args)
    assert (code, out) == (Exit.USAGE, "")
    assert says in only_line(err, "gapline journal read")


def test_read_pages_with_the_cursor_it_prints(tmp_path: Path) -> None:
    store = tmp_path / "j.sqlite3"
    seed(store, [message(n, f"body {n}") for n in range(7)])
    bodies: list[str] = []
    args: list[str] = ["--limit", "3"]
    for _ in range(5):
        code, out, err = journal_read(str(store), *args)
        assert code == Exit.OK
        bodies[:0] = [json.loads(line)["body"] for line in out.splitlines()]
        last = err.splitlines()[-1]
        if last == "start of the conversation":
            break
        assert last.startswith("next page: --before '")
        args = ["--limit", "3", "--before", last.removeprefix("next page: --before ").strip("'")]
    else:
        pytest.fail("never reached the start of the conversation")
    assert bodies == [f"body {n}" for n in range(7)]


# -- relay serve ----------------------------------------------------------------------------


def relay(*extra: str) -> tuple[int, str, str]:
    return gapline("relay", "serve", "--retention", "60", *extra)


def test_relay_key_file_that_does_not_exist(tmp_path: Path) -> None:
    code, _, err = relay("--store", str(tmp_path / "r.db"), "--relay-key", str(tmp_path / "k"))
    assert code == Exit.USAGE
    assert only_line(err, "gapline relay serve").endswith(
        f"--relay-key {tmp_path / 'k'}: no such file"
    )


def test_relay_key_file_that_is_not_a_key(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("not a key")
    code, _, err = relay(
        "--store", str(tmp_path / "r.db"), "--relay-key", str(key), "--listen", "127.0.0.1:0"
    )
    assert code == Exit.USAGE
    assert "is not a P-256 key" in one_line(err, "gapline relay serve")


def test_relay_store_that_cannot_be_opened(tmp_path: Path) -> None:
    code, _, err = relay("--store", str(tmp_path), "--listen", "127.0.0.1:0")
    assert code == Exit.STORE
    assert one_line(err, "gapline relay serve").startswith(
        f"gapline relay serve: cannot open --store {tmp_path}"
    )


def test_relay_address_in_use(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, out, err = relay("--store", str(tmp_path / "r.db"), "--listen", f"127.0.0.1:{port}")
    assert (code, out) == (Exit.FAILED, "")
    assert one_line(err, "gapline relay serve").startswith(
        f"gapline relay serve: cannot serve on 127.0.0.1:{port}:"
    )


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--base-path", "meshline", "base path must start with /"),
        ("--cleanup-interval", "0", "positive number"),
        ("--rate", "-5", "positive number"),
        ("--listen", "localhost", "HOST:PORT"),
    ],
)
def test_relay_bad_values(tmp_path: Path, flag: str, value: str, says: str) -> None:
    code, _, err = relay("--store", str(tmp_path / "r.db"), flag, value)
    assert code == Exit.USAGE
    assert says in only_line(err, "gapline relay serve")
    assert list(tmp_path.iterdir()) == []


def test_relay_accepts_db_as_the_same_flag_as_store(tmp_path: Path) -> None:
    for flag in ("--store", "--db"):
        code, _, err = relay(flag, "mysql://x", "--listen", "127.0.0.1:0")
        assert code == Exit.USAGE and "unknown database URL scheme" in err
