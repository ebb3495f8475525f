"""The cyclic collector around a heal pass: paused for it, and back as it was after,
without a young collection walking what the pass kept."""

from __future__ import annotations

import gc

from gapline.history._heal_pass import collector_paused


def test_the_collector_is_paused_and_what_the_pass_kept_is_not_young_after() -> None:
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
        kept = [[i] for i in range(5000)]
        assert gc.get_count()[0] >= 5000
    assert gc.isenabled()
    assert gc.get_count()[0] < 700  # no young collection pending for them
    assert all(gc.is_tracked(d) for d in kept[:10])  # still collected in the oldest one


def test_a_process_that_froze_objects_keeps_them_frozen() -> None:
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with collector_paused():
            _ = [{"row": i} for i in range(100)]
        assert gc.get_freeze_count() == frozen
        assert gc.isenabled()
    finally:
        gc.unfreeze()


def test_a_collector_that_was_off_stays_off() -> None:
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
