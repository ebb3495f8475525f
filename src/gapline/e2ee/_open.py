"""Opening a machine from a `gapline.storage` backend, and saving to it.

``open_machine`` migrates the ``e2ee`` schema, reads the whole state in one
snapshot, and rebuilds the machine off the event loop (unpickling is CPU
work). A store without an account gets a new one, saved before the machine is
returned, so the device identity exists on disk before any key is published.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from gapline.storage import Backend, Tx

from ._errors import CryptoStoreError
from ._machine import CryptoMachine, _wall_ms
from ._schema import E2EE_MIGRATIONS, E2EE_SCHEMA
from ._store import StoredState, load_state, save_changes

__all__ = ["open_machine"]


async def open_machine(
    backend: Backend,
    store_key: bytes,
    *,
    user_id: str,
    device_id: str,
    clock: Callable[[], int] = _wall_ms,
) -> CryptoMachine:
    """The device's machine from ``backend``, created (and saved) on first use.

    Raises `WrongStoreKey`, `CorruptCryptoStore` (nothing loaded), or `CryptoStoreError`
    when the store belongs to another user or device.
    """
    await backend.migrate(E2EE_SCHEMA, E2EE_MIGRATIONS)
    state = await backend.read(load_state)
    if state.account is None:
        machine = CryptoMachine.create(store_key, user_id, device_id, clock=clock)
        changes = machine.take_changes()

        def create(tx: Tx) -> StoredState | None:
            # Two processes opening a new store at once: the first account written wins.
            if tx.one("SELECT 1 FROM e2ee_account WHERE id = 1") is not None:
                return load_state(tx)
            save_changes(tx, changes)
            return None

        raced = await backend.write(create)
        if raced is None:
            return machine
        state = raced
    if state.account is None:  # pragma: no cover - the write above guarantees a row
        raise CryptoStoreError("the account row vanished while opening")
    loaded = state
    return await asyncio.to_thread(
        lambda: CryptoMachine.from_state(
            loaded, store_key, user_id=user_id, device_id=device_id, clock=clock
        )
    )
