"""The TUI's configuration file: ``$XDG_CONFIG_HOME/gapline/tui.toml`` (else ``~/.config``).

Three parts, all optional::

    homeserver = "https://matrix.example.org"   # when --homeserver is not given

    [keys]                 # rebind by id: the keys, comma-separated, as Textual names them
    next_room = "ctrl+down,ctrl+n"
    fill = "g"

    [colours]              # a Textual theme, and colours over it
    theme = "textual-light"
    accent = "#ff8800"

A bad value is refused before the screen opens, in one line naming the file
and the key, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

from textual.color import Color, ColorParseError
from textual.theme import BUILTIN_THEMES

from gapline.tui._keys import DEFAULT_KEYS, KEY_IDS

__all__ = ["COLOUR_NAMES", "ConfigError", "TuiConfig", "config_path", "load_config", "parse_config"]

COLOUR_NAMES: frozenset[str] = frozenset(
    {
        "primary",
        "secondary",
        "accent",
        "foreground",
        "background",
        "surface",
        "panel",
        "boost",
        "success",
        "warning",
        "error",
    }
)
"""The theme colours ``[colours]`` may set (besides ``theme``)."""


class ConfigError(ValueError):
    """The config file cannot be used: says which file and which key, and why."""


@dataclass(frozen=True, slots=True)
class TuiConfig:
    """What the config file sets; the defaults are an absent file."""

    homeserver: str | None = None
    keys: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Binding id -> keys (Textual's keymap)."""
    theme: str | None = None
    colours: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Theme colour name -> a colour Textual parses."""
    path: Path | None = None


def config_path(environ: Mapping[str, str] | None = None) -> Path:
    """Where the config file is looked for."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_CONFIG_HOME") or str(Path(env.get("HOME") or Path.home()) / ".config")
    return Path(base) / "gapline" / "tui.toml"


def load_config(path: Path | None = None) -> TuiConfig:
    """Read the config file; an absent file is the defaults."""
    path = config_path() if path is None else path
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return TuiConfig(path=path)
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot be read: {exc}") from None
    return parse_config(text, path)


def parse_config(text: str, path: Path) -> TuiConfig:
    """The config in ``text`` (read from ``path``, which errors name)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    unknown = sorted(set(data) - {"homeserver", "keys", "colours"})
    if unknown:
        raise ConfigError(
            f"{path}: unknown key {unknown[0]!r} (known: homeserver, [keys], [colours])"
        )
    homeserver = data.get("homeserver")
    if homeserver is not None:
        parts = urlsplit(homeserver) if isinstance(homeserver, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(
                f"{path}: homeserver: expected an http:// or https:// URL, "
                f"e.g. https://matrix.example.org, not {homeserver!r}"
            )
    keys = _keys(_table(data, "keys", path), path)
    colours = dict(_table(data, "colours", path))
    theme = colours.pop("theme", None)
    if theme is not None and (not isinstance(theme, str) or not theme):
        raise ConfigError(f"{path}: colours.theme: expected a theme name, not {theme!r}")
    if theme is not None and theme not in BUILTIN_THEMES:
        raise ConfigError(
            f"{path}: colours.theme: no theme {theme!r} "
            f"(known: {', '.join(sorted(BUILTIN_THEMES))})"
        )
    return TuiConfig(
        homeserver=homeserver,
        keys=MappingProxyType(keys),
        theme=theme,
        colours=MappingProxyType(_colours(colours, path)),
        path=path,
    )


def _table(data: dict[str, Any], name: str, path: Path) -> dict[str, Any]:
    table = data.get(name, {})
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: {name}: expected a table ([{name}]), not {table!r}")
    return table


def _keys(table: dict[str, Any], path: Path) -> dict[str, str]:
    keys: dict[str, str] = {}
    for name, value in table.items():
        if name not in KEY_IDS:
            raise ConfigError(
                f"{path}: keys.{name}: no such binding (known: {', '.join(sorted(KEY_IDS))})"
            )
        parts = [k.strip() for k in value.split(",")] if isinstance(value, str) else []
        if not parts or not all(parts):
            raise ConfigError(
                f'{path}: keys.{name}: expected keys like "ctrl+n" or "g,ctrl+g", not {value!r}'
            )
        keys[name] = ",".join(parts)
    bound = {**DEFAULT_KEYS, **keys}
    taken: dict[str, str] = {}
    for name, value in sorted(bound.items(), key=lambda kv: kv[0] in keys):
        for key in value.split(","):
            other = taken.get(key)
            if other is not None:
                where = f"keys.{other}" if other in keys else f"{other} (by default)"
                raise ConfigError(f"{path}: keys.{name}: {key!r} is already bound to {where}")
            taken[key] = name
    return keys


def _colours(table: dict[str, Any], path: Path) -> dict[str, str]:
    colours: dict[str, str] = {}
    for name, value in table.items():
        if name not in COLOUR_NAMES:
            raise ConfigError(
                f"{path}: colours.{name}: no such colour "
                f"(known: theme, {', '.join(sorted(COLOUR_NAMES))})"
            )
        try:
            Color.parse(value)
        except (ColorParseError, TypeError, ValueError):
            raise ConfigError(
                f'{path}: colours.{name}: expected a colour like "#ff8800" or "red", not {value!r}'
            ) from None
        colours[name] = value
    return colours
