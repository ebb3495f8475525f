"""A bot running in-process on the fake homeserver, wired to the test's `Activity`."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from typing import Any

from gapline.journal import Bot, BotConfig, Handler, echo
from gapline.matrix.testing import FakeHomeserver
from gapline.storage import Backend
from tests.activity import Activity

__all__ = ["bot_running"]


@contextlib.asynccontextmanager
async def bot_running(
    fake: FakeHomeserver,
    backend: Backend,
    *,
    store: str = "(the test's backend)",
    handler: Handler = echo,
    within: float = 30,
    **config: Any,
) -> AsyncGenerator[Bot]:
    """``@bot`` (registered on ``fake`` by the caller) running on ``backend`` until the
    block ends; each request it makes and each write it commits wakes the test's waits.
    It is yielded once its first sync is in."""
    activity = Activity.current()
    bot = Bot(
        BotConfig(
            homeserver=fake.base_url,
            user=fake.user_id("bot"),
            password="password",
            store=store,
            handler=handler,
            **config,
        ),
        backend=activity.backend(backend),
        transport=activity.transport(fake.transport),
    )
    task = asyncio.create_task(bot.run())
    try:
        ready = asyncio.create_task(bot.ready.wait())
        done, _ = await asyncio.wait({task, ready}, timeout=within, return_when="FIRST_COMPLETED")
        if task in done:
            task.result()
        assert ready in done
        yield bot
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
