"""Multi-row statements: the stores write many rows with one statement where they can.

On SQLite every statement is one driver call that drops and re-takes the GIL the event
loop needs, so one statement for a whole batch of rows is much cheaper than one per row.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

__all__ = ["MAX_ROWS", "chunks", "flat"]

_Row = TypeVar("_Row")

MAX_ROWS = 500  # rows per multi-row statement: far below SQLite's 32,766 parameters


def chunks(rows: list[_Row]) -> list[list[_Row]]:
    """``rows`` in slices of at most ``MAX_ROWS``, one multi-row statement each."""
    return [rows[i : i + MAX_ROWS] for i in range(0, len(rows), MAX_ROWS)]


def flat(rows: Iterable[Sequence[Any]]) -> list[Any]:
    """The parameters of a multi-row statement: every row's values, row after row."""
    return [x for row in rows for x in row]
