"""Child process for the key-backup crash tests: uploads or restores, reporting each step.

Run as ``python -m tests.e2ee.backup_crash_child MODE SESSION_JSON DB STORE_KEY_HEX``.

- ``upload``: one session per request; ``acked ROOM SESSION`` is printed only after the
  server's answer was committed to the store.
- ``restore``: decrypts and imports the whole backup two sessions at a time, printing
  ``decrypted N`` after each pair, and commits only at the end (``committed``).

It then waits to be killed; the parent SIGKILLs it mid-way and reopens the store.
"""

from __future__ import annotations

import asyncio
import json
import sys

from gapline.e2ee import CryptoDriver
from gapline.e2ee._backup import entries
from gapline.matrix import (
    MatrixClient,
    RoomKeysResponse,
    RoomKeysUpdateResponse,
    Session,
    crypto_api,
)
from gapline.storage import open_backend


async def main(mode: str, session_json: str, db: str, store_key_hex: str) -> None:
    session = Session.from_dict(json.loads(session_json))
    backend = await open_backend(db)
    async with MatrixClient(session.homeserver, session=session, trust_env=False) as client:
        driver = await CryptoDriver.open(backend, client, bytes.fromhex(store_key_hex))
        backup = driver.machine.backup
        if mode == "upload":
            while (upload := driver.machine.backup.next_upload(batch=1)) is not None:
                await client.request(upload.request, RoomKeysUpdateResponse)
                driver.machine.backup.upload_done(upload)
                await driver.commit()
                for room_id, session_id, _index in upload.sessions:
                    print(f"acked {room_id} {session_id}", flush=True)
                await asyncio.sleep(0.05)
        else:
            version = backup.version
            assert version is not None
            answer = await client.request(crypto_api.room_keys_get(version), RoomKeysResponse)
            items = entries(answer)
            for start in range(0, len(items), 2):
                backup.restore_entries(version, items[start : start + 2])
                print(f"decrypted {start + 2}", flush=True)
                await asyncio.sleep(0.05)
            await driver.commit()
            print("committed", flush=True)
        print("done", flush=True)
        await asyncio.sleep(3600)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
