"""The default model's shape (LlamaConfig), read from the installed checkpoint: the tests that
size messages and slots for it check against the real file, not a copy of its numbers. Only
the GGUF header is read; the weights stay undequantized (weights_gguf.LazyWeights)."""

from __future__ import annotations

from functools import cache

from splitserve.engine.model.default_model import default_model_path
from splitserve.engine.model.llama_config import LlamaConfig
from splitserve.engine.model.model_files import load_model


@cache
def default_model_shape() -> LlamaConfig:
    return load_model(default_model_path())[0]
