"""Decode batch buckets: a step over b live slots runs the smallest compiled batch that holds them,
with the live slots packed into its rows; whatever bucket a request runs in, and however its row
moves when others finish, it gets the tokens it gets in the full batch (greedy and seeded)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitserve.engine.compile.buckets import (
    batch_buckets,
    length_buckets,
    pick,
    prefill_shapes,
    prompt_lengths,
)
from splitserve.engine.interface import SamplingParams
from splitserve.engine.jax.build import build_jax_engine
from splitserve.engine.jax.slot_rows import SlotRows
from splitserve.engine.kernels import qkernel

SLOTS = 8
MAX_SEQ = 64
BUCKETS = (16, 64)
GREEDY = SamplingParams()
SEEDED = SamplingParams(temperature=0.9, top_p=0.95, top_k=40, seed=4321)


# float32 runs the kernel's float32 rows in every bucket here (8 slots); "float32-mixed" has them
# up to 2 rows and XLA's products over the whole bucket above, so a request moves between the two
# forms as the batch shrinks; int8 runs the kernel's q8_0 rows. The kernel computes the live rows
# only (programs.LIVE). All must give every request the same tokens.
@pytest.fixture(scope="module", params=["float32", "float32-mixed", "int8"])
def engine(request):
    if request.param != "float32" and not qkernel.available():
        pytest.skip("native kernel not built")
    mixed = request.param == "float32-mixed"
    eng = build_jax_engine(  # one cache capacity: test_engine_kv covers resizing
        "random:test-tiny:3", SLOTS, MAX_SEQ, prefill_buckets=BUCKETS, decode_buckets=(MAX_SEQ,),
        weight_format="float32" if mixed else request.param,
        **({"float32_rows_max_batch": 2} if mixed else {}),
    )
    eng.warmup(prefill=True, decode=True)
    return eng


@pytest.fixture(autouse=True)
def _free_all(engine):
    yield
    for s in range(SLOTS):
        engine.free(s)


def _prompt(seed: int, n: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(1, 512, n)]


def test_batch_buckets_are_powers_of_two_up_to_the_slots():
    assert batch_buckets(16) == (1, 2, 4, 8, 16)
    assert batch_buckets(12) == (1, 2, 4, 8, 12)
    assert batch_buckets(1) == (1,)
    # one prompt at each lone length; a batch only at the coarse lengths within the budget
    assert prefill_shapes((16, 32, 48, 64), (16, 64), (1, 2, 4), 128) == (
        (1, 16), (2, 16), (4, 16), (1, 32), (1, 48), (1, 64), (2, 64))  # fmt: skip


def test_a_lone_prompt_pads_at_most_a_quarter_over_its_length():
    lone, coarse = prompt_lengths(16, 2048), length_buckets(16, 2048)
    assert lone[:9] == (16, 32, 48, 64, 80, 96, 112, 128, 160)
    assert lone[-1] == 2048 and list(lone) == sorted(set(lone))
    for n in range(1, 2049):
        padded = pick(lone, n)
        assert padded <= pick(coarse, n)  # never more than the powers of two
        assert padded < n + 16 if n <= 128 else padded <= n * 5 / 4, n
    assert prompt_lengths(16, 96) == (16, 32, 48, 64, 80, 96)
    assert prompt_lengths(16, 16) == (16,)


def test_slot_rows_take_the_lowest_free_row_and_pack_on_demand():
    rows = SlotRows(6)
    assert [rows.take(s) for s in (5, 2, 0, 3)] == [0, 1, 2, 3]
    assert rows.take(5) == 0  # a live slot keeps its row
    rows.release(2)  # row 1 free
    rows.release(5)  # row 0 free
    assert rows.plan_moves(4) == []  # rows 2, 3 still fit a batch of 4
    assert rows.plan_moves(2) == [(2, 0), (3, 1)]
    assert (rows.row(0), rows.row(3)) == (0, 1)
    with pytest.raises(ValueError):
        rows.take(1), rows.take(4), rows.plan_moves(2)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 7)), max_size=40))
def test_slot_rows_stay_a_bijection_and_packing_puts_every_live_slot_below_the_batch(ops):
    rows = SlotRows(8)
    live: set[int] = set()
    for take, slot in ops:
        if take:
            rows.take(slot)
            live.add(slot)
        else:
            rows.release(slot)
            live.discard(slot)
        batch = min(b for b in batch_buckets(8) if b >= max(1, len(live)))
        rows.plan_moves(batch)
        got = {s: rows.row(s) for s in live}
        assert all(0 <= r < batch for r in got.values())
        assert len(set(got.values())) == len(live)
        for s, r in got.items():
            assert rows.slot_at[r] == s
        assert rows.live == len(live)


def _run(engine, plan, steps):
    """plan: {slot: (prompt seed, prompt length, sampling, start step, stop step)}; each slot is
    inserted at its start step and freed after its stop step. Returns {slot: its tokens}."""
    prefixes = {s: engine.prefill(_prompt(seed, n), sp) for s, (seed, n, sp, _, _) in plan.items()}
    out: dict[int, list[int]] = {s: [] for s in plan}
    for step in range(steps):
        for s, (_, _, sp, start, stop) in plan.items():
            if step == start:
                engine.insert(prefixes[s], s, sp)
            if step == stop:
                engine.free(s)
        tokens = engine.generate().tokens
        for s, (_, _, _, start, stop) in plan.items():
            if start <= step < stop:
                out[s].append(int(tokens[s]))
    return out


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_every_bucket_gives_the_full_batch_tokens(engine, sampling):
    steps = 20
    target = {6: (1, 9, sampling, 0, steps)}
    alone = _run(engine, target, steps)[6]  # bucket 1 all along, in row 0
    for s in range(SLOTS):
        engine.free(s)
    # the same request beside neighbours that fill the batch, start late and finish early: the
    # batch runs in buckets 8, 4, 2 and 1, and the request's row moves down as they leave
    # (inserted after four of them, it starts in row 4)
    plan = {}
    for s in range(SLOTS):
        if s != 6:
            sp = SamplingParams(temperature=0.7, seed=100 + s) if s % 2 else GREEDY
            plan[s] = (10 + s, 3 + (5 * s) % 20, sp, 0 if s < 4 else 2, 4 + 2 * s)
    plan.update(target)
    moved = engine.rows_moved
    crowded = _run(engine, plan, steps)[6]
    assert crowded == alone
    assert engine.rows_moved > moved, "no compaction happened: the test lost its point"


def test_a_step_uses_the_smallest_bucket_that_holds_the_live_slots(engine):
    p = engine.prefill(_prompt(3, 5), GREEDY)
    seen = []
    run = engine.programs.get

    def spy(key):
        if key[0] == "decode":
            seen.append(key[1])
        return run(key)

    engine.programs.get = spy
    try:
        for slots in ([7], [0, 7], [1, 2, 7], [0, 1, 2, 3, 4], list(range(SLOTS))):
            for s in slots:
                engine.insert(p, s, GREEDY)
            engine.generate()
            for s in range(SLOTS):
                engine.free(s)
    finally:
        engine.programs.get = run
    assert seen == [1, 2, 4, 8, 8]


def test_warmup_compiled_every_bucket(engine):
    n = len(engine.programs.compiled)
    p = engine.prefill(_prompt(4, 20), SEEDED)
    for s in range(5):
        engine.insert(p, s, SEEDED)
    for _ in range(3):
        engine.generate()
    engine.free(0)
    engine.free(3)
    for _ in range(30):  # runs buckets 8 and 4
        engine.generate()
    assert len(engine.programs.compiled) == n, "a step compiled after warmup"


def test_nothing_live_runs_nothing(engine):
    out = engine.generate()
    assert out.tokens.shape == (SLOTS,) and not out.tokens.any()
