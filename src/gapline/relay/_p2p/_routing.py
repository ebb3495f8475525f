"""The Kademlia routing table of the relay DHT, sans-I/O: k-buckets by XOR distance.

Positions are the keyspace positions of Peer IDs (SHA-256 of their bytes,
``keyspace_position``); a peer goes into the bucket numbered by how many leading bits its
position shares with this node's (0: the far half of the keyspace, 255: the nearest). A
bucket holds at most ``k`` peers, least recently seen first. When a new peer meets a full
bucket, it waits in the bucket's replacement list and the caller is told which peer to
probe: the least recently seen one. A probe that answers moves that peer to the end
(``seen``); one that fails evicts it (``remove``), and the most recently seen replacement
takes its place. Only verified, eligible peers are ever added (the caller's rule), and a
Peer ID appears once, whatever its addresses: the one-to-one binding of relay and Peer ID
is kept by replacing a relay's old Peer ID (``remove`` it first).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from gapline.meshline import keyspace_position, xor_distance

__all__ = ["BUCKET_SIZE", "Added", "RoutingTable"]

BUCKET_SIZE = 20  # k, as in the libp2p Kademlia specification
_REPLACEMENTS = 8  # candidates kept per full bucket (local policy)


@dataclass(frozen=True, slots=True)
class Added:
    """What ``add`` did: ``stored`` (in the table now, new or refreshed), or else ``probe``
    names the least recently seen peer of the full bucket, to be probed."""

    stored: bool
    probe: bytes | None = None


class RoutingTable:
    def __init__(self, own_id: bytes, *, k: int = BUCKET_SIZE) -> None:
        self.own_position = keyspace_position(own_id)
        self.own_id = own_id
        self.k = k
        self._buckets: list[list[bytes]] = [[] for _ in range(256)]
        self._replacements: list[list[bytes]] = [[] for _ in range(256)]

    def bucket_of(self, peer_id: bytes) -> int:
        """The number of leading bits ``peer_id``'s position shares with this node's."""
        position = keyspace_position(peer_id)
        distance = int.from_bytes(
            bytes(a ^ b for a, b in zip(self.own_position, position, strict=True))
        )
        if distance == 0:
            raise ValueError("a node is not in its own routing table")
        return 256 - distance.bit_length()

    def add(self, peer_id: bytes) -> Added:
        """A verified peer was seen (connected, or answered a query)."""
        index = self.bucket_of(peer_id)
        bucket = self._buckets[index]
        if peer_id in bucket:
            bucket.remove(peer_id)
            bucket.append(peer_id)
            return Added(True)
        if len(bucket) < self.k:
            bucket.append(peer_id)
            return Added(True)
        waiting = self._replacements[index]
        if peer_id in waiting:
            waiting.remove(peer_id)
        waiting.append(peer_id)
        del waiting[:-_REPLACEMENTS]
        return Added(False, bucket[0])

    def seen(self, peer_id: bytes) -> None:
        """A peer in the table answered: it becomes the most recently seen of its bucket."""
        bucket = self._buckets[self.bucket_of(peer_id)]
        if peer_id in bucket:
            bucket.remove(peer_id)
            bucket.append(peer_id)

    def remove(self, peer_id: bytes) -> bytes | None:
        """Drop a peer (unresponsive, disconnected, or no longer eligible); the replacement
        that took its place, if one was waiting."""
        index = self.bucket_of(peer_id)
        bucket, waiting = self._buckets[index], self._replacements[index]
        if peer_id in waiting:
            waiting.remove(peer_id)
        if peer_id not in bucket:
            return None
        bucket.remove(peer_id)
        if waiting:
            replacement = waiting.pop()
            bucket.append(replacement)
            return replacement
        return None

    def closest(self, key: bytes, count: int | None = None) -> list[bytes]:
        """Peer IDs in the table, nearest to ``key`` (a wire key) first."""
        ordered = sorted(self, key=lambda p: xor_distance(key, p))
        return ordered if count is None else ordered[:count]

    def retain(self, peer_ids: Iterable[bytes]) -> list[bytes]:
        """Remove every peer not in ``peer_ids`` (no longer eligible); those removed."""
        keep = set(peer_ids)
        for waiting in self._replacements:  # first, so none of them moves in below
            waiting[:] = [p for p in waiting if p in keep]
        gone = [p for p in self if p not in keep]
        for peer_id in gone:
            self.remove(peer_id)
        return gone

    def __contains__(self, peer_id: object) -> bool:
        if not isinstance(peer_id, bytes) or peer_id == self.own_id:
            return False
        return peer_id in self._buckets[self.bucket_of(peer_id)]

    def __iter__(self) -> Iterator[bytes]:
        for bucket in self._buckets:
            yield from bucket

    def __len__(self) -> int:
        return sum(len(b) for b in self._buckets)

    def bucket(self, index: int) -> list[bytes]:
        """A copy of one bucket, least recently seen first."""
        return list(self._buckets[index])
