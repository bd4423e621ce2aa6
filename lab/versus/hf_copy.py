"""A float32 Hugging Face copy of a model that splitserve loads, for servers that read only that
form (vLLM's CPU build): the default model's GGUF, dequantized exactly as splitserve's own float32
path computes with it, written as a LlamaForCausalLM folder (config.json, model.safetensors, and
the tokenizer the GGUF file carries as tokenizer.json with its chat template). A `random:<preset>`
model (the 7M checkpoint: random:tiny-7m) gets the synthetic byte-level tokenizer of its
vocabulary size (tokenizers/synthetic.py, the one the tests use), so both servers read one folder.

    python -m lab.versus hf-copy OUT_DIR [--model PATH]

The weights are splitserve's canonical ones (engine/model/llama_model.py), so the rotary permutation
llama.cpp's converter applied is undone already; this writes them back in the Hugging Face names
and [out, in] layout that engine/model/weights_hf.py reads, which a test checks both ways.
"""

from __future__ import annotations

import json
import os

import numpy as np
from safetensors.numpy import save_file

from splitserve.engine.model.llama_config import LlamaConfig
from splitserve.engine.model.model_files import load_model

# canonical per-layer matrix -> Hugging Face module (the matrices are [in, out] canonically)
LINEAR = {
    "wq": "self_attn.q_proj", "wk": "self_attn.k_proj", "wv": "self_attn.v_proj",
    "wo": "self_attn.o_proj", "w_gate": "mlp.gate_proj", "w_up": "mlp.up_proj",
    "w_down": "mlp.down_proj",
}  # fmt: skip
NORMS = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}


def hf_config(cfg: LlamaConfig) -> dict:
    """config.json for the shape (float32, no rope scaling)."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden,
        "intermediate_size": cfg.intermediate,
        "num_hidden_layers": cfg.layers,
        "num_attention_heads": cfg.heads,
        "num_key_value_heads": cfg.kv_heads,
        "head_dim": cfg.head_dim,
        "rope_theta": cfg.rope_theta,
        "rms_norm_eps": cfg.rms_eps,
        "tie_word_embeddings": cfg.tie_embeddings,
        "max_position_embeddings": cfg.max_position,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "float32",
    }


def hf_tensors(cfg: LlamaConfig, weights) -> dict[str, np.ndarray]:
    """Canonical weights -> Hugging Face names and layouts, float32."""
    f32 = lambda a: np.ascontiguousarray(np.asarray(a, np.float32))  # noqa: E731
    out = {
        "model.embed_tokens.weight": f32(weights["embed"]),
        "model.norm.weight": f32(weights["final_norm"]),
    }
    for name, hf in NORMS.items():
        stacked = weights[name]
        for i in range(cfg.layers):
            out[f"model.layers.{i}.{hf}.weight"] = f32(stacked[i])
    for name, hf in LINEAR.items():
        stacked = weights[name]
        for i in range(cfg.layers):
            out[f"model.layers.{i}.{hf}.weight"] = f32(stacked[i].T)  # -> torch's [out, in]
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = f32(weights["head"].T)
    return out


def write_tokenizer(model_path: str, out_dir: str) -> None:
    """The GGUF file's own tokenizer as tokenizer.json, its template in tokenizer_config.json."""
    from splitserve.tokenizers.gguf_tokenizer import load_gguf_tokenizer
    from splitserve.tokenizers.hf_tokenizer import HFTokenizer

    tok = load_gguf_tokenizer(model_path)
    if not isinstance(tok, HFTokenizer):  # a SentencePiece GGUF tokenizer has no such form
        raise ValueError(f"{model_path}: its tokenizer has no tokenizer.json form")
    inner = tok.backend
    inner.save(os.path.join(out_dir, "tokenizer.json"))
    text = lambda i: inner.id_to_token(i) if i is not None else None  # noqa: E731
    eos = sorted(tok.eos_ids)
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": text(tok.bos_id),
        "eos_token": text(eos[0]) if eos else None,
        "chat_template": tok.chat_template.source if tok.chat_template else None,
        "add_bos_token": bool(getattr(tok, "add_bos", False)),
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1 << 20,
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as fh:
        json.dump(config, fh, indent=1)
    with open(os.path.join(out_dir, "generation_config.json"), "w", encoding="utf-8") as fh:
        json.dump({"bos_token_id": tok.bos_id, "eos_token_id": eos}, fh)


def export(model_path: str, out_dir: str, tokenizer: bool = True) -> str:
    """Write the copy of the model at model_path (a GGUF file, or anything load_model reads)
    into out_dir; returns out_dir."""
    cfg, weights = load_model(model_path)
    os.makedirs(out_dir, exist_ok=True)
    save_file(hf_tensors(cfg, weights), os.path.join(out_dir, "model.safetensors"))
    with open(os.path.join(out_dir, "config.json"), "w", encoding="utf-8") as fh:
        json.dump(hf_config(cfg), fh, indent=1)
    if tokenizer and model_path.endswith(".gguf"):
        write_tokenizer(model_path, out_dir)
    elif tokenizer and model_path.startswith("random:"):
        from splitserve.tokenizers.synthetic import build_synthetic_tokenizer

        build_synthetic_tokenizer(out_dir, cfg.vocab_size)
    return out_dir
