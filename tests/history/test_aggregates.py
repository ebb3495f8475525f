"""The pure aggregate functions against the rules stated plainly: whatever order edits and
reactions arrive in (duplicates, ties, a bundle's, over the per-sender cap), what is held is
what sorting them all would hold, and the visible revision is the newest valid one."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gapline.history._aggregates import (
    EDITS_PER_SENDER,
    EMPTY,
    Aggregate,
    Annotation,
    Revision,
    visible_revision,
    with_annotation,
    with_edit,
    without_relation,
)

SENDERS = ("@a:x", "@b:x")
TYPES = ("m.room.message", "m.sticker")

revisions = st.builds(
    Revision,
    event_id=st.sampled_from([f"$e{i}" for i in range(30)]),
    sender=st.sampled_from(SENDERS),
    ts=st.integers(0, 8),
    event_type=st.sampled_from(TYPES),
    content=st.just({"body": "x"}),
)
annotations = st.builds(
    Annotation,
    key=st.sampled_from(["k", "l"]),
    sender=st.sampled_from(SENDERS),
    event_id=st.sampled_from([f"$r{i}" for i in range(30)]),
    ts=st.integers(0, 8),
)


def held_edits(
    arrivals: list[tuple[Revision, bool]], original_sender: str | None
) -> tuple[tuple[Revision, ...], tuple[int, str] | None]:
    """The edits the rules hold, computed the plain way: sort everything each time."""
    edits: list[Revision] = []
    unknown: tuple[int, str] | None = None
    for revision, from_bundle in arrivals:
        if original_sender is not None and revision.sender != original_sender:
            continue
        if any(r.event_id == revision.event_id for r in edits):
            continue
        edits = sorted([*edits, revision], key=lambda r: r.order)
        mine = [r for r in edits if r.sender == revision.sender]
        if len(mine) > EDITS_PER_SENDER:
            edits.remove(mine[0])
            unknown = max(unknown or mine[0].order, mine[0].order)
        if from_bundle:
            unknown = max(unknown or revision.order, revision.order)
    return tuple(edits), unknown


@given(
    st.lists(st.tuples(revisions, st.booleans()), max_size=60),
    st.sampled_from([None, *SENDERS]),
)
def test_edits_held_are_those_sorting_all_of_them_holds(
    arrivals: list[tuple[Revision, bool]], original_sender: str | None
) -> None:
    aggregate = EMPTY
    for revision, from_bundle in arrivals:
        aggregate = with_edit(aggregate, revision, original_sender, from_bundle=from_bundle)
    assert (aggregate.edits, aggregate.unknown_before) == held_edits(arrivals, original_sender)


def test_more_edits_than_a_sender_may_hold_drop_the_oldest_in_any_arrival_order() -> None:
    newest_first = [
        Revision(f"$e{i:02}", "@a:x", i, "m.room.message", {}) for i in range(30, 0, -1)
    ]
    aggregate = EMPTY
    for revision in newest_first:
        aggregate = with_edit(aggregate, revision, "@a:x", from_bundle=False)
    assert [r.ts for r in aggregate.edits] == list(range(11, 31))
    assert aggregate.unknown_before == (10, "$e10")


@given(st.lists(annotations, max_size=40))
def test_reactions_are_held_once_each_in_time_order(arrivals: list[Annotation]) -> None:
    aggregate = EMPTY
    for annotation in arrivals:
        aggregate = with_annotation(aggregate, annotation)
    first: dict[str, Annotation] = {}
    for annotation in arrivals:
        first.setdefault(annotation.event_id, annotation)
    expected = sorted(first.values(), key=lambda a: (a.ts, a.event_id))
    assert list(aggregate.annotations) == expected


@given(
    st.lists(st.tuples(revisions, st.booleans()), max_size=30),
    st.lists(st.integers(0, 29), max_size=5),
    st.sampled_from(SENDERS),
    st.sampled_from(TYPES),
)
def test_the_visible_revision_is_the_newest_valid_one(
    arrivals: list[tuple[Revision, bool]],
    redacted: list[int],
    original_sender: str,
    original_type: str,
) -> None:
    aggregate = EMPTY
    for revision, from_bundle in arrivals:
        aggregate = with_edit(aggregate, revision, None, from_bundle=from_bundle)
    for i in redacted:
        aggregate = without_relation(aggregate, f"$e{i}")
    valid = [
        r for r in aggregate.edits if r.sender == original_sender and r.event_type == original_type
    ]
    best = max(valid, key=lambda r: r.order) if valid else None
    visible = visible_revision(aggregate, original_sender, original_type)
    if visible.lost:
        assert aggregate.redacted_edits and aggregate.unknown_before is not None
    else:
        assert visible.revision == best


def test_an_aggregate_without_edits_shows_the_original() -> None:
    reacted = with_annotation(EMPTY, Annotation("k", "@a:x", "$r", 1))
    for aggregate in (EMPTY, reacted, Aggregate(redacted_by="$x")):
        visible = visible_revision(aggregate, "@a:x", "m.room.message")
        assert visible.revision is None and not visible.lost
