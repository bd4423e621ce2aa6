"""Grammar engines compared on the default model's vocabulary (SmolLM2, 49,152 tokens):
`.venv/bin/python lab/grammar/grammar_engines.py [--engines llguidance outlines-core]`.

For each schema of tests/schema_corpus.py (and json_object mode's {"type": "object"}): the
grammar's compile time, and the time of each
step's token mask along a walk of up to 64 tokens (each step takes the allowed token the fake
engine's rule would: the smallest d, see splitserve/engine/fake/engine.py), as p50 / p99 over all
steps. outlines-core is measured only where it is installed (pip install outlines-core); it is
not a dependency of this project. docs/grammar.md records a run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from splitserve.engine.fake.engine import fake_order  # noqa: E402
from splitserve.engine.model.default_model import default_model_path  # noqa: E402
from splitserve.tokenizers import load_tokenizer  # noqa: E402
from tests.schema_corpus import SCHEMAS as CORPUS  # noqa: E402

SCHEMAS = {**CORPUS, "json_object": {"type": "object"}}  # response_format json_object

STEPS = 64


def walk(vocab: int, fill, consume, eos) -> list[float]:
    """Mask times (s) along the fake engine's walk, until the grammar ends or STEPS.
    fill(row) computes the packed mask into row (False once the grammar has ended)."""
    times, token = [], 1
    row = np.zeros((vocab + 31) // 32, np.int32)
    for i in range(STEPS):
        start = time.perf_counter()
        going = fill(row)
        times.append(time.perf_counter() - start)
        allowed = np.unpackbits(row.view(np.uint8), bitorder="little")[:vocab].astype(bool)
        if not going or not allowed.any():
            break
        order = fake_order((4 * token + i) % vocab, vocab)
        token = int(order[np.argmax(allowed[order])])
        if token in eos:
            break
        consume(token)
    return times


def llguidance_rows(tok, vocab: int):
    from splitserve.grammar import specs
    from splitserve.grammar.matcher import GrammarState
    from splitserve.grammar.vocabulary import grammar_tokenizer

    start = time.perf_counter()
    lt = grammar_tokenizer(tok, vocab)
    yield "vocabulary", time.perf_counter() - start, []
    for name, schema in SCHEMAS.items():
        grammar = specs.from_json_schema(schema)
        start = time.perf_counter()
        state = GrammarState(lt, grammar, tok.eos_ids)
        compiled = time.perf_counter() - start

        def fill(row, state=state):
            state.fill(row)
            return True

        yield name, compiled, walk(vocab, fill, state.advance, tok.eos_ids)


def outlines_rows(tok, vocab: int):
    import outlines_core
    from outlines_core.json_schema import build_regex_from_schema

    table = tok.token_table()
    eos = min(tok.eos_ids)
    start = time.perf_counter()
    pieces: dict[bytes, list[int]] = {}
    for i, piece in enumerate(table.pieces):
        if i not in tok.eos_ids and i not in table.special_ids:
            pieces.setdefault(piece, []).append(i)
    vocabulary = outlines_core.Vocabulary(eos, pieces)
    yield "vocabulary", time.perf_counter() - start, []
    for name, schema in SCHEMAS.items():
        try:
            regex = build_regex_from_schema(json.dumps(schema))
            start = time.perf_counter()
            guide = outlines_core.Guide(outlines_core.Index(regex, vocabulary))
            compiled = time.perf_counter() - start
        except Exception as exc:  # noqa: BLE001 - a schema it cannot take is a result too
            yield name, None, str(exc)[:60]
            continue

        def fill(row, guide=guide):
            if guide.is_finished():
                return False
            guide.write_mask_into(row.ctypes.data, row.size, 4)
            return True

        yield name, compiled, walk(vocab, fill, guide.advance, tok.eos_ids)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engines", nargs="+", default=["llguidance", "outlines-core"])
    args = p.parse_args(argv)
    tok = load_tokenizer(default_model_path())
    vocab = tok.vocab_size
    for engine in args.engines:
        rows = {"llguidance": llguidance_rows, "outlines-core": outlines_rows}[engine]
        try:
            results = list(rows(tok, vocab))
        except ImportError:
            print(f"{engine}: not installed")
            continue
        print(f"\n{engine} ({vocab} tokens)")
        print(f"{'schema':<20}{'compile ms':>12}{'mask p50 us':>13}{'mask p99 us':>13}{'steps':>7}")
        for name, compiled, times in results:
            if compiled is None:
                print(f"{name:<20}  refused: {times}")
                continue
            if not times:
                print(f"{name:<20}{compiled * 1e3:>12.1f}")
                continue
            p50 = statistics.median(times) * 1e6
            p99 = sorted(times)[min(len(times) - 1, int(0.99 * len(times)))] * 1e6
            print(f"{name:<20}{compiled * 1e3:>12.2f}{p50:>13.1f}{p99:>13.1f}{len(times):>7}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
