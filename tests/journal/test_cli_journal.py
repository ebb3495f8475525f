"""`gapline journal read` and the `gapline bot` flags, in-process."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from gapline.cli import main
from gapline.journal import EventKind, JournalStore, Provenance
from gapline.journal._ingress import inbound_event
from gapline.matrix import ClientEvent
from gapline.storage import open_backend

ROOM = "!room:example.org"
BOT = "@bot:example.org"


def message(n: int, body: str, **content: object) -> ClientEvent:
    return ClientEvent(
        event_id=f"$m{n}:example.org",
        type="m.room.message",
        sender="@alice:example.org",
        origin_server_ts=1_700_000_000_000 + n,
        content={"msgtype": "m.text", "body": body, **content},
    )


def seed(store: Path, events: list[ClientEvent], principal: str = BOT) -> None:
    async def go() -> None:
        backend = await open_backend(str(store))
        try:
            journal = (await JournalStore.open(backend)).principal(principal)
            for event in events:
                kind = (
                    EventKind.REDACTION
                    if event.type == "m.room.redaction"
                    else EventKind.CONTEXT_ONLY
                )
                await journal.admit(
                    inbound_event(ROOM, event, kind=kind, provenance=Provenance.LIVE), epoch=0
                )
        finally:
            await backend.close()

    asyncio.run(go())


def redacted_revision() -> tuple[ClientEvent, ClientEvent, ClientEvent]:
    """A message, its edit, and the redaction of that visible edit (a refresh debt)."""
    original = message(0, "v0")
    fix = message(
        1,
        "* v1",
        **{
            "m.new_content": {"msgtype": "m.text", "body": "v1"},
            "m.relates_to": {"rel_type": "m.replace", "event_id": original.event_id},
        },
    )
    redaction = ClientEvent(
        event_id="$red:example.org",
        type="m.room.redaction",
        sender="@alice:example.org",
        origin_server_ts=1_700_000_000_100,
        content={"redacts": fix.event_id},
        redacts=fix.event_id,
    )
    return original, fix, redaction


def read(
    capsys: pytest.CaptureFixture[str], store: Path, *extra: str, principal: str = BOT
) -> tuple[int, list[dict[str, object]], str]:
    code = main(
        ["journal", "read", "--store", str(store), "--principal", principal, "--room", ROOM, *extra]
    )
    out, err = capsys.readouterr()
    return code, [json.loads(line) for line in out.splitlines()], err


def test_read_prints_the_newest_rows_oldest_first_and_pages_by_cursor(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "j.sqlite3"
    seed(store, [message(n, f"body {n}") for n in range(7)])
    code, rows, _ = read(capsys, store, "--limit", "3")
    assert code == 0
    assert [r["body"] for r in rows] == ["body 4", "body 5", "body 6"]
    assert set(rows[0]) == {"event_id", "sender", "created_ts", "thread_id", "body", "edited"}
    cursor = f"{rows[0]['created_ts']}:{rows[0]['event_id']}"
    code, older, _ = read(capsys, store, "--limit", "3", "--before", cursor)
    assert [r["body"] for r in older] == ["body 1", "body 2", "body 3"]


def test_threads_edits_and_other_principals(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "j.sqlite3"
    root = message(0, "root")
    reply = message(
        1, "reply", **{"m.relates_to": {"rel_type": "m.thread", "event_id": root.event_id}}
    )
    fix = message(
        2,
        "* reply!",
        **{
            "m.new_content": {"msgtype": "m.text", "body": "reply!"},
            "m.relates_to": {"rel_type": "m.replace", "event_id": reply.event_id},
        },
    )
    seed(store, [root, reply, fix])
    _, rows, _ = read(capsys, store, "--thread", root.event_id)
    assert [(r["body"], r["edited"], r["thread_id"]) for r in rows] == [
        ("reply!", True, root.event_id)
    ]
    code, rows, _ = read(capsys, store, principal="@someone-else:example.org")
    assert code == 0 and rows == []


def test_a_redacted_revision_is_omitted_or_fails_a_strict_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "j.sqlite3"
    original, fix, redaction = redacted_revision()
    seed(store, [original, fix, redaction])
    code, rows, _ = read(capsys, store)
    assert code == 0 and rows == []
    code, rows, err = read(capsys, store, "--strict")
    assert code == 3 and rows == [] and original.event_id in err


@pytest.mark.parametrize(
    "args",
    [["--before", "not-a-cursor"], ["--limit", "0"], ["--thread", ""]],
)
def test_bad_input_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str]
) -> None:
    store = tmp_path / "j.sqlite3"
    try:
        code, _, err = read(capsys, store, *args)
    except SystemExit as exit_:  # argparse rejects --limit 0 itself
        code, err = int(exit_.code or 0), capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and err


def test_bot_refuses_an_unknown_handler(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "bot",
            "--homeserver",
            "http://127.0.0.1:9",
            "--user",
            BOT,
            "--password",
            "pw",
            "--store",
            str(tmp_path / "j.sqlite3"),
            "--handler",
            "no_such_handler",
        ]
    )
    assert code == 2 and "unknown handler" in capsys.readouterr().err


def test_bot_reports_an_unreachable_homeserver_as_a_logged_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        [
            "bot",
            "--homeserver",
            "http://127.0.0.1:9",
            "--user",
            BOT,
            "--password",
            "pw",
            "--store",
            str(tmp_path / "j.sqlite3"),
            "--handler",
            "echo",
        ]
    )
    err = capsys.readouterr().err
    assert code == 1
    records = [json.loads(line) for line in err.splitlines()]
    assert records[-1]["level"] == "error" and records[-1]["msg"] == "bot failed"
    assert "Traceback" not in err


# -- journal export -------------------------------------------------------------------------


def export(capsys: pytest.CaptureFixture[str], store: Path, *extra: str) -> tuple[int, str, str]:
    code = main(
        ["journal", "export", "--store", str(store), "--principal", BOT, "--room", ROOM, *extra]
    )
    out, err = capsys.readouterr()
    return code, out, err


def test_export_writes_the_whole_conversation_page_after_page(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "j.sqlite3"
    seed(store, [message(n, f"body {n}") for n in range(1234)])  # more than one page
    code, out, err = export(capsys, store, "--format", "jsonl")
    assert code == 0
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["body"] for r in rows] == [f"body {n}" for n in range(1234)]
    # The same objects `journal read` prints.
    _, newest, _ = read(capsys, store, "--limit", "3")
    assert rows[-3:] == newest
    assert err.splitlines()[-1] == (
        "exported 1234 messages; never hydrated from the homeserver: older messages may be missing"
    )


def test_export_of_a_thread_starts_with_its_root_and_markdown_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "j.sqlite3"
    root = message(0, "what about lunch?")
    replies = [
        message(
            n, f"reply {n}", **{"m.relates_to": {"rel_type": "m.thread", "event_id": root.event_id}}
        )
        for n in range(1, 4)
    ]
    seed(store, [root, message(9, "elsewhere"), *replies])
    code, out, _ = export(capsys, store, "--thread", root.event_id, "--format", "jsonl")
    assert code == 0
    assert [json.loads(line)["body"] for line in out.splitlines()] == [
        "what about lunch?", "reply 1", "reply 2", "reply 3",
    ]  # fmt: skip
    code, out, _ = export(capsys, store, "--thread", root.event_id, "--format", "markdown")
    assert code == 0
    assert out.startswith(f"# Conversation in {ROOM}, thread {root.event_id}\n")
    assert out.index("what about lunch?") < out.index("reply 1") < out.index("reply 3")
    assert "elsewhere" not in out and "**@alice:example.org** · 2023-11-14 22:13:20 UTC" in out


def test_export_reads_only_and_fails_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nothing-here.sqlite3"
    code, out, err = export(capsys, missing, "--format", "jsonl")
    assert code == 4 and out == "" and len(err.strip().splitlines()) == 1
    assert not missing.exists()  # never a new empty journal
    store = tmp_path / "j.sqlite3"
    original, fix, redaction = redacted_revision()
    seed(store, [original, fix, redaction, message(2, "fine")])
    code, out, err = export(capsys, store, "--format", "jsonl")
    assert code == 0 and [json.loads(line)["body"] for line in out.splitlines()] == ["fine"]
    assert "1 redacted or unresolved revisions left out" in err.splitlines()[-1]
    code, out, err = export(capsys, store, "--format", "jsonl", "--strict")
    assert code == 3 and original.event_id in err and len(err.strip().splitlines()) == 1
    with pytest.raises(SystemExit) as bad:
        main(["journal", "export", "--store", str(store), "--principal", BOT, "--room", ROOM,
              "--format", "csv"])  # fmt: skip
    assert bad.value.code == 2


@pytest.mark.parametrize(
    "extra",
    [
        ["--limit", "9" * 5000],
        ["--limit", "9" * 40],
        ["--limit", "10001"],
        ["--limit", "٣"],
        ["--limit", "-1"],
        ["--before", "9" * 5000 + ":$e:x"],
        ["--before", "9" * 25 + ":$e:x"],
        ["--before", "١٢:$e:x"],
        ["--before", "12:" + "e" * 300],
        ["--room", "!" + "r" * 5000],
        ["--thread", "$t\x00"],
        ["--principal", "@bot\n:example.org"],
    ],
)
def test_hostile_arguments_are_refused_before_the_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str]
) -> None:
    store = tmp_path / "j.sqlite3"
    seed(store, [message(1, "hello")])
    args = ["journal", "read", "--store", str(store), "--principal", BOT, "--room", ROOM, *extra]
    with pytest.raises(SystemExit) as info:
        main(args)
    _, err = capsys.readouterr()
    assert info.value.code == 2 and "Traceback" not in err and len(err) < 2000
    code, rows, _ = read(capsys, store, "--limit", "10000")  # the largest limit still reads
    assert code == 0 and [r["body"] for r in rows] == ["hello"]
