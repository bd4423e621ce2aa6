"""The decode worker's SlotTable keeps its two views (slot -> request, request -> slot) in step
under any sequence of takes and releases, and hands out the lowest free slot."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from decode_worker.slots import Slot, SlotTable
from splitserve.protocol import StopCriteria


def slot(rid: str) -> Slot:
    return Slot(rid, 0, 0, StopCriteria(max_tokens=16), 1, 1)


def test_take_gives_the_lowest_free_slot_and_release_frees_it():
    table = SlotTable(3)
    assert [table.take(slot(r)) for r in "abc"] == [0, 1, 2]
    assert table.free_count == 0 and len(table) == 3
    assert table.release("b") == 1
    assert table.release("b") is None
    assert "b" not in table and table.get("b") is None
    assert table.take(slot("d")) == 1
    assert [(i, s.request_id) for i, s in table.live()] == [(0, "a"), (1, "d"), (2, "c")]


def test_full_table_and_duplicates_are_refused():
    table = SlotTable(1)
    table.take(slot("a"))
    with pytest.raises(ValueError, match="already holds"):
        table.take(slot("a"))
    with pytest.raises(ValueError, match="no free slot"):
        table.take(slot("b"))


def test_release_while_iterating_live_slots():
    """The decode step frees finishing slots as it goes."""
    table = SlotTable(4)
    for r in "abcd":
        table.take(slot(r))
    seen = []
    for i, s in table.live():
        seen.append(i)
        table.release(s.request_id)
        if i == 0:
            table.release("c")  # a later slot released: not visited
    assert seen == [0, 1, 3]
    assert len(table) == 0 and table.free_count == 4


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 11)), max_size=200))
def test_views_stay_in_step(ops):
    table = SlotTable(5)
    model: dict[str, int] = {}  # request id -> slot
    for take, n in ops:
        rid = f"r{n}"
        if take:
            if rid in model or len(model) == 5:
                with pytest.raises(ValueError):
                    table.take(slot(rid))
                continue
            lowest = min(set(range(5)) - set(model.values()))
            assert table.take(slot(rid)) == lowest
            model[rid] = lowest
        else:
            assert table.release(rid) == model.pop(rid, None)
        assert len(table) == len(model) and table.free_count == 5 - len(model)
        live = list(table.live())
        assert [i for i, _ in live] == sorted(model.values())
        assert {s.request_id: i for i, s in live} == model
        assert all(table.get(r).request_id == r for r in model)
