"""Every log record of a relay under test, down to debug, from every logger.

The relay logs JSON lines; the abuse tests check what it logged (one debug line per
disconnect, no traceback anywhere) and wait for a record instead of sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Generator

from gapline.relay.cli import JsonLogFormatter

__all__ = ["Captured", "capture_logs"]

_NOISY = ("httpx", "httpcore", "hpack", "websockets", "hypothesis")


class Captured(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self._waiters: list[tuple[Callable[[logging.LogRecord], bool], asyncio.Future[None]]] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.split(".")[0] in _NOISY:
            return
        self.records.append(record)
        for test, future in list(self._waiters):
            if test(record):
                future.get_loop().call_soon_threadsafe(_resolve, future)

    def matching(self, msg: str) -> list[logging.LogRecord]:
        return [r for r in self.records if r.getMessage() == msg]

    async def wait_for(self, msg: str, count: int = 1) -> list[logging.LogRecord]:
        """The records with message ``msg`` once there are ``count`` of them."""
        while len(self.matching(msg)) < count:
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            entry = (lambda r: r.getMessage() == msg, future)
            self._waiters.append(entry)
            try:
                if len(self.matching(msg)) < count:
                    await future
            finally:
                self._waiters.remove(entry)
        return self.matching(msg)

    def tracebacks(self) -> list[str]:
        """Records carrying an exception, and anything at error level or above."""
        return [
            JsonLogFormatter().format(r)
            for r in self.records
            if r.exc_info or r.exc_text or r.levelno >= logging.ERROR
        ]

    def lines(self) -> list[str]:
        return [JsonLogFormatter().format(r) for r in self.records]


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


@contextlib.contextmanager
def capture_logs() -> Generator[Captured]:
    handler = Captured()
    root = logging.getLogger()
    names = ["gapline", "aiohttp", "asyncio"]
    saved = {name: logging.getLogger(name).level for name in names}
    root.addHandler(handler)
    for name in names:
        logging.getLogger(name).setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)
