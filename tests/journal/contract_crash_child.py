"""Child process for the crash test: admits and settles, reporting each commit on stdout.

Run as ``python -m tests.journal.contract_crash_child DSN PRINCIPAL``. It loops forever;
the parent SIGKILLs it mid-way and reopens the store. Each line is written only after
the operation it names returned (i.e. committed): ``admitted <id>`` or ``settled <id>``.
"""

from __future__ import annotations

import asyncio
import json
import sys

from gapline.journal import EventKind, InboundEvent, JournalStore
from gapline.storage import open_backend


async def main(dsn: str, principal: str) -> None:
    backend = await open_backend(dsn)
    store = await JournalStore.open(backend)
    bot = store.principal(principal)
    n = 0
    while True:
        n += 1
        event_id = f"$crash{n:06d}"
        content = json.dumps({"msgtype": "m.text", "body": f"message {n}"})
        event = InboundEvent(
            event_id, "!crash:x", None, "@u:x", n, "m.room.message", content, EventKind.ACTIONABLE
        )
        await bot.admit(event, epoch=0)
        print(f"admitted {event_id}", flush=True)
        if n % 2 == 0:  # settle every other one: the rest stay pending
            await bot.settle(event_id)
            print(f"settled {event_id}", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
