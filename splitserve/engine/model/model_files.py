"""Model files to (LlamaConfig, float weights), and a GGUF file's own quantized blocks."""

from __future__ import annotations

import os

import numpy as np

from splitserve.engine.model.llama_config import LlamaConfig, preset


def load_model(model: str) -> tuple[LlamaConfig, dict[str, np.ndarray]]:
    """`random:<preset>[:<seed>]`, a .gguf file, or a Hugging Face folder."""
    if model.startswith("random:"):
        from splitserve.engine.model.weights_random import random_weights

        parts = model.split(":")
        if len(parts) not in (2, 3):
            raise ValueError(f"expected random:<preset>[:<seed>], got {model!r}")
        cfg = preset(parts[1])
        return cfg, random_weights(cfg, int(parts[2]) if len(parts) == 3 else 0)
    if os.path.isdir(model):
        from splitserve.engine.model.weights_hf import load_hf

        return load_hf(model)
    if os.path.isfile(model):
        from splitserve.engine.model.weights_gguf import load_gguf

        return load_gguf(model)
    raise FileNotFoundError(f"model {model!r}: not random:<preset>, a file, or a folder")


def load_native(model: str, cfg: LlamaConfig) -> dict | None:
    """A GGUF file's own quantized blocks (weights_gguf.load_gguf_native); None otherwise."""
    if os.path.isfile(model) and not model.startswith("random:"):
        from splitserve.engine.model.weights_gguf import load_gguf_native

        return load_gguf_native(model, cfg)
    return None
