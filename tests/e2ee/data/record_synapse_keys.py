"""Record real Synapse answers to /keys/query and /keys/claim for the unit tests.

Starts a throwaway Synapse, gives two users a device each (one matrix-nio, one
gapline), and writes what Synapse answers a third user's query and claim to
``synapse_keys.json`` beside this file. Run it again only to refresh the data:

    python tests/e2ee/data/record_synapse_keys.py
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
from pathlib import Path

import httpx
import nio

from gapline.e2ee import CryptoDriver
from gapline.matrix.devserver import SynapseServer
from gapline.storage import open_backend

OUT = Path(__file__).with_name("synapse_keys.json")


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp, SynapseServer.start() as server:
        nio_user = await server.register_user("niouser")
        gap_user = await server.register_user("gapuser")
        reader = await server.register_user("reader")
        peer = nio.AsyncClient(
            server.base_url,
            nio_user.user_id,
            store_path=tmp,
            config=nio.AsyncClientConfig(encryption_enabled=True),
        )
        await peer.login("password", device_name="nio")
        await peer.keys_upload()
        backend = await open_backend(os.path.join(tmp, "g.db"))
        async with server.client(gap_user) as client:
            driver = await CryptoDriver.open(backend, client, os.urandom(32))
            await driver.send_outgoing()
        await backend.close()
        headers = {"Authorization": f"Bearer {reader.access_token}"}
        users = {nio_user.user_id: [], gap_user.user_id: []}
        devices = {nio_user.user_id: str(peer.device_id), gap_user.user_id: gap_user.device_id}
        async with httpx.AsyncClient(
            base_url=server.base_url, headers=headers, trust_env=False
        ) as http:
            query = (
                await http.post("/_matrix/client/v3/keys/query", json={"device_keys": users})
            ).json()
            claim_body = {
                "one_time_keys": {u: {d: "signed_curve25519"} for u, d in devices.items()}
            }
            claim = (await http.post("/_matrix/client/v3/keys/claim", json=claim_body)).json()
        await peer.close()
    data = {
        "query_users": list(users),
        "devices": devices,
        "keys_query": query,
        "keys_claim": claim,
    }
    OUT.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    asyncio.run(main())
