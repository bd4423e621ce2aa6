"""Where a role finds its tokenizer: the configured one, else the model's own (GGUF, HF folder)."""

from __future__ import annotations

from splitserve.config import ModelConfig


def tokenizer_path(model: ModelConfig) -> str:
    if model.tokenizer:
        return model.tokenizer
    if model.path.startswith("random:") or model.engine == "fake":
        raise ValueError("model.tokenizer must be set for random-weight and fake models")
    from splitserve.engine import resolve_model_path

    return resolve_model_path(model.path)


def engine_vocab_size(model: ModelConfig) -> int:
    """The fake engine draws tokens from the tokenizer's vocabulary; real engines know their own."""
    if model.engine != "fake":
        return 0
    from splitserve.tokenizers import load_tokenizer

    return load_tokenizer(tokenizer_path(model)).vocab_size
