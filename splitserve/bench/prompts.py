"""Prompts of about N tokens, made from a word list (no tokenizer needed), or of exactly N tokens
when a tokenizer is given (`--tokenizer`): the text is cut to N ids and re-checked.

Unicode prompts mix in accented words, CJK and emoji, so the server's tokenizer and detokenizer
handle multi-byte UTF-8 (and characters split across tokens). Every request gets its own prompt,
drawn from a generator seeded by (seed, index), so runs are repeatable.
"""

from __future__ import annotations

import random

# Common English words: about one token each (with the leading space) in typical BPE vocabularies.
WORDS = """the of and to in is that for it as was with be by on not he this are or his from at
which but have an they you were her she there been one all we their has would when if so no
will more can other what time about may out up them some could into only these two first new
people said like over such our man any me even most made after also did many before must through
back years where much your way well down should because each just those how too little state good
very make world still own see men work long get here between both life being under never day same
another know while last might great old year off come since against go came right used take three
place small found part general high again house during form real sound light water city open story
river paper music early order point table green garden window number market letter simple system
""".split()

UNICODE_PIECES = (
    "café", "naïve", "résumé", "über", "façade", "piñata", "smørrebrød", "Ærø", "Straße",
    "Łódź", "Kraków", "Ελλάδα", "Москва", "日本語", "東京", "北京", "漢字", "한국어", "서울",
    "ไทย", "العربية", "हिन्दी", "😀", "🚀", "🎉", "🔥", "👍🏽", "❤️", "🇯🇵", "∑x²", "→", "…",
)  # fmt: skip
# Rough tokens per unicode piece in a byte-level BPE without those words in its merges.
_UNICODE_COST = 3


# Short fragments that top a prompt up by about one token each (tried in this order).
_FILLERS = (" a", " I", ",", ".", " 1", "!", " x", "-", "\n", " the")


def _pieces(rng: random.Random, approx_tokens: int, unicode: bool) -> list[str]:
    """Words (with their leading space) until about approx_tokens tokens, estimated at one per
    English word and three per unicode piece."""
    parts: list[str] = []
    cost = 0
    while cost < approx_tokens:
        if unicode and rng.random() < 0.3:
            word = rng.choice(UNICODE_PIECES)
            cost += _UNICODE_COST
        else:
            word = rng.choice(WORDS)
            cost += 1
        if rng.random() < 0.08:
            word += rng.choice((".", ",", "!", "?"))
        parts.append(word if not parts else " " + word)
    return parts


def _draft(rng: random.Random, approx_tokens: int, unicode: bool) -> str:
    return "".join(_pieces(rng, approx_tokens, unicode))


class PromptFactory:
    """prompt(i) -> the i-th prompt. With a tokenizer, each prompt encodes to exactly
    `tokens` ids (counting the special tokens the tokenizer adds) when the text allows it."""

    def __init__(self, tokens: int, unicode: bool = False, tokenizer=None, seed: int = 0):
        if tokens < 1:
            raise ValueError("prompt tokens must be at least 1")
        self.tokens = tokens
        self.unicode = unicode
        self.tokenizer = tokenizer
        self.seed = seed
        self._specials = 0
        if tokenizer is not None:
            plain = len(tokenizer.encode("hello", add_special_tokens=False))
            self._specials = len(tokenizer.encode("hello", add_special_tokens=True)) - plain

    def prompt(self, index: int) -> str:
        rng = random.Random(self.seed * 1_000_003 + index)
        if self.tokenizer is None:
            return _draft(rng, self.tokens, self.unicode)
        return self._exact(rng)

    def count(self, text: str) -> int | None:
        """Tokens the server will count for text, when a tokenizer is known."""
        if self.tokenizer is None:
            return None
        return len(self.tokenizer.encode(text, add_special_tokens=True))

    def _exact(self, rng: random.Random) -> str:
        """The longest run of whole words within the target, topped up with short fillers
        (cutting token ids instead would split multi-byte characters)."""
        target = max(1, self.tokens - self._specials)

        def n(text: str) -> int:
            return len(self.tokenizer.encode(text, add_special_tokens=False))

        pieces = _pieces(rng, 2 * target + 8, self.unicode)
        while n("".join(pieces)) < target:
            pieces += [" " + p for p in _pieces(rng, target, self.unicode)]
        lo, hi = 0, len(pieces)  # n(pieces[:lo]) <= target < n(pieces[:hi]), nearly monotone
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if n("".join(pieces[:mid])) <= target:
                lo = mid
            else:
                hi = mid
        text = "".join(pieces[:lo])
        count = n(text)
        while count < target:
            grown = None
            for filler in _FILLERS:
                m = n(text + filler)
                if m == count + 1:
                    grown = (text + filler, m)
                    break
                if grown is None and count < m <= target:
                    grown = (text + filler, m)
            if grown is None:
                break  # no filler fits: the prompt stays a token or two short
            text, count = grown
        return text
