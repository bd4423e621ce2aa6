"""Load a llama-architecture GGUF file into canonical weights (see llama_model).

The header is read by a small parser here (metadata scalars and the tensor table; the
tokenizer's arrays are skipped, see read_gguf); tensor data is memory-mapped. Quantized
tensors (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K, ...) are dequantized to float32 once at
load time by `gguf.quants.dequantize`: the engine computes in float32 on CPU, where a
fused dequantize-matmul would not pay for itself at these model sizes.

Rotary layout: llama.cpp's converter permutes the rows of Q and K (per head, from the
Hugging Face "two halves" layout to interleaved pairs, the layout its rope kernel uses).
We undo that permutation here so one model implementation serves every weight source.
"""

from __future__ import annotations

import struct

import numpy as np
from gguf.constants import GGMLQuantizationType, GGUFValueType
from gguf.quants import dequantize, quant_shape_to_byte_shape

from splitserve.engine.llama_config import LlamaConfig

_SCALARS = {  # GGUF value type -> struct format (little-endian)
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h", GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<?", GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d",
}


class _Cursor:
    """Reads GGUF's little-endian header fields from a memory map."""

    def __init__(self, buf) -> None:
        self.buf, self.at = buf, 0

    def scalar(self, fmt: str):
        (value,) = struct.unpack_from(fmt, self.buf, self.at)
        self.at += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.scalar("<Q")
        self.at += n
        return bytes(self.buf[self.at - n:self.at]).decode("utf-8", errors="replace")

    def value(self, vtype: int, keep: bool):
        """One value; arrays (the tokenizer's vocabulary) are skipped unless kept."""
        if vtype == GGUFValueType.STRING:
            return self.string()
        if vtype == GGUFValueType.ARRAY:
            etype, count = self.scalar("<I"), self.scalar("<Q")
            if etype in _SCALARS and not keep:
                self.at += count * struct.calcsize(_SCALARS[etype])
                return None
            if etype == GGUFValueType.STRING and not keep:
                for _ in range(count):
                    n = self.scalar("<Q")
                    self.at += n
                return None
            items = [self.value(etype, keep) for _ in range(count)]
            return items if keep else None
        return self.scalar(_SCALARS[vtype])


def read_gguf(path: str) -> tuple[dict, dict[str, tuple[GGMLQuantizationType, tuple, np.ndarray]]]:
    """Metadata (arrays skipped) and tensors {name: (type, numpy shape, raw uint8 bytes)}.

    A small reader of our own rather than gguf.GGUFReader: that one parses every entry of
    the embedded vocabulary into numpy views, which costs seconds per worker start.
    """
    buf = np.memmap(path, dtype=np.uint8, mode="r")
    cur = _Cursor(buf)
    if bytes(buf[:4]) != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file")
    cur.at = 4
    version = cur.scalar("<I")
    if version not in (2, 3):
        raise ValueError(f"{path}: unsupported GGUF version {version}")
    n_tensors, n_kv = cur.scalar("<Q"), cur.scalar("<Q")
    meta = {}
    for _ in range(n_kv):
        key = cur.string()
        meta[key] = cur.value(cur.scalar("<I"), keep=False)
    infos = []
    for _ in range(n_tensors):
        name = cur.string()
        dims = [cur.scalar("<Q") for _ in range(cur.scalar("<I"))]
        infos.append((name, tuple(reversed(dims)), GGMLQuantizationType(cur.scalar("<I")),
                      cur.scalar("<Q")))  # GGUF lists dims innermost first
    align = int(meta.get("general.alignment") or 32)
    data_start = -(-cur.at // align) * align
    tensors = {}
    for name, shape, qtype, offset in infos:
        byte_shape = quant_shape_to_byte_shape(shape, qtype)
        start = data_start + offset
        raw = buf[start:start + int(np.prod(byte_shape))].reshape(byte_shape)
        tensors[name] = (qtype, shape, raw)
    return meta, tensors


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


def load_gguf(path: str) -> tuple[LlamaConfig, dict[str, np.ndarray]]:
    """Read config and canonical float32 weights from a GGUF file."""
    meta, raw = read_gguf(path)
    tensors = {
        name: np.asarray(dequantize(data, qtype), np.float32).reshape(shape)  # [out, in]
        for name, (qtype, shape, data) in raw.items()
    }
    cfg = config_from_gguf(meta, set(tensors), tensors["token_embd.weight"].shape[0])

    def per_layer(name: str, transform=lambda a: a) -> np.ndarray:
        return np.stack([transform(tensors[f"blk.{i}.{name}.weight"]) for i in range(cfg.layers)])

    def linear(name: str, transform=lambda a: a) -> np.ndarray:
        return per_layer(name, lambda a: np.ascontiguousarray(transform(a).T))  # -> [in, out]

    w = {
        "embed": tensors["token_embd.weight"],
        "attn_norm": per_layer("attn_norm"),
        "wq": linear("attn_q", lambda a: unpermute_rotary(a, cfg.heads)),
        "wk": linear("attn_k", lambda a: unpermute_rotary(a, cfg.kv_heads)),
        "wv": linear("attn_v"),
        "wo": linear("attn_output"),
        "ffn_norm": per_layer("ffn_norm"),
        "w_gate": linear("ffn_gate"),
        "w_up": linear("ffn_up"),
        "w_down": linear("ffn_down"),
        "final_norm": tensors["output_norm.weight"],
    }
    if not cfg.tie_embeddings:
        w["head"] = np.ascontiguousarray(tensors["output.weight"].T)
    return cfg, w
