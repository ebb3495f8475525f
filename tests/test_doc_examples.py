"""Every runnable example in the README and docs/ runs as written.

In the Markdown, a fenced block right after ``<!-- example: NAME -->`` is an
example; ``<!-- example: NAME file=F -->`` is a file that the next example of the
same doc uses (saved as F in its directory). A command block that is not run
says why, right before it: ``<!-- not run: WHY -->``. Every block that looks like
a command (``sh``, or a first line starting with ``gapline``, ``make``, ``$`` or
``.venv/bin/``) carries one of the two, so an example cannot be added untested.

Each example runs with this environment's ``gapline`` console script first on
PATH, no ``PYTHONPATH``, in a fresh directory (README examples: the repository,
as the README says). ``sh`` blocks run with ``bash -e``; ``python`` blocks are
saved and run with this interpreter. An example that runs to its end must exit 0.
A command that serves until stopped (a bot, a relay) is started as written,
used as a person would (the test says what it checks), and stopped with Ctrl-C
or SIGTERM, after which it must exit 0. What the text cannot know is replaced
and nothing else: the homeserver ``http://127.0.0.1:8008`` becomes the throwaway
Synapse's address, the relay's port 8787 a free port, and the room
``'!abc:localhost'`` the room the test made.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from gapline.devports import free_port
from gapline.matrix import MatrixHTTPError, Session
from gapline.matrix.devserver import SynapseServer
from tests.activity import Activity
from tests.integration.bot_support import answers_by_source, eventually, room_events, wait_joined

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
MARKER = re.compile(r"<!-- (?:example: (?P<name>[\w-]+)(?: file=(?P<file>\S+))?|not run: \S.*) -->")
COMMAND_LANGS = {"sh", "shell", "bash", "console"}
COMMAND_STARTS = ("gapline ", "make ", "$ ", ".venv/bin/")

HOMESERVER = "http://127.0.0.1:8008"
EXAMPLE_ROOM = "'!abc:localhost'"
BOT = "@bot:localhost"
BOT_PASSWORD = "secret"


@dataclass(frozen=True)
class Block:
    doc: Path
    line: int
    lang: str
    text: str
    marker: str | None

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(REPO)}:{self.line}"

    @property
    def name(self) -> str | None:
        match = MARKER.fullmatch(self.marker or "")
        return match["name"] if match else None

    @property
    def file(self) -> str | None:
        match = MARKER.fullmatch(self.marker or "")
        return match["file"] if match else None

    def looks_like_a_command(self) -> bool:
        first = next((line.strip() for line in self.text.splitlines() if line.strip()), "")
        return self.lang in COMMAND_LANGS or first.startswith(COMMAND_STARTS)


def blocks(doc: Path) -> Iterator[Block]:
    lines = doc.read_text().splitlines()
    at = 0
    while at < len(lines):
        if not lines[at].startswith("```"):
            at += 1
            continue
        start, lang = at, lines[at][3:].strip()
        end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("```"))
        before = next((lines[i].strip() for i in range(start - 1, -1, -1) if lines[i].strip()), "")
        marker = before if before.startswith("<!--") else None
        yield Block(doc, start + 1, lang, "\n".join(lines[start + 1 : end]) + "\n", marker)
        at = end + 1


ALL_BLOCKS = [block for doc in DOCS for block in blocks(doc)]
EXAMPLES = {block.name: block for block in ALL_BLOCKS if block.name}

# Each example and the test that runs it.
RUN_BY = {
    "readme-first-look": "test_an_example_that_runs_to_its_end",
    "bridge-session": "test_an_example_that_runs_to_its_end",
    "send-queue": "test_an_example_that_runs_to_its_end",
    "relay-serve": "test_the_relay_example_serves_until_sigterm",
    "bot-run": "test_the_bot_examples_answer_and_the_journal_pages",
    "journal-read": "test_the_bot_examples_answer_and_the_journal_pages",
    "journal-export": "test_the_bot_examples_answer_and_the_journal_pages",
    "bot-approve": "test_the_approve_example_asks_before_it_answers",
    "journal-handler": "test_the_handler_example_is_found_beside_the_bot",
    "journal-handler-run": "test_the_handler_example_is_found_beside_the_bot",
    "key-file-and-recovery-key": "test_the_key_file_example_refuses_a_wrong_passphrase",
    "recovery-session": "test_an_example_that_runs_to_its_end",
    "accounts-session": "test_an_example_that_runs_to_its_end",
}


def test_every_command_block_is_an_example_or_says_why_not() -> None:
    unmarked = [b.where for b in ALL_BLOCKS if b.looks_like_a_command() and b.marker is None]
    assert unmarked == [], "command blocks with neither <!-- example --> nor <!-- not run -->"
    bad = [b.where for b in ALL_BLOCKS if b.marker and not MARKER.fullmatch(b.marker)]
    assert bad == [], "markers that do not parse"


def test_every_example_is_run_by_a_test() -> None:
    assert set(EXAMPLES) == set(RUN_BY)
    names = [b.name for b in ALL_BLOCKS if b.name]
    assert len(names) == len(set(names)), "an example name is used twice"
    here = globals()
    assert all(callable(here.get(test)) for test in RUN_BY.values())


def environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GAPLINE_", "PYTHONPATH"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["NO_PROXY"] = "127.0.0.1,localhost"
    return {**env, **extra}


def command(block: Block, cwd: Path, **replace: str) -> list[str]:
    """How a block runs in ``cwd``: bash for shell; Python saved as a file, then run."""
    text = block.text
    for old, new in replace.items():
        assert old in text, f"{block.where} no longer says {old!r}"
        text = text.replace(old, new)
    if block.lang == "python":
        script = cwd / f"{block.name}.py"
        script.write_text(text)
        return [sys.executable, str(script)]
    return ["bash", "-e", "-c", text]


def save_files_before(block: Block, cwd: Path) -> None:
    """The ``file=`` blocks of the same doc that come before ``block``, saved in ``cwd``."""
    for other in ALL_BLOCKS:
        if other.doc == block.doc and other.file and other.line < block.line:
            (cwd / other.file).write_text(other.text)


# -- examples that run to their end ----------------------------------------------------------


@pytest.mark.synapse
@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "name",
    ["readme-first-look", "bridge-session", "send-queue", "recovery-session", "accounts-session"],
)
def test_an_example_that_runs_to_its_end(name: str, tmp_path: Path) -> None:
    block = EXAMPLES[name]
    cwd = REPO if block.doc.name == "README.md" else tmp_path
    tmp = tmp_path / "tmp"
    tmp.mkdir()  # TMPDIR: where a demo or a throwaway homeserver keeps its files
    done = subprocess.run(
        command(block, cwd), cwd=cwd, env=environment(TMPDIR=str(tmp)),
        capture_output=True, text=True, timeout=540, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, f"{block.where}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert "Traceback" not in done.stderr
    if name == "readme-first-look":
        assert done.stdout.startswith("gapline ")
        assert "gap filled:" in done.stdout and "continuity Verified" in done.stdout
        assert "examples:" in done.stdout  # the relay's help
    elif name == "send-queue":
        ok, offline, online = done.stdout.splitlines()
        assert ok == "Ok()" and offline.endswith("Pending: 'Pending'>, message=None)")
        assert online.split()[1] == offline.split()[1] and online.endswith(" None")
    elif name == "recovery-session":
        assert "wrong recovery key" in done.stdout
        assert "imported 0 sessions" in done.stdout
    elif name == "accounts-session":
        assert "holds 2 accounts" in done.stdout and "pick one with --user" in done.stdout
        assert "device listed after logout: False" in done.stdout
    else:
        assert '"phase":"Ready","continuity":"Verified"' in done.stdout
    # Whatever the example started is gone: the demo's and the script's homeservers.
    assert list(tmp.iterdir()) == []


def test_the_key_file_example_refuses_a_wrong_passphrase(tmp_path: Path) -> None:
    block = EXAMPLES["key-file-and-recovery-key"]
    done = subprocess.run(
        command(block, tmp_path), cwd=tmp_path, env=environment(),
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, f"{block.where}\n{done.stderr[-3000:]}"
    lines = done.stdout.splitlines()
    assert lines[0] == "bad_mac" and "parity" in lines[1]


# -- the relay ------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_the_relay_example_serves_until_sigterm(tmp_path: Path) -> None:
    block = EXAMPLES["relay-serve"]
    port = free_port()
    proc = subprocess.Popen(
        command(block, tmp_path, **{"127.0.0.1:8787": f"127.0.0.1:{port}"}),
        cwd=tmp_path, env=environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        listening = json.loads(proc.stdout.readline())["listening"]
        assert listening["url"] == f"http://127.0.0.1:{port}/meshline/v1"
        health = httpx.get(f"http://127.0.0.1:{port}/health", trust_env=False, timeout=30)
        assert health.json()["status"] == "ok"
        os.killpg(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, err
    assert (tmp_path / "relay.db").is_file()


# -- the bot --------------------------------------------------------------------------------


async def account(server: SynapseServer, localpart: str, password: str) -> Session:
    """The user, registered on the first call and logged in on later ones."""
    try:
        return await server.register_user(localpart, password)
    except MatrixHTTPError as exc:
        if exc.errcode != "M_USER_IN_USE":
            raise
        return await server.login(localpart, password)


class RunningExample:
    """A serving example as a child process in its own session, logs in a file.

    Its stderr is pumped into the file line by line (`Activity.pump`), so each log line
    is a signal for `eventually`: a probe of the file is re-checked when the child wrote.
    """

    def __init__(self, argv: list[str], cwd: Path) -> None:
        self.log = cwd / "stderr.log"
        self.log.write_bytes(b"")
        self.proc = subprocess.Popen(
            argv, cwd=cwd, env=environment(), stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        assert self.proc.stderr is not None
        self._pump = Activity.current().pump(self.proc.stderr, self.log.open("ab"))

    async def until_ready(self) -> None:
        async def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"the bot exited {self.proc.returncode}:\n{self.tail()}")
            return '"msg": "ready"' in self.log.read_text()

        await eventually(ready, within=120, what="the bot's first sync")

    def tail(self) -> str:
        return self.log.read_text()[-3000:]

    async def interrupt(self) -> int:
        """Ctrl-C, as at the terminal: SIGINT to the example's process group."""
        os.killpg(self.proc.pid, signal.SIGINT)
        return await asyncio.to_thread(self.proc.wait, 60)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


async def answer_to(server: SynapseServer, alice: Session, room: str, body: str) -> str:
    """Alice says ``body``; the final text of the bot's answer to it."""
    async with server.client(alice) as client:
        sent = await client.send_text(room, body)

        async def final() -> str | None:
            answers = answers_by_source(await room_events(client, room), BOT).get(sent, [])
            return answers[0].final_body if answers else None

        return await eventually(final, within=120, what=f"the answer to {body!r}")


def run_to_end(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=cwd, env=environment(), capture_output=True, text=True, timeout=60
    )


@pytest.fixture
async def alice(synapse: SynapseServer) -> Session:
    """The accounts the examples name: the bot (its password is in the text) and alice."""
    await account(synapse, "bot", BOT_PASSWORD)
    return await account(synapse, "alice", "alice-password")


async def room_with_the_bot(server: SynapseServer, alice: Session) -> str:
    room = await server.create_room(alice, name="doc example")
    await server.invite(alice, room, BOT)
    async with server.client(alice) as client:
        await wait_joined(client, room, BOT)
    return room


@pytest.mark.timeout(300)
async def test_the_bot_examples_answer_and_the_journal_pages(
    synapse: SynapseServer, alice: Session, tmp_path: Path
) -> None:
    bot = RunningExample(
        command(EXAMPLES["bot-run"], tmp_path, **{HOMESERVER: synapse.base_url}), tmp_path
    )
    try:
        await bot.until_ready()
        assert (tmp_path / "bot.password").stat().st_mode & 0o077 == 0
        room = await room_with_the_bot(synapse, alice)
        assert await answer_to(synapse, alice, room, "hello") == "echo: hello"
        assert await bot.interrupt() == 0, bot.tail()
    finally:
        bot.kill()
    assert "Traceback" not in bot.tail()

    # journal read, then each page before it, as the "next page:" line says.
    first_page = command(EXAMPLES["journal-read"], tmp_path, **{EXAMPLE_ROOM: f"'{room}'"})
    read = first_page
    bodies: list[str] = []
    for _ in range(10):
        done = await asyncio.to_thread(run_to_end, read, tmp_path)
        assert done.returncode == 0, done.stderr
        rows = [json.loads(line) for line in done.stdout.splitlines()]
        assert len(rows) <= 2 and all(row["event_id"].startswith("$") for row in rows)
        bodies[:0] = [row["body"] for row in rows]
        last = done.stderr.splitlines()[-1]
        if last == "start of the conversation":
            break
        assert last.startswith("next page: --before ")
        flag = last.removeprefix("next page: ")
        read = [*first_page[:-1], first_page[-1].rstrip("\n") + " " + flag]
    else:
        pytest.fail("journal read never reached the start of the conversation")
    assert bodies[-2:] == ["hello", "echo: hello"]

    # journal export: the same conversation at once, as Markdown.
    export = command(EXAMPLES["journal-export"], tmp_path, **{EXAMPLE_ROOM: f"'{room}'"})
    done = await asyncio.to_thread(run_to_end, export, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"# Conversation in {room}\n")
    assert [b for b in bodies if b in done.stdout] == bodies
    assert done.stdout.index("hello") < done.stdout.index("echo: hello")
    assert done.stderr.splitlines()[-1].startswith(f"exported {len(bodies)} messages")


@pytest.mark.timeout(300)
async def test_the_handler_example_is_found_beside_the_bot(
    synapse: SynapseServer, alice: Session, tmp_path: Path
) -> None:
    block = EXAMPLES["journal-handler-run"]
    save_files_before(block, tmp_path)
    assert (tmp_path / "myhandlers.py").is_file()
    bot = RunningExample(command(block, tmp_path, **{HOMESERVER: synapse.base_url}), tmp_path)
    try:
        await bot.until_ready()
        room = await room_with_the_bot(synapse, alice)
        first = await answer_to(synapse, alice, room, "the meeting moved to 3pm")
        assert first == "0 messages before yours; this is your first"
        second = await answer_to(synapse, alice, room, "and the agenda?")
        # What came before is read, never this turn's own placeholder reply.
        assert second.endswith("messages before yours; you last said: the meeting moved to 3pm")
        assert await bot.interrupt() == 0, bot.tail()
    finally:
        bot.kill()
    assert "Traceback" not in bot.tail()


@pytest.mark.timeout(300)
async def test_the_approve_example_asks_before_it_answers(
    synapse: SynapseServer, alice: Session, tmp_path: Path
) -> None:
    block = EXAMPLES["bot-approve"]
    bot = RunningExample(command(block, tmp_path, **{HOMESERVER: synapse.base_url}), tmp_path)
    try:
        await bot.until_ready()
        room = await room_with_the_bot(synapse, alice)
        async with synapse.client(alice) as client:
            asked = await client.send_text(room, "hello")

            async def card() -> str | None:
                for event in await room_events(client, room):
                    relates = event.content.get("m.relates_to") or {}
                    if (
                        event.sender == BOT
                        and "io.gapline.approval" in event.content
                        and (relates.get("m.in_reply_to") or {}).get("event_id") == asked
                    ):
                        assert event.content["body"].startswith(
                            'Approval needed: echo({"text":"hello"})'
                        )
                        return event.event_id
                return None

            card_id = await eventually(card, within=120, what="the approval card")
            await client.send_event(
                room,
                "m.room.message",
                {"msgtype": "m.text", "body": "approve",
                 "m.relates_to": {"m.in_reply_to": {"event_id": card_id}}},
            )  # fmt: skip

            async def final() -> str | None:
                events = await room_events(client, room)
                plain = [e for e in events if "io.gapline.approval" not in e.content]
                answers = answers_by_source(plain, BOT).get(asked, [])
                return answers[0].final_body if answers else None

            assert await eventually(final, within=120, what="the answer") == "echo: hello"
        assert await bot.interrupt() == 0, bot.tail()
    finally:
        bot.kill()
    assert "Traceback" not in bot.tail()
