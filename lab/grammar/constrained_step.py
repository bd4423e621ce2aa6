"""What one constrained request costs a full batch of the JAX engine: decode step time of the
default model with 16 live slots, none constrained against one with a JSON-schema grammar (and
one with penalties and top logprobs instead), and the constrained request's own tokens/s.

    .venv/bin/python lab/grammar/constrained_step.py [--steps 10] [--rounds 9] [--threads 1]

Slot 0 is driven as the decode worker drives it (decode_worker/constrained.py): SlotGrammars
computes its next mask on a thread from the moment a step's tokens are known, the engine waits
for it after dispatching the model pass. When its JSON is complete (an end token) it starts a
new one, so every timed step has one constrained slot. The other 15 slots are greedy and plain.
Rounds alternate the variants so that a busy host slows them alike; the table gives the median
over rounds of each round's median step (wall time), as a ratio to the plain batch.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

SLOTS, CAPACITY, CONTEXT = 16, 256, 120
SCHEMA = "langchain_style"  # tests/schema_corpus.py
VARIANTS = ("plain", "grammar", "penalties")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=10, help="timed steps per variant per round")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--threads", type=int, default=1, help="XLA intra-op threads")
    args = ap.parse_args(argv)

    from splitserve.engine.compile.jax_setup import configure_jax_runtime

    configure_jax_runtime(cpu_threads=args.threads)
    import numpy as np

    from splitserve.engine import resolve_model_path
    from splitserve.engine.interface import LogitsControls, SamplingParams
    from splitserve.engine.jax.build import build_jax_engine
    from splitserve.grammar import specs
    from splitserve.grammar.masks import SlotGrammars
    from splitserve.grammar.matcher import GrammarState
    from splitserve.grammar.vocabulary import grammar_tokenizer
    from splitserve.tokenizers import load_tokenizer
    from tests.schema_corpus import SCHEMAS

    path = resolve_model_path("default")
    tok = load_tokenizer(path)
    engine = build_jax_engine(path, SLOTS, CAPACITY, prefill_buckets=(CAPACITY,),
                              decode_buckets=(CAPACITY,))  # fmt: skip
    vocab = grammar_tokenizer(tok, engine.vocab_size)
    grammar = specs.from_json_schema(SCHEMAS[SCHEMA])
    greedy = SamplingParams()
    rng = np.random.default_rng(0)
    filler = engine.prefill([int(t) for t in rng.integers(3, engine.vocab_size, CONTEXT)], greedy)
    ask = [{"role": "user", "content": "Describe a fictional person as JSON."}]
    question = tok.encode(tok.apply_chat_template(ask))
    penalties = LogitsControls(presence_penalty=0.5, frequency_penalty=0.5, top_logprobs=5,
                               repetition_penalty=1.1)  # fmt: skip
    grammars = SlotGrammars(engine.vocab_size)

    def start_slot0(variant: str) -> None:
        """(Re)start the special request in slot 0."""
        engine.free(0)
        grammars.remove(0)
        if variant == "plain":
            engine.insert(filler, 0, greedy)
        elif variant == "grammar":
            state = GrammarState(vocab, grammar, tok.eos_ids)
            prefix = engine.prefill(question, greedy, mask=state.mask())
            state.replay([prefix.first_token])
            engine.insert(prefix, 0, greedy, controls=LogitsControls())
            grammars.add(0, state)
            grammars.prepare()
        else:
            prefix = engine.prefill(question, greedy, controls=penalties)
            engine.insert(prefix, 0, greedy, controls=penalties)

    def fill(variant: str) -> None:
        for slot in range(1, SLOTS):
            engine.free(slot)
            engine.insert(filler, slot, greedy)
        start_slot0(variant)

    def step(variant: str) -> None:
        if variant != "grammar":
            engine.generate()
            return
        masks, errors = grammars.masks()
        assert not errors, errors
        out = engine.generate(masks=masks)
        assert not grammars.advance(out.tokens.tolist())
        if int(out.tokens[0]) in tok.eos_ids:
            start_slot0(variant)  # a complete JSON: the next one (not in the step's time)
        else:
            grammars.prepare()

    for variant in VARIANTS:  # compile every program each variant runs before timing any
        fill(variant)
        step(variant)
    wall: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for _ in range(args.rounds):
        for variant in VARIANTS:
            fill(variant)
            times = []
            for _ in range(args.steps):
                t0 = time.perf_counter()
                step(variant)
                times.append(time.perf_counter() - t0)
            wall[variant].append(statistics.median(times))
    grammars.close()
    base = statistics.median(wall["plain"])
    print(f"model {os.path.basename(path)}, {SLOTS} live slots, capacity {CAPACITY}, context "
          f"~{CONTEXT}, {args.threads} XLA thread(s), {args.rounds} rounds x {args.steps} steps, "
          f"schema {SCHEMA}")  # fmt: skip
    print("| batch | step ms (wall, median) | ratio | slot 0 tokens/s |")
    print("|---|---:|---:|---:|")
    names = {"plain": "16 plain", "grammar": "15 plain + 1 json_schema",
             "penalties": "15 plain + 1 penalties, top_logprobs=5"}  # fmt: skip
    for variant in VARIANTS:
        w = statistics.median(wall[variant])
        print(f"| {names[variant]} | {w * 1e3:.1f} | {w / base:.2f} | {1 / w:.1f} |")


if __name__ == "__main__":
    main()
