"""The TUI's config file: where it is, what it may say, a clear line for each bad value,
and the app applying its keys (rebinding) and colours."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gapline.clikit import Exit
from gapline.history.rooms import RoomDirectory
from gapline.matrix import MatrixUnavailable, RetryPolicy, Session
from gapline.matrix.testing import FakeHomeserver
from gapline.tui._config import ConfigError, TuiConfig, config_path, load_config, parse_config
from gapline.tui._connection import Reachability
from gapline.tui._help import HelpScreen
from gapline.tui._keys import KEY_IDS
from gapline.tui.cli import _ObservedClient
from tests.test_cli_errors import UNREACHABLE, USER, gapline, only_line
from tests.tui.support import make_app, until

FILE = Path("/home/me/.config/gapline/tui.toml")

EXAMPLE = """\
homeserver = "https://matrix.example.org"

[keys]
next_room = "ctrl+down,ctrl+n"
fill = "g"

[colours]
theme = "textual-light"
accent = "#ff8800"
"""


def test_the_file_is_in_the_xdg_config_directory_else_dot_config() -> None:
    assert config_path({"XDG_CONFIG_HOME": "/x/conf", "HOME": "/h"}) == Path(
        "/x/conf/gapline/tui.toml"
    )
    assert config_path({"HOME": "/h"}) == Path("/h/.config/gapline/tui.toml")
    assert config_path({"XDG_CONFIG_HOME": "", "HOME": "/h"}) == Path("/h/.config/gapline/tui.toml")


def test_an_absent_file_is_the_defaults(tmp_path: Path) -> None:
    config = load_config(tmp_path / "none.toml")
    assert config == TuiConfig(path=tmp_path / "none.toml")


def test_a_full_file_reads_back() -> None:
    config = parse_config(EXAMPLE, FILE)
    assert config.homeserver == "https://matrix.example.org"
    assert dict(config.keys) == {"next_room": "ctrl+down,ctrl+n", "fill": "g"}
    assert config.theme == "textual-light"
    assert dict(config.colours) == {"accent": "#ff8800"}


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("homeserver = ", "not valid TOML"),
        ("colour = 1", "unknown key 'colour'"),
        ('homeserver = "matrix.example.org"', "homeserver: expected an http:// or https:// URL"),
        ("keys = 3", "keys: expected a table ([keys])"),
        ('[keys]\nfil = "g"', "keys.fil: no such binding"),
        ("[keys]\nfill = 7", 'keys.fill: expected keys like "ctrl+n"'),
        ('[keys]\nfill = "g,"', 'keys.fill: expected keys like "ctrl+n"'),
        ('[keys]\nfill = "q"', "keys.fill: 'q' is already bound to quit (by default)"),
        ('[keys]\nfill = "g"\nquit = "g"', "'g' is already bound to keys."),
        ('[colours]\nsender = "red"', "colours.sender: no such colour"),
        ('[colours]\naccent = "orangeish"', 'colours.accent: expected a colour like "#ff8800"'),
        ('[colours]\ntheme = "midnight"', "colours.theme: no theme 'midnight'"),
    ],
)
def test_a_bad_value_names_the_file_and_the_key(text: str, says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, FILE)
    assert str(caught.value).startswith(f"{FILE}: ")
    assert says in str(caught.value)


def test_an_unreadable_file_names_it(tmp_path: Path) -> None:
    (tmp_path / "dir.toml").mkdir()
    with pytest.raises(ConfigError, match=r"dir\.toml: cannot be read"):
        load_config(tmp_path / "dir.toml")


async def test_a_rebound_key_acts_and_the_old_one_does_not() -> None:
    app, fake = make_app()
    app.config = parse_config('[keys]\nfill = "g"\nhelp = "f1"', FILE)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: len(app.timeline.rows) == 16, "the rows")
        await pilot.press("f")
        await pilot.press("g")
        await until(pilot, lambda: len(fake.commands) >= 2, "the fill command")
        fills = [c for c in fake.commands if type(c).__name__ == "HistoryRepair"]
        assert len(fills) == 1  # g filled, f did nothing
        await pilot.press("question_mark")
        await pilot.press("f1")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen), "help on f1")
        assert isinstance(app.screen, HelpScreen)
        assert any(r.keys == "g" and r.description == "Fill gap" for r in app.screen.rows)


async def test_colours_make_a_theme_over_the_chosen_one() -> None:
    app, _ = make_app()
    app.config = parse_config('[colours]\ntheme = "nord"\naccent = "#ff8800"', FILE)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: len(app.timeline.rows) == 16, "the rows")
        assert app.theme == "gapline-config"
        theme = app.get_theme("gapline-config")
        assert theme is not None and theme.accent == "#ff8800"
        nord = app.get_theme("nord")
        assert nord is not None and theme.primary == nord.primary


def test_the_cli_refuses_a_bad_config_before_asking_anything(tmp_path: Path) -> None:
    (tmp_path / "gapline").mkdir()
    (tmp_path / "gapline" / "tui.toml").write_text('[keys]\nfil = "g"\n')
    code, out, err = gapline(
        "tui", "--homeserver", UNREACHABLE, "--user", USER, XDG_CONFIG_HOME=str(tmp_path)
    )
    assert (code, out) == (Exit.USAGE, "")
    line = only_line(err, "gapline tui")
    assert f"{tmp_path / 'gapline' / 'tui.toml'}: keys.fil: no such binding" in line


def test_the_cli_takes_the_homeserver_from_the_config(tmp_path: Path) -> None:
    config = tmp_path / "tui.toml"
    config.write_text(f'homeserver = "{UNREACHABLE}"\n')
    code, _, err = gapline(
        "tui", "--config", str(config), "--user", USER, "--store", str(tmp_path / "s")
    )
    # It went on to ask for the password (there is no terminal): the homeserver was taken.
    assert code == Exit.NO_TERMINAL
    assert "there is no terminal to ask on" in only_line(err, "gapline tui")
    code, _, err = gapline(
        "tui",
        "--config",
        str(tmp_path / "none.toml"),
        "--user",
        USER,
        "--store",
        str(tmp_path / "t"),
    )
    assert code == Exit.USAGE
    line = only_line(err, "gapline tui")
    assert "--homeserver is needed" in line and "none.toml" in line


def test_the_documented_example_parses() -> None:
    doc = Path(__file__).resolve().parents[2] / "docs" / "tui.md"
    section = doc.read_text(encoding="utf-8").split("### Configuration file", 1)[1]
    block = re.search(r"```toml\n(.*?)```", section, re.S)
    assert block is not None
    config = parse_config(block.group(1), doc)
    assert config.homeserver == "https://matrix.example.org"
    assert config.keys["fill"] == "g" and config.theme == "textual-light"
    # Every id the docs list is a binding, and every binding is listed.
    listed = re.search(r"The ids: (.*?)\. The", section, re.S)
    assert listed is not None
    assert set(re.findall(r"`(\w+)`", listed.group(1))) == KEY_IDS


async def test_the_client_the_engine_syncs_with_reports_reachability() -> None:
    """The status line's source: a refused connection marks the homeserver unreachable
    (the error still reaches the engine, which retries), an answer marks it reachable."""
    reachability = Reachability()
    directory = RoomDirectory()
    session = Session(UNREACHABLE, USER, "DEVICE1", "token")
    async with _ObservedClient(
        UNREACHABLE,
        session=session,
        directory=directory,
        reachability=reachability,
        retry=RetryPolicy(attempts=1),
        trust_env=False,
    ) as client:
        with pytest.raises(MatrixUnavailable):
            await client.sync(timeout_ms=0)
    assert reachability.problem is not None and "connection failed" in reachability.problem
    fake = FakeHomeserver()
    alice = fake.register("alice")
    fake.create_room(alice.user_id, name="zulu")
    async with _ObservedClient(
        fake.base_url,
        session=alice,
        directory=directory,
        reachability=reachability,
        transport=fake.transport,
    ) as client:
        await client.sync(timeout_ms=0)
    assert reachability.reachable
    assert [s.label for s in directory.room_list()] == ["zulu"]
