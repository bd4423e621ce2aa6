"""A synthetic byte-level BPE tokenizer of any vocabulary size, for random-weight models.

Tests and benchmarks run models whose vocabulary size must match a tokenizer's; this trains one
(deterministically, in about a second) on a generated multilingual corpus: English-like words,
accented Latin, CJK, emoji, digits and punctuation, so that streaming exercises multi-byte
characters split across tokens. Ids 0-2 are <|endoftext|> (eos), <|im_start|>, <|im_end|>;
tokenizer_config.json beside it carries a ChatML template.
"""

from __future__ import annotations

import bisect
import itertools
import json
import os
import random
import tempfile

import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
_MIN_VOCAB = 256 + len(SPECIAL_TOKENS)

_ONSETS = ["", "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v",
           "w", "z", "br", "ch", "cl", "dr", "fl", "gr", "pl", "pr", "sh", "st", "str", "th", "tr"]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ea", "ee", "io", "ou", "oo", "y"]
_CODAS = ["", "", "n", "r", "s", "t", "l", "m", "ng", "nd", "st", "ck", "rt", "ss", "x"]
_ACCENTED = "àáâäãåçèéêëìíîïñòóôöõùúûüýÿœæßøłśźżčřšžğışățđ"
_EMOJI = (
    "😀😁😂🤣😃😄😅😆😉😊😋😎😍😘🥰😗🙂🤗🤩🤔🤨😐😑"
    "😶🙄😏😣😥😮🤐😯😪😫🥱😴😌😛😜😝🤤🌍🚀🎉🔥✨👍❤️🍕"
)
_PUNCT = [".", ",", "!", "?", ";", ":", " -", "'s", "\n", " (", ")", '"']


def _word(rng: random.Random) -> str:
    return "".join(
        rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS)
        for _ in range(rng.choice((1, 1, 2, 2, 3)))
    )


def _accented(rng: random.Random, word: str) -> str:
    chars = list(word)
    for _ in range(rng.randint(1, 2)):
        chars[rng.randrange(len(chars))] = rng.choice(_ACCENTED)
    return "".join(chars)


def synthetic_corpus(lines: int = 6000, seed: int = 0) -> list[str]:
    """Deterministic multilingual text (Zipf-like word frequencies, so BPE finds merges)."""
    rng = random.Random(seed)
    latin = [_word(rng) for _ in range(6000)]
    accented = [_accented(rng, w) for w in latin[:1500]]
    cjk = ["".join(chr(0x4E00 + rng.randrange(1500)) for _ in range(rng.randint(1, 3)))
           for _ in range(1500)]  # fmt: skip
    cumulative = list(itertools.accumulate(1.0 / (rank + 1) ** 0.8 for rank in range(len(latin))))
    corpus = []
    for _ in range(lines):
        words = []
        for _ in range(rng.randint(6, 20)):
            roll = rng.random()
            if roll < 0.70:
                words.append(latin[bisect.bisect(cumulative, rng.random() * cumulative[-1])])
            elif roll < 0.80:
                words.append(rng.choice(accented))
            elif roll < 0.90:
                words.append(rng.choice(cjk))
            elif roll < 0.95:
                words.append(rng.choice(_EMOJI))
            else:
                words.append(str(rng.randrange(10 ** rng.randint(1, 4))))
            if rng.random() < 0.1:
                words[-1] += rng.choice(_PUNCT)
        corpus.append(" ".join(words))
    return corpus


def _train(vocab_size: int) -> tokenizers.Tokenizer:
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        show_progress=False,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(synthetic_corpus(), trainer=trainer)
    size = tok.get_vocab_size(with_added_tokens=True)
    if size < vocab_size:  # the corpus ran out of merges: fill with reserved special tokens
        tok.add_special_tokens([f"<|reserved_{n}|>" for n in range(vocab_size - size)])
    if tok.get_vocab_size(with_added_tokens=True) != vocab_size:
        raise RuntimeError(f"synthetic tokenizer has {tok.get_vocab_size()} ids, not {vocab_size}")
    return tok


def _vocab_size_of(path: str) -> int | None:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        ids = set(data["model"]["vocab"].values()) | {t["id"] for t in data["added_tokens"]}
        return len(ids)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_atomic(path: str, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def build_synthetic_tokenizer(directory: str, vocab_size: int) -> str:
    """Train (or reuse) directory/tokenizer.json with exactly vocab_size ids; return its path."""
    if vocab_size < _MIN_VOCAB:
        raise ValueError(f"vocab_size must be at least {_MIN_VOCAB}")
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "tokenizer.json")
    config_path = os.path.join(directory, "tokenizer_config.json")
    if os.path.isfile(config_path) and _vocab_size_of(path) == vocab_size:
        return path
    config = {
        "bos_token": None,
        "eos_token": "<|endoftext|>",
        "add_bos_token": False,
        "chat_template": CHATML_TEMPLATE,
    }
    _write_atomic(config_path, json.dumps(config, indent=2))
    _write_atomic(path, _train(vocab_size).to_str())
    return path
