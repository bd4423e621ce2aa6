"""Load a llama-architecture GGUF file into canonical weights (see llama_model).

The header is read by splitserve.gguf_header (metadata scalars and the tensor table; the
tokenizer's arrays are skipped); tensor data is memory-mapped. `load_gguf` dequantizes
each tensor (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K, ...) to float32 with `gguf.quants.dequantize` when
it is first used: the canonical weights every engine path starts from.
`load_gguf_native` also hands over the file's Q8_0, Q4_0 and Q4_1 matrices as they are, for
the native kernel (kernels/quant.py), which computes with exactly those values at a quarter to a
sixth of float32's memory traffic.

Rotary layout: llama.cpp's converter permutes the rows of Q and K (per head, from the
Hugging Face "two halves" layout to interleaved pairs, the layout its rope kernel uses).
We undo that permutation here so one model implementation serves every weight source.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import numpy as np
from gguf.constants import GGMLQuantizationType
from gguf.quants import dequantize, quant_shape_to_byte_shape

from splitserve.engine.model.llama_config import LlamaConfig
from splitserve.gguf_header import open_gguf


def read_gguf(path: str) -> tuple[dict, dict[str, tuple[GGMLQuantizationType, tuple, np.ndarray]]]:
    """Metadata (arrays skipped) and tensors {name: (type, numpy shape, raw uint8 bytes)}."""
    buf, header = open_gguf(path, arrays=False)
    if header.version not in (2, 3):
        raise ValueError(f"{path}: unsupported GGUF version {header.version}")
    tensors = {}
    for info in header.tensors:
        qtype = GGMLQuantizationType(info.ggml_type)
        byte_shape = quant_shape_to_byte_shape(info.shape, qtype)
        start = header.data_start + info.offset
        raw = buf[start:start + int(np.prod(byte_shape))].reshape(byte_shape)
        tensors[info.name] = (qtype, info.shape, raw)
    return header.metadata, tensors


def unpermute_rotary(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation. w: [n_head * head_dim, in] (out-major rows)."""
    head_dim = w.shape[0] // n_head
    return w.reshape(n_head, head_dim // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def config_from_gguf(meta: dict, names: set[str], vocab_rows: int) -> LlamaConfig:
    """LlamaConfig from `llama.*` metadata; tied when the file has no output.weight."""
    arch = meta.get("general.architecture", "llama")
    if arch != "llama":
        raise ValueError(f"unsupported GGUF architecture {arch!r} (only 'llama')")
    if "rope_freqs.weight" in names:
        raise ValueError("GGUF uses rope frequency scaling (rope_freqs.weight): unsupported")
    hidden = int(meta["llama.embedding_length"])
    heads = int(meta["llama.attention.head_count"])
    return LlamaConfig(
        vocab_size=vocab_rows,  # the embedding is the authority, not optional metadata
        hidden=hidden,
        intermediate=int(meta["llama.feed_forward_length"]),
        layers=int(meta["llama.block_count"]),
        heads=heads,
        kv_heads=int(meta.get("llama.attention.head_count_kv", heads)),
        head_dim=int(meta.get("llama.attention.key_length", hidden // heads)),
        rope_theta=float(meta.get("llama.rope.freq_base", 10000.0)),
        rms_eps=float(meta.get("llama.attention.layer_norm_rms_epsilon", 1e-5)),
        tie_embeddings="output.weight" not in names,
        max_position=int(meta.get("llama.context_length", 2048)),
    )


class LazyWeights(Mapping):
    """Canonical weights made on first use, then kept: an engine that computes with a GGUF
    file's own blocks (the decode side) never needs the float32 copies of those matrices, which
    take seconds to make and several times the blocks' memory to hold. `shape_of` answers without
    making the array (params.check_weights)."""

    def __init__(self, makers: dict[str, Callable[[], np.ndarray]], shapes: dict[str, tuple]):
        self._makers, self._shapes, self._made = makers, shapes, {}

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._made:
            self._made[name] = self._makers[name]()
        return self._made[name]

    def __contains__(self, name: object) -> bool:  # Mapping's own would make the array
        return name in self._makers

    def __iter__(self) -> Iterator[str]:
        return iter(self._makers)

    def __len__(self) -> int:
        return len(self._makers)

    def shape_of(self, name: str) -> tuple:
        return self._shapes[name]


def load_gguf(path: str) -> tuple[LlamaConfig, LazyWeights]:
    """Read config and canonical float32 weights from a GGUF file (dequantized on first use)."""
    meta, raw = read_gguf(path)
    shapes = {name: tuple(shape) for name, (_, shape, _) in raw.items()}  # [out, in]
    cfg = config_from_gguf(meta, set(raw), shapes["token_embd.weight"][0])

    def tensor(name: str) -> np.ndarray:
        qtype, shape, data = raw[name]
        return np.asarray(dequantize(data, qtype), np.float32).reshape(shape)

    def per_layer(name: str, transform=lambda a: a) -> Callable[[], np.ndarray]:
        return lambda: np.stack([transform(tensor(f"blk.{i}.{name}.weight"))
                                 for i in range(cfg.layers)])  # fmt: skip

    def linear(name: str, transform=lambda a: a) -> Callable[[], np.ndarray]:
        return per_layer(name, lambda a: np.ascontiguousarray(transform(a).T))  # -> [in, out]

    makers = {
        "embed": lambda: tensor("token_embd.weight"),
        "attn_norm": per_layer("attn_norm"),
        "wq": linear("attn_q", lambda a: unpermute_rotary(a, cfg.heads)),
        "wk": linear("attn_k", lambda a: unpermute_rotary(a, cfg.kv_heads)),
        "wv": linear("attn_v"),
        "wo": linear("attn_output"),
        "ffn_norm": per_layer("ffn_norm"),
        "w_gate": linear("ffn_gate"),
        "w_up": linear("ffn_up"),
        "w_down": linear("ffn_down"),
        "final_norm": lambda: tensor("output_norm.weight"),
    }
    block = lambda name: shapes[f"blk.0.{name}.weight"]  # noqa: E731
    out = {
        "embed": shapes["token_embd.weight"],
        "final_norm": shapes["output_norm.weight"],
        **{k: (cfg.layers, *block(n)) for k, n in (("attn_norm", "attn_norm"),
                                                     ("ffn_norm", "ffn_norm"))},
        **{k: (cfg.layers, *block(n)[::-1]) for k, n in (
            ("wq", "attn_q"), ("wk", "attn_k"), ("wv", "attn_v"), ("wo", "attn_output"),
            ("w_gate", "ffn_gate"), ("w_up", "ffn_up"), ("w_down", "ffn_down"))},
    }  # fmt: skip
    if not cfg.tie_embeddings:
        makers["head"] = lambda: np.ascontiguousarray(tensor("output.weight").T)
        out["head"] = shapes["output.weight"][::-1]
    return cfg, LazyWeights(makers, out)


# Canonical matrix name -> (GGUF tensor name in a block, heads whose rotary rows to un-permute)
_LINEAR = {
    "wq": ("attn_q", "heads"), "wk": ("attn_k", "kv_heads"), "wv": ("attn_v", None),
    "wo": ("attn_output", None), "w_gate": ("ffn_gate", None), "w_up": ("ffn_up", None),
    "w_down": ("ffn_down", None),
}


def load_gguf_native(path: str, cfg: LlamaConfig) -> dict:
    """The file's matrices in the forms the native kernel computes with as they are (Q8_0,
    Q4_0, Q4_1; see kernels/quant.py), bit for bit, as output rows [out, in] (GGUF's orientation):
    {"wq": [QuantRows or None per layer], ..., "embed": QuantRows or None, "head": ...}.
    Other tensor types are None (the engine keeps those matrices in float32). Q and K rows are
    un-permuted as in load_gguf, so the two loaders agree row for row.
    """
    from splitserve.engine.kernels import quant

    _, raw = read_gguf(path)

    def rows(name: str, heads: int | None = None):
        qtype, shape, data = raw[name]
        if not quant.gguf_native(qtype.name) or shape[-1] % quant.BLOCK:
            return None
        q = quant.from_gguf_blocks(qtype.name, data, shape)
        if heads:
            q = q.take_rows(unpermute_rotary(np.arange(shape[0]), heads))
        return q

    out: dict = {}
    for canon, (gguf_name, heads_attr) in _LINEAR.items():
        heads = getattr(cfg, heads_attr) if heads_attr else None
        out[canon] = [rows(f"blk.{i}.{gguf_name}.weight", heads) for i in range(cfg.layers)]
    out["embed"] = rows("token_embd.weight")
    out["head"] = out["embed"] if cfg.tie_embeddings else rows("output.weight")
    return out
