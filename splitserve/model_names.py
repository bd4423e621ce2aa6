"""The names the served model answers to, as vLLM's --served-model-name has them.

served_names(): the configured names (router.served_model_name), or one short name made from the
model path: `SmolLM2-135M-Instruct` for the default model, not its file name. The first is the
name responses carry and /metrics labels (`model_name`); /v1/models lists them all.
accepted_names(): those, plus what clients may already send: the model path as configured, its
file (or folder) name, and "default" for the default model.
"""

from __future__ import annotations

import os
import re

from splitserve.config import ClusterConfig

# a GGUF file's quantization suffix (SmolLM2-135M-Instruct.Q4_1.gguf): not part of the name
_QUANT_SUFFIX = re.compile(r"\.(?:I?Q\d[\w]*|[BF]F?\d+|F\d+)$", re.IGNORECASE)


def short_name(path: str) -> str:
    """A model's short name from its path: the file or folder name without `.gguf` and without
    a quantization suffix; `random:<preset>` names stay as they are."""
    if path == "default":
        from splitserve.engine.model.default_model import DEFAULT_MODEL_FILE

        path = DEFAULT_MODEL_FILE
    if path.startswith("random:"):
        return path
    base = os.path.basename(path.rstrip("/")) or path
    if base.lower().endswith(".gguf"):
        base = _QUANT_SUFFIX.sub("", base[: -len(".gguf")])
    return base or path


def served_names(config: ClusterConfig) -> tuple[str, ...]:
    return config.router.served_model_name or (short_name(config.model.path),)


def accepted_names(config: ClusterConfig) -> frozenset[str]:
    path = config.model.path
    aliases = {path, os.path.basename(path.rstrip("/")) or path}
    if path == "default":
        from splitserve.engine.model.default_model import DEFAULT_MODEL_FILE

        aliases.add(DEFAULT_MODEL_FILE)
    return frozenset({*served_names(config), *aliases})
