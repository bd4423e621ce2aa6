"""Tokenizer kinds behind one interface: loading, round trips, GGUF vocabularies against the
models they were built from, SmolLM2's real vocabulary, chat templates, the synthetic tokenizer."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from tokenizer_cases import BUILDERS, TEXTS, get_tokenizer, missing_bytes, stream
from tokenizers import Regex, pre_tokenizers

from splitserve.gguf_header import read_metadata as read_gguf_metadata
from splitserve.tokenizers import ChatTemplateError, NoChatTemplateError, load_tokenizer
from splitserve.tokenizers.chat_template import ChatTemplate
from splitserve.tokenizers.hf_tokenizer import HFTokenizer, byte_level_alphabet
from splitserve.tokenizers.sentencepiece_tokenizer import SentencePieceTokenizer
from splitserve.tokenizers.synthetic import build_synthetic_tokenizer

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# Tokenizers that can encode any text and give it back unchanged.
LOSSLESS = ["byte_level", "bl_gguf", "sp_gguf", "smollm2"]
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi 中文 😀"}]


@pytest.mark.parametrize(
    "name,kind",
    [
        ("sentencepiece", SentencePieceTokenizer),
        ("sp_gguf", SentencePieceTokenizer),
        ("byte_level", HFTokenizer),
        ("bl_gguf", HFTokenizer),
        ("metaspace", HFTokenizer),
        ("llama_json", HFTokenizer),
        ("smollm2", HFTokenizer),
    ],
)
def test_load_tokenizer_picks_the_kind_from_the_path(name, kind):
    path = BUILDERS[name]()
    assert isinstance(load_tokenizer(path), kind)
    if not path.endswith(".gguf"):  # a folder holding tokenizer.json / tokenizer.model
        assert isinstance(load_tokenizer(os.path.dirname(path)), kind)


def test_load_tokenizer_errors_are_clear(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_tokenizer(str(tmp_path / "missing.gguf"))
    with pytest.raises(FileNotFoundError, match="no tokenizer.json"):
        load_tokenizer(str(tmp_path))
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ValueError, match="unknown tokenizer kind"):
        load_tokenizer(str(tmp_path / "weights.bin"))


@pytest.mark.parametrize("name", LOSSLESS + ["sentencepiece", "llama_json"])
@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(name, text):
    tok = get_tokenizer(name)
    normalizes = name in ("sentencepiece", "llama_json")
    if normalizes and ("\t" in text or "<|" in text):
        pytest.skip("NFKC / whitespace normalization or a special token: not a round trip")
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=False) == text
    assert stream(tok, ids, skip=False) == text


@pytest.mark.parametrize("name", LOSSLESS)
@SETTINGS
@given(text=st.text(max_size=40))
def test_round_trip_any_text(name, text):
    tok = get_tokenizer(name)
    # SmolLM2's vocabulary lacks 21 bytes (e.g. \x04, 0xF1): encode drops them, as its own does.
    assume(not missing_bytes(tok).intersection(text.encode()))
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=False) == text


@pytest.mark.parametrize("name", ["sentencepiece", "sp_gguf", "llama_json"])
def test_add_bos(name):
    tok = get_tokenizer(name)
    assert tok.add_bos and tok.bos_id == 1
    assert tok.encode("hi")[0] == 1
    assert tok.encode("hi", add_special_tokens=False)[0] != 1


def test_table_shape_and_specials():
    for name in BUILDERS:
        tok = get_tokenizer(name)
        table = tok.token_table()
        assert len(table.pieces) == tok.vocab_size
        assert table.special_ids == tok.special_ids
        assert tok.eos_ids and tok.eos_ids <= tok.special_ids


def test_sentencepiece_edge_cases_in_the_table():
    tok = get_tokenizer("sentencepiece")
    table = tok.token_table()
    assert table.pieces[0] == " ⁇ ".encode()  # <unk>'s surface, never stripped
    assert table.lead_pieces[0] == table.pieces[0]
    assert tok.decode([0, 0]) == " ⁇  ⁇ "
    assert table.special_ids == {1, 2, 3, 4}  # <s>, </s>, <|im_start|>, <|im_end|>
    assert tok.decode([1, 3], skip_special_tokens=False) == "<s><|im_start|>"
    # A control token between byte pieces: skipped, it does not split the character.
    zhong = tok.encode("中", add_special_tokens=False)
    assert len(zhong) > 1, "中 should fall back to bytes in this small vocabulary"
    ids = [zhong[0], zhong[1], 3, *zhong[2:]]
    assert tok.decode(ids) == stream(tok, ids, skip=True)
    assert tok.decode(ids, skip_special_tokens=False) == stream(tok, ids, skip=False)


def test_sentencepiece_added_tokens_beyond_the_vocabulary():
    tok = get_tokenizer("sp_added")
    assert tok.vocab_size == 702 and {700, 701} <= tok.special_ids
    ids = tok.encode("a<|tool|>中<|x|>")
    assert ids[0] == 1 and 700 in ids and 701 in ids
    # Each text fragment gets SentencePiece's dummy-prefix space, as llama.cpp does.
    assert tok.decode(ids) == "a 中"
    assert tok.decode(ids, skip_special_tokens=False) == "<s>a<|tool|> 中<|x|>"
    for skip in (True, False):
        assert stream(tok, ids, skip) == tok.decode(ids, skip_special_tokens=skip)


def test_gguf_sentencepiece_vocabulary_encodes_like_the_model_it_came_from():
    original, from_gguf = get_tokenizer("sentencepiece"), get_tokenizer("sp_gguf")
    for text in ["hello world", "中文字符测试 and 😀🚀", "naïve café", "a b c"]:
        assert from_gguf.encode(text) == original.encode(text)
    no_prefix = get_tokenizer("sp_gguf_no_prefix")
    assert not no_prefix.token_table().strip_leading_space
    ids = no_prefix.encode("hello world", add_special_tokens=False)
    assert no_prefix.decode(ids) == "hello world"


def test_gguf_byte_level_vocabulary_matches_the_tokenizer_json():
    original, from_gguf = get_tokenizer("byte_level"), get_tokenizer("bl_gguf")
    assert from_gguf.vocab_size == original.vocab_size
    assert from_gguf.special_ids == original.special_ids
    assert from_gguf.token_table().pieces == original.token_table().pieces
    for text in TEXTS + ["MAGIC<｜tool▁sep｜>x", "<｜end▁of▁sentence｜>", "  lots   of  space  "]:
        assert from_gguf.encode(text) == original.encode(text), text


@SETTINGS
@given(text=st.text(max_size=60))
def test_gguf_byte_level_encode_matches_any_text(text):
    assert get_tokenizer("bl_gguf").encode(text) == get_tokenizer("byte_level").encode(text)


def test_added_token_outside_the_byte_alphabet_decodes_as_its_text():
    tok = get_tokenizer("byte_level")
    ids = tok.encode("a<｜tool▁sep｜>b")
    assert len(ids) == 3
    assert tok.token_table().pieces[ids[1]] == "<｜tool▁sep｜>".encode()
    assert tok.decode(ids) == stream(tok, ids, skip=True) == "a<｜tool▁sep｜>b"


# --- SmolLM2-135M-Instruct's real vocabulary (the default model) ---------------------------------


def test_smollm2_special_tokens():
    tok = get_tokenizer("smollm2")
    assert tok.vocab_size == 49152
    assert tok.special_ids == frozenset(range(17))
    assert tok.eos_ids == {0, 2}  # <|endoftext|>, <|im_end|>
    assert tok.bos_id == 1 and not tok.add_bos
    assert tok.encode("<|im_start|>") == [1]
    assert tok.encode("<|im_end|>") == [2]
    assert tok.encode("<|endoftext|>") == [0]


def test_smollm2_chat_prompt():
    tok = get_tokenizer("smollm2")
    prompt = tok.apply_chat_template(CHAT[1:])
    assert prompt.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert prompt.endswith("<|im_end|>\n<|im_start|>assistant\n")
    ids = tok.encode(prompt)
    assert ids[:3] == [1, 9690, 198]  # <|im_start|> system \n
    assert ids[-4:] == [1, 520, 9531, 198]  # <|im_start|> assistant \n
    assert ids.count(1) == 3 and ids.count(2) == 2
    assert tok.decode(ids, skip_special_tokens=False) == prompt
    no_prompt = tok.apply_chat_template(CHAT, add_generation_prompt=False)
    assert no_prompt.startswith("<|im_start|>system\nBe brief.<|im_end|>")
    assert not no_prompt.endswith("assistant\n")


GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"


def _llama_cpp_smollm_encode(meta: dict, text: str) -> list[int]:
    """An independent encoder written the way llama.cpp's "smollm" one is: split off every
    \\p{N}, then GPT-2's regex, map bytes to the byte-level alphabet, merge by rank."""
    vocab = {t: i for i, t in enumerate(meta["tokenizer.ggml.tokens"])}
    ranks = {tuple(m.split(" ")): r for r, m in enumerate(meta["tokenizer.ggml.merges"])}
    split = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"),
            pre_tokenizers.Split(Regex(GPT2_SPLIT), behavior="isolated"),
        ]
    )
    alphabet = byte_level_alphabet()
    ids = []
    for word, _ in split.pre_tokenize_str(text):
        parts = [alphabet[b] for b in word.encode()]
        while len(parts) > 1:
            pairs = zip(parts, parts[1:], strict=False)
            rank, n = min((ranks.get(pair, 1 << 30), n) for n, pair in enumerate(pairs))
            if rank == 1 << 30:
                break
            parts[n : n + 2] = [parts[n] + parts[n + 1]]
        ids.extend(vocab[p] for p in parts)
    return ids


def test_smollm2_encode_matches_an_independent_llama_cpp_style_encoder():
    meta = read_gguf_metadata(BUILDERS["smollm2"]())
    tok = get_tokenizer("smollm2")
    texts = TEXTS[:-1] + [
        "Prices rose 12.5% in 2023, i.e. from $1,000 to $1,125!",
        "def f(x):\n    return x ** 2  # square\n\n\n",
        "  leading and trailing spaces  ",
        "I'm sure they'll say it's fine, won't they?",
        "Ünïcödé ßtraße – “quotes” … ½ ² ٣",
    ]
    for text in texts:
        assert tok.encode(text) == _llama_cpp_smollm_encode(meta, text), text
    assert tok.encode("2024") == [tok.encode(d)[0] for d in "2024"]  # digits one by one


# --- chat templates ------------------------------------------------------------------------------


def test_chat_template_renders_with_bos_eos_and_generation_prompt():
    template = ChatTemplate(
        "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{{ eos_token }}"
        "{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}",
        bos_token="<s>",
        eos_token="</s>",
    )
    assert template.render(CHAT) == "<s>[system]Be brief.</s>[user]Hi 中文 😀</s>[assistant]"
    assert template.render(CHAT, add_generation_prompt=False).endswith("</s>")


def test_chat_template_errors_are_client_errors():
    strict = ChatTemplate(
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}ok"
    )
    with pytest.raises(ChatTemplateError, match="user first"):
        strict.render(CHAT)
    assert strict.render(CHAT[1:]) == "ok"
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{{ messages[0]['content'] }}").render([])
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{% for %}")
    with pytest.raises(ChatTemplateError):
        ChatTemplate("ok").render("not a list")


def test_chat_template_is_sandboxed():
    escape = ChatTemplate("{{ messages.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(ChatTemplateError):
        escape.render(CHAT)
    mutate = ChatTemplate("{% set _ = messages.append(1) %}{{ messages | length }}")
    with pytest.raises(ChatTemplateError):
        mutate.render(CHAT)


@pytest.mark.parametrize("source, words", [
    ("{{ 'x' * 10000000000 }}", "repetition"),  # would allocate 10 GB
    ("{{ [0] * 10000000000 }}", "repetition"),
    ("{{ 10000000000 * 'x' }}", "repetition"),
    ("{{ 3 ** 100000000 }}", "power"),
    ("{% for i in range(100000) %}{{ 'y' * 1000 }}{% endfor %}", "renders over"),
])  # fmt: skip
def test_a_template_cannot_grow_a_prompt_past_its_bound(source, words):
    with pytest.raises(ChatTemplateError, match=words):
        ChatTemplate(source).render(CHAT)  # (a constant is not folded when it compiles)


def test_bounded_operators_still_work_within_the_bound():
    template = ChatTemplate("{{ '=' * 3 }}{{ [1] * 2 }}{{ 2 ** 10 }}{{ 6 * 7 }}{{ 1.5 * 2 }}")
    assert template.render(CHAT) == "===[1, 1]1024423.0"


def test_model_without_chat_template(tmp_path):
    tok = get_tokenizer("metaspace")  # its config has one; a bare tokenizer.json has none
    assert tok.apply_chat_template(CHAT[1:]).startswith("<|im_start|>user\n")
    bare = tmp_path / "tokenizer.json"
    bare.write_text(get_tokenizer("metaspace").backend.to_str())
    with pytest.raises(NoChatTemplateError, match="no chat template"):
        load_tokenizer(str(bare)).apply_chat_template(CHAT)


# --- the synthetic tokenizer ---------------------------------------------------------------------


@pytest.mark.parametrize("fixture", ["tokenizer_512", "tokenizer_8000"])
def test_synthetic_tokenizer_has_exactly_the_asked_vocab(fixture, request):
    path = request.getfixturevalue(fixture)
    size = int(fixture.split("_")[1])
    tok = load_tokenizer(path)
    assert tok.vocab_size == size
    assert len(tok.backend.get_vocab()) == size
    assert tok.token_table().special_ids >= {0, 1, 2}
    assert tok.eos_ids == {0, 2}
    prompt = tok.apply_chat_template(CHAT[1:])
    assert prompt == "<|im_start|>user\nHi 中文 😀<|im_end|>\n<|im_start|>assistant\n"
    ids = tok.encode(prompt)
    assert ids[0] == 1 and ids.count(1) == 2 and ids.count(2) == 1
    assert tok.decode(ids, skip_special_tokens=False) == prompt


def test_synthetic_tokenizer_is_deterministic_and_cached(tmp_path, tokenizer_8000):
    # outcomes only: the same bytes as another build, and a second call that writes nothing
    path = build_synthetic_tokenizer(str(tmp_path / "a"), 8000)
    with open(path, "rb") as f, open(tokenizer_8000, "rb") as g:
        assert f.read() == g.read()
    mtime = os.stat(path).st_mtime_ns
    assert build_synthetic_tokenizer(str(tmp_path / "a"), 8000) == path
    assert os.stat(path).st_mtime_ns == mtime
    with pytest.raises(ValueError):
        build_synthetic_tokenizer(str(tmp_path / "b"), 100)
