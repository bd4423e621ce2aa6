"""Weight loaders: a GGUF file (quantized, Q/K permuted the way llama.cpp's converter does) and
a Hugging Face folder (single, sharded, bfloat16), written here, load into an engine whose
logits equal the numpy reference on the same (dequantized) weights."""

from __future__ import annotations

import json
import os
import struct

import gguf
import jax
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from safetensors.numpy import save_file

from lab.versus.hf_copy import export, write_tokenizer
from splitserve.engine.interface import SamplingParams
from splitserve.engine.jax.build import build_jax_engine
from splitserve.engine.model import llama_model
from splitserve.engine.model.model_files import load_model
from splitserve.engine.model.params import prepare_params
from tests.engine_reference import random_hf_weights, reference_logits

SHAPE = dict(layers=2, heads=4, kv_heads=2, head_dim=16)
HIDDEN, INTER, VOCAB = 64, 256, 300  # INTER = 256 so ffn_down rows hold whole K-quant blocks
THETA, EPS = 50000.0, 1e-5
TOKENS = [5, 17, 250, 3, 99, 42, 7, 7, 1, 280, 64]


def _weights(seed: int, tied: bool) -> dict[str, np.ndarray]:
    return random_hf_weights(
        np.random.default_rng(seed), VOCAB, HIDDEN, INTER, *SHAPE.values(), tied
    )


def _check_logits(model: str, w: dict[str, np.ndarray]) -> None:
    cfg, weights = load_model(model)
    assert (cfg.hidden, cfg.intermediate, cfg.vocab_size) == (HIDDEN, INTER, VOCAB)
    assert (cfg.layers, cfg.heads, cfg.kv_heads, cfg.head_dim) == tuple(SHAPE.values())
    assert cfg.rope_theta == pytest.approx(THETA) and cfg.rms_eps == pytest.approx(EPS)
    assert cfg.tie_embeddings == ("lm_head.weight" not in w)
    params = prepare_params(cfg, weights)
    forward = jax.jit(llama_model.forward, static_argnums=0)
    got = np.asarray(forward(cfg, params, np.array(TOKENS)))
    want = reference_logits(w, TOKENS, rope_theta=THETA, rms_eps=EPS, **SHAPE)
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)


# -- GGUF ------------------------------------------------------------------------------------


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute: each head's rotary halves -> pairs."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def _f16(x: float) -> bytes:
    return np.float16(x).tobytes()


def pack_q4_k(rng: np.random.Generator, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """Random Q4_K blocks built from their integer fields; returns (bytes, exact values).

    Block of 256: f16 d, f16 dmin, 12 bytes of 6-bit (scale, min) for 8 sub-blocks of 32,
    128 bytes of 4-bit quants; value = d * scale * q - dmin * min.
    """
    out = np.zeros((rows, cols // 256, 144), np.uint8)
    val = np.zeros((rows, cols // 256, 256), np.float32)
    for r in range(rows):
        for b in range(cols // 256):
            d, dmin = np.float16(rng.uniform(1e-4, 3e-4)), np.float16(rng.uniform(1e-4, 3e-4))
            sc, mn = rng.integers(0, 64, 8), rng.integers(0, 64, 8)
            q = rng.integers(0, 16, 256)
            scales = np.zeros(12, np.uint8)
            for j in range(4):
                scales[j] = sc[j]
                scales[j + 4] = mn[j]
            for j in range(4, 8):
                scales[j + 4] = (sc[j] & 0xF) | ((mn[j] & 0xF) << 4)
                scales[j - 4] |= (sc[j] >> 4) << 6
                scales[j] |= (mn[j] >> 4) << 6
            qs = np.zeros(128, np.uint8)
            for c in range(4):
                qs[32 * c : 32 * c + 32] = q[64 * c : 64 * c + 32] | (
                    q[64 * c + 32 : 64 * c + 64] << 4
                )
            out[r, b] = np.frombuffer(
                _f16(d) + _f16(dmin) + scales.tobytes() + qs.tobytes(), np.uint8
            )
            sub = np.arange(256) // 32
            val[r, b] = np.float32(d) * sc[sub] * q - np.float32(dmin) * mn[sub]
    return out.reshape(rows, -1), val.reshape(rows, cols)


def pack_q6_k(rng: np.random.Generator, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """Random Q6_K blocks: 128 bytes low nibbles, 64 bytes high 2-bit pairs, 16 int8 scales
    (one per 16 values), f16 d; value = d * scale * (q - 32)."""
    out = np.zeros((rows, cols // 256, 210), np.uint8)
    val = np.zeros((rows, cols // 256, 256), np.float32)
    for r in range(rows):
        for b in range(cols // 256):
            d = np.float16(rng.uniform(5e-5, 1.5e-4))
            sc = rng.integers(-30, 31, 16).astype(np.int8)
            q = rng.integers(0, 64, 256)
            ql, qh = np.zeros(128, np.uint8), np.zeros(64, np.uint8)
            for n in range(2):
                for lo in range(32):
                    a, bb, c, e = (q[128 * n + lo + 32 * i] for i in range(4))
                    ql[64 * n + lo] = (a & 0xF) | ((c & 0xF) << 4)
                    ql[64 * n + lo + 32] = (bb & 0xF) | ((e & 0xF) << 4)
                    hi = (a >> 4) | ((bb >> 4) << 2) | ((c >> 4) << 4) | ((e >> 4) << 6)
                    qh[32 * n + lo] = hi
            out[r, b] = np.frombuffer(
                ql.tobytes() + qh.tobytes() + sc.tobytes() + _f16(d), np.uint8
            )
            val[r, b] = np.float32(d) * sc[np.arange(256) // 16].astype(np.float32) * (q - 32)
    return out.reshape(rows, -1), val.reshape(rows, cols)


# Per (GGUF name, layer): the type it is stored as. Both K-quants sit on ffn_down (256 wide).
TYPES = {
    ("attn_q", 0): Q.Q4_0,
    ("attn_q", 1): Q.F32,
    ("attn_k", 0): Q.Q4_1,
    ("attn_k", 1): Q.BF16,
    ("attn_v", 0): Q.F16,
    ("attn_v", 1): Q.Q8_0,
    ("attn_output", 0): Q.BF16,
    ("attn_output", 1): Q.Q4_0,
    ("ffn_gate", 0): Q.Q8_0,
    ("ffn_gate", 1): Q.Q4_1,
    ("ffn_up", 0): Q.F16,
    ("ffn_up", 1): Q.F32,
    ("ffn_down", 0): Q.Q4_K,
    ("ffn_down", 1): Q.Q6_K,
}
HF_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def _store(writer, name: str, w: np.ndarray, qtype, rng) -> np.ndarray:
    """Add tensor `name` (numpy [out, in]) as qtype; return the values a reader must see."""
    if qtype == Q.F32:
        writer.add_tensor(name, w.astype(np.float32))
        return w
    if qtype == Q.F16:
        writer.add_tensor(name, w.astype(np.float16))
        return w.astype(np.float16).astype(np.float32)
    if qtype in (Q.Q4_K, Q.Q6_K):
        raw, values = (pack_q4_k if qtype == Q.Q4_K else pack_q6_k)(rng, *w.shape)
        writer.add_tensor(name, raw, raw_dtype=qtype)
        return values
    raw = gguf.quants.quantize(w, qtype)
    writer.add_tensor(name, raw, raw_dtype=qtype)
    return gguf.quants.dequantize(raw, qtype).reshape(w.shape)


def write_gguf(path: str, w: dict[str, np.ndarray], seed: int = 0) -> dict[str, np.ndarray]:
    """Write HF-named weights w as a llama GGUF; returns w as stored (what loading must give)."""
    rng = np.random.default_rng(seed)
    heads, kv_heads = SHAPE["heads"], SHAPE["kv_heads"]
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(SHAPE["layers"])
    writer.add_context_length(512)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(INTER)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(THETA)
    writer.add_layer_norm_rms_eps(EPS)
    stored = dict(w)
    stored["model.embed_tokens.weight"] = _store(
        writer, "token_embd.weight", w["model.embed_tokens.weight"], Q.Q8_0, rng
    )
    for i in range(SHAPE["layers"]):
        p = f"model.layers.{i}."
        writer.add_tensor(f"blk.{i}.attn_norm.weight", w[p + "input_layernorm.weight"])
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", w[p + "post_attention_layernorm.weight"])
        for name, hf in HF_NAMES.items():
            mat = w[p + hf + ".weight"]
            if name in ("attn_q", "attn_k"):
                n = heads if name == "attn_q" else kv_heads
                # quantization works row by row, so permuting rows commutes with it
                seen = _store(
                    writer, f"blk.{i}.{name}.weight", llama_cpp_permute(mat, n), TYPES[name, i], rng
                )
                stored[p + hf + ".weight"] = seen[
                    np.argsort(llama_cpp_permute(np.arange(mat.shape[0]), n))
                ]
            else:
                stored[p + hf + ".weight"] = _store(
                    writer, f"blk.{i}.{name}.weight", mat, TYPES[name, i], rng
                )
    writer.add_tensor("output_norm.weight", w["model.norm.weight"])
    if "lm_head.weight" in w:
        stored["lm_head.weight"] = _store(writer, "output.weight", w["lm_head.weight"], Q.F16, rng)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return stored


def test_k_quant_packing_matches_gguf_dequantize():
    rng = np.random.default_rng(0)
    for pack, qtype in ((pack_q4_k, Q.Q4_K), (pack_q6_k, Q.Q6_K)):
        raw, values = pack(rng, 3, 512)
        np.testing.assert_array_equal(gguf.quants.dequantize(raw, qtype), values)


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_gguf_loads_and_matches_reference(tmp_path, tied):
    path = str(tmp_path / "m.gguf")
    stored = write_gguf(path, _weights(1, tied))
    _check_logits(path, stored)


def test_gguf_other_architecture_is_refused(tmp_path):
    path = str(tmp_path / "q.gguf")
    writer = gguf.GGUFWriter(path, "qwen2")
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="architecture"):
        load_model(path)


# -- Hugging Face ----------------------------------------------------------------------------


def _hf_config(tied: bool) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "intermediate_size": INTER,
        "num_hidden_layers": SHAPE["layers"],
        "num_attention_heads": SHAPE["heads"],
        "num_key_value_heads": SHAPE["kv_heads"],
        "rope_theta": THETA,
        "rms_norm_eps": EPS,
        "tie_word_embeddings": tied,
        "max_position_embeddings": 512,
        "rope_scaling": None,
    }


def _write_bf16_safetensors(path: str, tensors: dict[str, np.ndarray]) -> None:
    """safetensors.numpy cannot write bfloat16: write the format by hand (JSON header)."""
    header, blobs, offset = {}, [], 0
    for name, arr in tensors.items():
        data = (arr.astype(np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()
        header[name] = {
            "dtype": "BF16",
            "shape": list(arr.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head + b"".join(blobs))


@pytest.mark.parametrize("layout", ["single", "sharded", "bf16"])
def test_hf_folder_loads_and_matches_reference(tmp_path, layout):
    tied = layout == "sharded"
    w = _weights(2, tied)
    folder = tmp_path / layout
    os.makedirs(folder)
    (folder / "config.json").write_text(json.dumps(_hf_config(tied)))
    if layout == "single":
        save_file(w, str(folder / "model.safetensors"))
    elif layout == "sharded":
        names = sorted(w)
        shards = {
            "model-00001-of-00002.safetensors": names[::2],
            "model-00002-of-00002.safetensors": names[1::2],
        }
        for shard, keys in shards.items():  # one shard float16, to cover the conversion
            dt = np.float16 if shard.startswith("model-00002") else np.float32
            save_file({k: w[k].astype(dt) for k in keys}, str(folder / shard))
            for k in keys:
                w[k] = w[k].astype(dt).astype(np.float32)
        index = {"metadata": {}, "weight_map": {k: s for s, ks in shards.items() for k in ks}}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    else:
        _write_bf16_safetensors(str(folder / "model.safetensors"), w)
        w = {k: ((v.view(np.uint32) >> 16) << 16).view(np.float32) for k, v in w.items()}
    _check_logits(str(folder), w)


def test_engine_factory_runs_a_loaded_folder(tmp_path):
    w = _weights(3, False)
    (tmp_path / "config.json").write_text(json.dumps(_hf_config(False)))
    save_file(w, str(tmp_path / "model.safetensors"))
    engine = build_jax_engine(str(tmp_path), 2, 32, prefill_buckets=(32,), decode_buckets=(32,))
    prefix = engine.prefill(TOKENS, SamplingParams())
    want = reference_logits(w, TOKENS, rope_theta=THETA, rms_eps=EPS, **SHAPE)[-1]
    assert prefix.first_token == int(want.argmax())
    with pytest.raises(FileNotFoundError):
        build_jax_engine(str(tmp_path / "missing"), 2, 32)


def test_lazy_gguf_weights_know_their_shapes_before_they_are_made(tmp_path):
    path = str(tmp_path / "m.gguf")
    write_gguf(path, _weights(4, tied=False))
    _, weights = load_model(path)
    assert set(weights) >= {"embed", "wq", "w_down", "head"} and "nothing" not in weights
    assert not weights._made  # reading names and shapes makes nothing
    for name in weights:
        assert tuple(weights[name].shape) == weights.shape_of(name), name


def test_an_engine_of_one_side_prepares_only_its_weights(tmp_path):
    """A decode worker's engine makes float32 copies only of what the native kernel cannot take
    as the file has it; a prefill worker's reads no native blocks; each computes what an engine
    of both sides does on its side."""
    from splitserve.engine.interface import SamplingParams
    from splitserve.engine.jax.engine import JaxEngine
    from splitserve.engine.model.model_files import load_native

    path = str(tmp_path / "m.gguf")
    write_gguf(path, _weights(5, tied=False))
    cfg, weights = load_model(path)
    native = load_native(path, cfg)
    decode = JaxEngine(cfg, weights, 2, 64, native=native, sides=("decode",))
    fused = {"wq": ("wq", "wk", "wv"), "wk": ("wq", "wk", "wv"), "wv": ("wq", "wk", "wv"),
             "w_gate": ("w_gate", "w_up"), "w_up": ("w_gate", "w_up"), "wo": ("wo",),
             "w_down": ("w_down",), "head": ("head",)}  # fmt: skip
    lacking = {name for name, group in fused.items()
               if any(native[g] is None or (isinstance(native[g], list) and None in native[g])
                      for g in group)}  # fmt: skip
    assert set(weights._made) <= {"embed", "attn_norm", "ffn_norm", "final_norm"} | lacking
    assert decode.params is decode.decode_params  # no float32 prefill copy

    prefill = build_jax_engine(path, 2, 64, sides=("prefill",))
    assert prefill.params is prefill.decode_params and prefill.weight_format == "float32"
    both = build_jax_engine(path, 2, 64)
    a, b = both.prefill(TOKENS, SamplingParams()), prefill.prefill(TOKENS, SamplingParams())
    np.testing.assert_array_equal(a.kv[0], b.kv[0])
    assert a.first_token == b.first_token
    runs = []
    for engine in (both, decode):
        engine.insert(a, 0, SamplingParams())
        runs.append([int(engine.generate().tokens[0]) for _ in range(6)])
    assert runs[0] == runs[1]
    with pytest.raises(ValueError, match="sides"):
        JaxEngine(cfg, weights, 2, 64, sides=("router",))


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_a_hugging_face_copy_of_a_gguf_file_is_the_same_model(tmp_path, tied):
    """The lab's float32 copy for vLLM (lab/versus/hf_copy.py): the folder loads into
    exactly the GGUF file's canonical weights and config, so its logits are the reference's."""
    path = str(tmp_path / "m.gguf")
    stored = write_gguf(path, _weights(1, tied))
    folder = export(path, str(tmp_path / "hf"), tokenizer=False)
    (cfg_gguf, from_gguf), (cfg_hf, from_hf) = load_model(path), load_model(folder)
    assert cfg_hf == cfg_gguf
    assert set(from_hf) == set(from_gguf)
    for name in from_gguf:
        np.testing.assert_array_equal(from_hf[name], from_gguf[name], err_msg=name)
    _check_logits(folder, stored)


def test_the_copy_carries_the_default_models_own_tokenizer(tmp_path):
    from splitserve.engine.model.default_model import default_model_path
    from splitserve.tokenizers import load_tokenizer

    model = default_model_path()
    write_tokenizer(model, str(tmp_path))
    ours, copied = load_tokenizer(model), load_tokenizer(str(tmp_path / "tokenizer.json"))
    for text in ("Hello, world!", " naïve 東京 🙂\n\tcode()", "<|im_start|>user\nhi<|im_end|>"):
        assert copied.encode(text) == ours.encode(text), text
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["chat_template"] == ours.chat_template.source and config["eos_token"]


def test_a_copy_of_a_random_preset_carries_a_tokenizer_of_its_vocabulary(tmp_path):
    """The 7M checkpoint's copy for vLLM: the same weights, and a tokenizer.json whose ids are
    exactly the preset's vocabulary, so vLLM and splitserve read one folder."""
    from splitserve.tokenizers import load_tokenizer

    folder = export("random:test-tiny", str(tmp_path / "hf"))
    (cfg, weights), (cfg_hf, from_hf) = load_model("random:test-tiny"), load_model(folder)
    assert cfg_hf == cfg
    for name in weights:
        np.testing.assert_array_equal(from_hf[name], weights[name], err_msg=name)
    tok = load_tokenizer(os.path.join(folder, "tokenizer.json"))
    assert tok.vocab_size == cfg.vocab_size
    assert tok.decode(tok.encode("hello world")) == "hello world"
