"""The decode worker's ConstrainedSlots says when steps must go one at a time (a live slot with
logits controls, whose engine refuses generate_many), and stops saying so once the slot is free.
The JAX engine agrees (JaxEngine.controlled)."""

from __future__ import annotations

from concurrent.futures import Future

import numpy as np

from decode_worker.constrained import ConstrainedSlots
from decode_worker.slots import Slot
from splitserve.engine.interface import LogitsControls, SamplingParams
from splitserve.engine.jax.build import build_jax_engine
from splitserve.protocol import PrefixHeader, StopCriteria


def test_a_controlled_slot_asks_for_single_steps_until_it_is_freed():
    engine = build_jax_engine("random:test-tiny:1", 2, 64, prefill_buckets=(16, 64),
                              decode_buckets=(32, 64))  # fmt: skip
    slots = ConstrainedSlots(engine, Future())  # no grammar here: the vocabulary is not needed
    try:
        prompt = [3, 5, 7, 9]
        controls = LogitsControls(presence_penalty=1.0)
        greedy = SamplingParams()
        prefix = engine.prefill(prompt, greedy, controls=controls)
        header = PrefixHeader("r1", 0, 0, prefix.length, 0, prefix.first_token,
                              prefix.first_logprob, greedy, StopCriteria(8), [],
                              controls=controls, context=prompt)  # fmt: skip
        plain = PrefixHeader("r2", 0, 0, prefix.length, 0, prefix.first_token, 0.0, greedy,
                             StopCriteria(8), [])  # fmt: skip
        state = Slot("r2", 0, 0, StopCriteria(8), 1, prefix.length + 1)
        slots.insert(plain, slots.prefix(plain, engine.prefill(prompt, greedy).kv), 0, state)
        assert not slots.single_steps and not engine.controlled
        state = Slot("r1", 0, 0, StopCriteria(8), 1, prefix.length + 1)
        slots.insert(header, slots.prefix(header, prefix.kv), 1, state)
        assert slots.single_steps and engine.controlled
        out, errors = slots.generate()
        assert not errors and np.all(out.tokens >= 0)
        slots.free(1)
        engine.free(1)
        assert not slots.single_steps and not engine.controlled
    finally:
        slots.close()
