"""Tokenizers the tests train or build themselves (built once per test process), and helpers.

- sentencepiece: SentencePiece BPE with byte fallback (tokenizer.model + ChatML config);
- sp_added: the same with added tokens (ids 700, 701) in its tokenizer_config.json;
- sp_gguf / sp_gguf_no_prefix: the same vocabulary as a GGUF "llama" vocabulary;
- byte_level: byte-level BPE tokenizer.json (SmolLM-style digits split) with added tokens;
- bl_gguf: the same vocabulary as a GGUF "gpt2" vocabulary (pre "smollm");
- metaspace: a Metaspace tokenizer.json; llama_json: a Llama-2-style tokenizer.json
  (Replace, ByteFallback, Fuse, Strip) over the SentencePiece vocabulary;
- smollm2: the default model's GGUF vocabulary.
"""

from __future__ import annotations

import atexit
import functools
import io
import json
import os
import shutil
import tempfile

import gguf
import sentencepiece
import tokenizers
from hypothesis import strategies as st
from tokenizers import AddedToken, decoders, models, normalizers, pre_tokenizers, trainers

from detok_worker.detokenize import IncrementalDetokenizer
from splitserve.engine.model.default_model import default_model_path
from splitserve.tokenizers import Tokenizer, load_tokenizer
from splitserve.tokenizers.hf_tokenizer import byte_level_alphabet
from splitserve.tokenizers.synthetic import CHATML_TEMPLATE, synthetic_corpus

CHAT_SPECIALS = ["<|im_start|>", "<|im_end|>"]
# Non-special added tokens, one outside the byte-level alphabet (decoded as its UTF-8 text).
ADDED_PLAIN = ["<｜tool▁sep｜>", "MAGIC"]
ADDED_SPECIAL = ["<｜end▁of▁sentence｜>"]

TEXTS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "Café crème brûlée, naïve façade",
    "中文字符测试",
    "emoji 😀🚀🎉 mixed 中 text",
    "numbers 12345 and 3.14159",
    "tabs\tand\nnewlines",
    "a",
    "<|im_start|>user\nhi<|im_end|>",
]


@functools.cache
def _workdir() -> str:
    path = tempfile.mkdtemp(prefix="splitserve-tokenizers-")
    atexit.register(shutil.rmtree, path, True)
    return path


def _folder(name: str) -> str:
    path = os.path.join(_workdir(), name)
    os.makedirs(path, exist_ok=True)
    return path


def _write_config(folder: str, **config) -> None:
    with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"chat_template": CHATML_TEMPLATE, **config}, f)


@functools.cache
def sentencepiece_path() -> str:
    folder = _folder("sentencepiece")
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(synthetic_corpus(lines=1200, seed=1)),
        model_writer=model,
        vocab_size=700,
        model_type="bpe",
        byte_fallback=True,
        character_coverage=0.98,
        control_symbols=CHAT_SPECIALS,
        num_threads=1,
        minloglevel=2,
    )
    path = os.path.join(folder, "tokenizer.model")
    with open(path, "wb") as f:
        f.write(model.getvalue())
    _write_config(folder, bos_token="<s>", eos_token="</s>")
    return path


@functools.cache
def sp_added_path() -> str:
    """The SentencePiece model plus tokenizer_config.json added tokens beyond its vocabulary."""
    folder = _folder("sp_added")
    path = os.path.join(folder, "tokenizer.model")
    shutil.copy(sentencepiece_path(), path)
    added = {"700": {"content": "<|tool|>", "special": True}, "701": {"content": "<|x|>"}}
    _write_config(folder, bos_token="<s>", eos_token="</s>", added_tokens_decoder=added)
    return path


def _sp_vocabulary() -> tuple[list[str], list[float], list[int]]:
    sp = sentencepiece.SentencePieceProcessor(model_file=sentencepiece_path())
    n = sp.get_piece_size()
    types = []
    for i in range(n):
        kind = 1
        if sp.is_unknown(i):
            kind = 2
        elif sp.is_control(i):
            kind = 3
        elif sp.is_byte(i):
            kind = 6
        types.append(kind)
    return [sp.id_to_piece(i) for i in range(n)], [sp.get_score(i) for i in range(n)], types


def _write_gguf(path: str, **fields) -> str:
    writer = gguf.GGUFWriter(path, arch="llama")
    for name, value in fields.items():
        getattr(writer, f"add_{name}")(value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    return path


@functools.cache
def sp_gguf_path(add_space_prefix: bool = True) -> str:
    tokens, scores, types = _sp_vocabulary()
    name = "sp.gguf" if add_space_prefix else "sp-no-prefix.gguf"
    return _write_gguf(
        os.path.join(_folder("gguf"), name),
        tokenizer_model="llama",
        token_list=tokens,
        token_scores=scores,
        token_types=types,
        bos_token_id=1,
        eos_token_id=2,
        unk_token_id=0,
        add_space_prefix=add_space_prefix,
        chat_template=CHATML_TEMPLATE,
    )


@functools.cache
def byte_level_path() -> str:
    folder = _folder("byte_level")
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1200,
        show_progress=False,
        special_tokens=["<|endoftext|>", *CHAT_SPECIALS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(synthetic_corpus(lines=1500, seed=2), trainer=trainer)
    tok.add_tokens([AddedToken(t, normalized=False) for t in ADDED_PLAIN])
    tok.add_special_tokens([AddedToken(t, special=True) for t in ADDED_SPECIAL])
    path = os.path.join(folder, "tokenizer.json")
    tok.save(path)
    _write_config(folder, eos_token="<|endoftext|>", bos_token=None)
    return path


@functools.cache
def bl_gguf_path() -> str:
    data = json.loads(open(byte_level_path(), encoding="utf-8").read())
    vocab = dict(data["model"]["vocab"])
    types = {}
    for added in data["added_tokens"]:
        vocab[added["content"]] = added["id"]
        types[added["id"]] = 3 if added["special"] else 4
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    assert len(tokens) == max(vocab.values()) + 1
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    return _write_gguf(
        os.path.join(_folder("gguf"), "bl.gguf"),
        tokenizer_model="gpt2",
        tokenizer_pre="smollm",
        token_list=tokens,
        token_types=[types.get(i, 1) for i in range(len(tokens))],
        token_merges=merges,
        bos_token_id=1,
        eos_token_id=0,
        add_bos_token=False,
        chat_template=CHATML_TEMPLATE,
    )


@functools.cache
def metaspace_path() -> str:
    folder = _folder("metaspace")
    tok = tokenizers.SentencePieceBPETokenizer()
    tok.train_from_iterator(
        synthetic_corpus(lines=800, seed=3),
        vocab_size=600,
        special_tokens=["<unk>", "<s>", "</s>"],
        show_progress=False,
    )
    path = os.path.join(folder, "tokenizer.json")
    tok.save(path)
    _write_config(folder, bos_token="<s>", eos_token="</s>")
    return path


@functools.cache
def llama_json_path() -> str:
    """A Llama-2-style tokenizer.json over the SentencePiece vocabulary (merges from scores)."""
    folder = _folder("llama_json")
    tokens, scores, types = _sp_vocabulary()
    vocab = {t: i for i, t in enumerate(tokens)}
    normal = [t for t, k in zip(tokens, types, strict=True) if k == 1]
    merges = sorted(
        ((a, b) for a in normal for b in normal if a + b in vocab and types[vocab[a + b]] == 1),
        key=lambda ab: (-scores[vocab[ab[0] + ab[1]]], vocab[ab[0]], vocab[ab[1]]),
    )
    model = models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True,
                       fuse_unk=True)  # fmt: skip
    tok = tokenizers.Tokenizer(model)
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
         decoders.Strip(" ", 1, 0)]
    )  # fmt: skip
    special = [t for t, k in zip(tokens, types, strict=True) if k in (2, 3)]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    path = os.path.join(folder, "tokenizer.json")
    tok.save(path)
    _write_config(folder, bos_token="<s>", eos_token="</s>", add_bos_token=True)
    return path


BUILDERS = {
    "sentencepiece": sentencepiece_path,
    "sp_added": sp_added_path,
    "sp_gguf": sp_gguf_path,
    "sp_gguf_no_prefix": lambda: sp_gguf_path(False),
    "byte_level": byte_level_path,
    "bl_gguf": bl_gguf_path,
    "metaspace": metaspace_path,
    "llama_json": llama_json_path,
    "smollm2": default_model_path,
}


@functools.cache
def get_tokenizer(name: str) -> Tokenizer:
    return load_tokenizer(BUILDERS[name]())


def stream(tok: Tokenizer, ids: list[int], skip: bool) -> str:
    """Push ids one at a time; every delta and the flush joined."""
    detok = IncrementalDetokenizer(tok.token_table(), skip)
    return "".join(detok.push(i) for i in ids) + detok.flush()


@functools.cache
def interesting_ids(tok: Tokenizer) -> list[int]:
    """Ids worth drawing often: specials, byte/space/unk pieces, the ends, out of range."""
    table = tok.token_table()
    picks = set(table.special_ids) | set(table.lead_pieces)
    picks |= {i for i, p in enumerate(table.pieces) if p[:1] in (b" ", b"\xe4", b"\xf0")}
    picks |= {i for i, p in enumerate(table.pieces) if len(p) == 1 and p[0] >= 0x80}
    picks |= {0, tok.vocab_size - 1, -1, tok.vocab_size, tok.vocab_size + 7}
    return sorted(picks)


@functools.cache
def id_lists(tok: Tokenizer, max_size: int = 24) -> st.SearchStrategy[list[int]]:
    anywhere = st.integers(0, tok.vocab_size - 1)
    return st.lists(st.one_of(anywhere, st.sampled_from(interesting_ids(tok))), max_size=max_size)


@functools.cache
def missing_bytes(tok: Tokenizer) -> frozenset[int]:
    """Bytes a byte-level vocabulary has no token for (SmolLM2 lacks 21): encode drops them."""
    if not hasattr(tok, "backend"):
        return frozenset()
    vocab = tok.backend.get_vocab()
    return frozenset(b for b, c in byte_level_alphabet().items() if c not in vocab)


def byte_fallback_mixed_run(tok: Tokenizer, ids: list[int], skip: bool) -> bool:
    """Whether ids hold a run of byte-fallback tokens that is invalid UTF-8 yet has a complete
    character: the one case where a Hugging Face ByteFallback decoder is not streamable (it
    turns the whole run into U+FFFD per byte). Only tokenizers with that decoder can say yes."""
    if tok.token_table().utf8_errors == "replace" or not hasattr(tok, "backend"):
        return False
    backend = tok.backend
    runs, run = [], bytearray()
    for i in ids:
        token = backend.id_to_token(i) if 0 <= i < tok.vocab_size else None
        if token is None or (skip and i in tok.special_ids):
            continue  # decode() drops these before its decoder runs
        if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
            run.append(int(token[3:5], 16))
        else:
            runs.append(bytes(run))
            run = bytearray()
    runs.append(bytes(run))
    for run in runs:
        try:
            run.decode()
        except UnicodeDecodeError:
            if any(c != "\ufffd" for c in run.decode("utf-8", "splitserve-per-byte-replace")):
                return True
    return False
