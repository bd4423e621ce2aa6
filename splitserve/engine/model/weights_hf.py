"""Load a Hugging Face Llama checkpoint folder into canonical weights (see llama_model).

The folder holds config.json and either model.safetensors or shards listed in
model.safetensors.index.json. Tensors are read with safetensors.numpy; bfloat16, which
numpy lacks, is read from the file's raw bytes (the safetensors header is plain JSON).
"""

from __future__ import annotations

import json
import os
import struct

import numpy as np
from safetensors.numpy import load_file

from splitserve.engine.model.llama_config import LlamaConfig


def config_from_hf(cfg: dict) -> LlamaConfig:
    """LlamaConfig from a config.json dict."""
    if cfg.get("rope_scaling"):
        raise ValueError(f"rope_scaling {cfg['rope_scaling']!r} is not supported")
    heads = int(cfg["num_attention_heads"])
    hidden = int(cfg["hidden_size"])
    return LlamaConfig(
        vocab_size=int(cfg["vocab_size"]),
        hidden=hidden,
        intermediate=int(cfg["intermediate_size"]),
        layers=int(cfg["num_hidden_layers"]),
        heads=heads,
        kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        rope_theta=float(cfg.get("rope_theta", 10000.0)),
        rms_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        max_position=int(cfg.get("max_position_embeddings", 2048)),
    )


_NUMPY_DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "F64": np.dtype("<f8")}


def _read_bf16_aware(path: str) -> dict[str, np.ndarray]:
    """One safetensors file -> float32 arrays by name."""
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
    if not any(isinstance(v, dict) and v.get("dtype") == "BF16" for v in header.values()):
        return {k: v.astype(np.float32, copy=False) for k, v in load_file(path).items()}
    raw = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + header_len)
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        chunk = raw[start:end]
        if info["dtype"] == "BF16":  # the top half of a float32
            arr = (chunk.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif info["dtype"] in _NUMPY_DTYPES:
            arr = chunk.view(_NUMPY_DTYPES[info["dtype"]]).astype(np.float32)
        else:
            raise ValueError(f"{path}: tensor {name} has unsupported dtype {info['dtype']}")
        out[name] = arr.reshape(info["shape"])
    return out


def _load_tensors(folder: str) -> dict[str, np.ndarray]:
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
    else:
        shards = ["model.safetensors"]
    tensors: dict[str, np.ndarray] = {}
    for shard in shards:
        tensors.update(_read_bf16_aware(os.path.join(folder, shard)))
    return tensors


def load_hf(folder: str) -> tuple[LlamaConfig, dict[str, np.ndarray]]:
    """Read config and canonical float32 weights from a Hugging Face Llama folder."""
    with open(os.path.join(folder, "config.json")) as f:
        cfg = config_from_hf(json.load(f))
    t = _load_tensors(folder)
    if "lm_head.weight" not in t and not cfg.tie_embeddings:
        raise ValueError(f"{folder}: no lm_head.weight and tie_word_embeddings is false")

    def per_layer(name: str) -> np.ndarray:
        return np.stack([t[f"model.layers.{i}.{name}.weight"] for i in range(cfg.layers)])

    def linear(name: str) -> np.ndarray:  # torch Linear [out, in] -> [in, out]
        return np.ascontiguousarray(per_layer(name).transpose(0, 2, 1))

    w = {
        "embed": t["model.embed_tokens.weight"],
        "attn_norm": per_layer("input_layernorm"),
        "wq": linear("self_attn.q_proj"),
        "wk": linear("self_attn.k_proj"),
        "wv": linear("self_attn.v_proj"),
        "wo": linear("self_attn.o_proj"),
        "ffn_norm": per_layer("post_attention_layernorm"),
        "w_gate": linear("mlp.gate_proj"),
        "w_up": linear("mlp.up_proj"),
        "w_down": linear("mlp.down_proj"),
        "final_norm": t["model.norm.weight"],
    }
    if not cfg.tie_embeddings:
        w["head"] = np.ascontiguousarray(t["lm_head.weight"].T)
    return cfg, w
