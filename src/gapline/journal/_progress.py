"""Streaming progress is transport-only: the bot's own in-progress edits never
become conversation content.

One pure predicate, applied wherever events are projected (admission and hydration
both call :func:`gapline.journal._projection.parse_event`, which consults it): a
hydration walk fetches the whole relation tree and would otherwise reinstall every
progress edit on the first cold read of a room.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["PROGRESS_STATUSES", "STREAM_STATUS_KEY", "is_streaming_progress"]

STREAM_STATUS_KEY = "io.gapline.stream_status"
"""Key in an edit's visible content (``m.new_content``) marking streaming state."""

PROGRESS_STATUSES = frozenset({"pending", "streaming"})


def is_streaming_progress(
    *, principal_id: str, sender: str, rel_type: str | None, visible_content: Mapping[str, Any]
) -> bool:
    """True for a self-authored ``m.replace`` whose visible content is still in progress.

    User-authored edits reduce normally, whatever they carry: only the bound principal's
    own streaming edits are transport.
    """
    return (
        rel_type == "m.replace"
        and sender == principal_id
        and visible_content.get(STREAM_STATUS_KEY) in PROGRESS_STATUSES
    )
