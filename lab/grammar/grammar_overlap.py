"""How much of a grammar mask's cost the decode loop hides: `.venv/bin/python
lab/grammar/grammar_overlap.py [--steps 200] [--step-ms 20]`.

A FakeEngine over the default model's vocabulary (49,152 tokens) with a full batch (16 slots),
each step's "model pass" a sleep of --step-ms (it releases the GIL, as a device wait does), runs
the decode worker's loop shape: step, then the bookkeeping of the step (a stand-in of
--loop-ms of Python work: sending batches, reading messages). Three variants, per-step wall time:
  plain:        no constrained slot;
  inline masks: one slot with a JSON-schema grammar, its mask computed before each step;
  threaded:     the same slot, its mask computed on SlotGrammars' thread from the moment the
                previous step's tokens are known (what the decode worker does).
The fake engine's own per-slot numpy work for the constrained slot is in both constrained
variants; the difference between them is the mask's cost that the thread hides.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from splitserve.engine.fake.engine import FakeEngine  # noqa: E402
from splitserve.engine.interface import LogitsControls, SamplingParams, StepMasks  # noqa: E402
from splitserve.engine.model.default_model import default_model_path  # noqa: E402
from splitserve.grammar import specs  # noqa: E402
from splitserve.grammar.masks import SlotGrammars  # noqa: E402
from splitserve.grammar.matcher import GrammarState  # noqa: E402
from splitserve.grammar.vocabulary import grammar_tokenizer  # noqa: E402
from splitserve.tokenizers import load_tokenizer  # noqa: E402
from tests.schema_corpus import SCHEMAS  # noqa: E402

SLOTS = 16


def busy(seconds: float) -> None:
    """Python work holding the GIL, as the loop's bookkeeping does."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def run(variant: str, steps: int, step_s: float, loop_s: float, tok, lt) -> list[float]:
    vocab = tok.vocab_size
    engine = FakeEngine(SLOTS, 1 << 16, vocab, step_s=step_s)
    grammar = specs.from_json_schema(SCHEMAS["array_of_objects"])
    slots = SlotGrammars(vocab)
    for slot in range(SLOTS):
        constrained = variant != "plain" and slot == 0
        prefix = engine.prefill([slot + 1, 7], SamplingParams())
        if constrained:
            state = GrammarState(lt, grammar, tok.eos_ids)
            prefix = engine.prefill([slot + 1, 7], SamplingParams(), controls=LogitsControls(),
                                    mask=state.mask())  # fmt: skip
            state.advance(prefix.first_token)
            slots.add(slot, state)
        engine.insert(prefix, slot, SamplingParams(),
                      **({"controls": LogitsControls()} if constrained else {}))  # fmt: skip
    times = []
    try:
        for _ in range(steps):
            start = time.perf_counter()
            if variant == "plain":
                out = engine.generate()
            elif variant == "inline":
                state = slots.states[0]
                masks = StepMasks(np.array([0], np.int32), state.mask()[None])
                out = engine.generate(masks=masks)
                slots.advance(out.tokens.tolist())
            else:
                masks, _ = slots.masks()
                out = engine.generate(masks=masks)
                slots.advance(out.tokens.tolist())
            if variant != "plain" and slots.states[0].matcher.is_stopped():
                slots.remove(0)  # the grammar ended: start it again, as a new request would
                slots.add(0, GrammarState(lt, grammar, tok.eos_ids))
            if variant == "threaded":
                slots.prepare()  # the next mask, while the loop does the rest
            busy(loop_s)
            times.append(time.perf_counter() - start)
    finally:
        slots.close()
    return times


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--step-ms", type=float, default=20.0)
    p.add_argument("--loop-ms", type=float, default=1.0)
    args = p.parse_args(argv)
    tok = load_tokenizer(default_model_path())
    lt = grammar_tokenizer(tok, tok.vocab_size)
    print(f"{SLOTS} slots, {tok.vocab_size} tokens, model pass {args.step_ms} ms, "
          f"loop work {args.loop_ms} ms")  # fmt: skip
    base = None
    for variant in ("plain", "inline", "threaded"):
        times = run(variant, args.steps, args.step_ms / 1e3, args.loop_ms / 1e3, tok, lt)
        p50 = statistics.median(times) * 1e3
        p99 = sorted(times)[int(0.99 * len(times)) - 1] * 1e3
        base = base or p50
        print(f"{variant:>9}: step p50 {p50:7.2f} ms  p99 {p99:7.2f} ms  "
              f"(+{100 * (p50 / base - 1):.1f}% over plain)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
