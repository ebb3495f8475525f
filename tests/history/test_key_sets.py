"""``KeySets``: per room, a superset of one table's keys (load, caps, a load racing a write,
a write rolled back)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from gapline.history._key_sets import KeySets

K = [bytes([i]) * 4 for i in range(10)]


def rows(*keys: bytes, reads: list[int] | None = None) -> Callable[[int], Iterable[bytes]]:
    """A read of the room's committed keys (``reads`` records each limit asked for)."""

    def read(limit: int) -> Iterable[bytes]:
        if reads is not None:
            reads.append(limit)
        return list(keys)[:limit]

    return read


def test_a_room_is_unknown_until_loaded_then_filters_to_what_it_may_hold() -> None:
    sets = KeySets(per_room=5)
    assert sets.may_hold(1, K[:3]) is None
    assert not sets.holds_none(1)
    reads: list[int] = []
    sets.load(1, rows(K[0], K[2], reads=reads))
    assert reads == [6]  # the cap and one more: "too many" is told from a full set
    assert sets.may_hold(1, K[:4]) == [K[0], K[2]]
    sets.load(1, rows(reads=reads))
    assert reads == [6]  # loaded once
    assert sets.may_hold(2, K[:1]) is None  # per room


def test_a_room_without_keys_holds_none_until_a_write_adds_one() -> None:
    sets = KeySets()
    sets.load(1, rows())
    assert sets.holds_none(1) and sets.may_hold(1, K[:3]) == []
    sets.add(1, [K[5]])
    assert not sets.holds_none(1)
    assert sets.may_hold(1, K[4:7]) == [K[5]]


def test_over_the_cap_a_room_is_always_queried() -> None:
    sets = KeySets(per_room=3)
    sets.load(1, rows(*K[:4]))
    assert sets.may_hold(1, K[5:7]) == K[5:7]
    sets.load(2, rows(*K[:3]))
    assert sets.may_hold(2, K[5:6]) == []
    sets.add(2, [K[8]])  # a write past the cap
    assert sets.may_hold(2, K[5:6]) == K[5:6]
    reads: list[int] = []
    sets.add(3, K[:4])  # written past the cap before any load: no load needed
    sets.load(3, rows(reads=reads))
    assert reads == [] and sets.may_hold(3, K[9:]) == K[9:]


def test_over_the_total_cap_the_room_growing_is_always_queried() -> None:
    sets = KeySets(per_room=10, total=5)
    sets.load(1, rows(*K[:3]))
    sets.load(2, rows(*K[3:5]))
    assert sets.may_hold(2, K[5:6]) == []
    sets.add(2, [K[6]])  # six in all
    assert sets.may_hold(2, K[5:6]) == K[5:6]
    assert sets.may_hold(1, K[5:6]) == []  # the other room still answers
    sets.add(1, [K[7]])  # its keys were given back: room 1 fits again
    assert sets.may_hold(1, K[7:9]) == [K[7]]


def test_a_write_during_a_load_leaves_the_room_unknown_and_its_keys_kept() -> None:
    sets = KeySets()

    def read(limit: int) -> list[bytes]:
        sets.add(1, [K[4]])  # a concurrent writer, before its COMMIT
        return [K[0]]

    sets.load(1, read)
    assert sets.may_hold(1, K[:5]) is None  # not installed
    sets.load(1, rows(K[0]))  # the writer has not committed: its row is not read
    assert sets.may_hold(1, K[:5]) == [K[0], K[4]]


def test_a_write_before_a_load_that_cannot_see_its_rows_is_kept() -> None:
    sets = KeySets()
    sets.add(1, [K[3]])  # added before COMMIT; the load's snapshot misses it
    sets.load(1, rows(K[1]))
    assert sets.may_hold(1, K[:5]) == [K[1], K[3]]


def test_a_write_rolled_back_leaves_a_superset() -> None:
    sets = KeySets()
    sets.load(1, rows(K[0]))
    sets.add(1, [K[2]])  # its transaction then rolls back: the key stays, never missed
    assert sets.may_hold(1, K[:3]) == [K[0], K[2]]
