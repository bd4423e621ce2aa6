"""Whether the model and tokenizer a configuration names are here to load, said before any
process starts.

`--model HuggingFaceTB/SmolLM2-135M` (a hub id, as vLLM takes) used to start every process of
the stack; the prefill and decode workers then died with tracebacks and `splitserve serve` exited
1. This server downloads nothing, so a path that is neither a file nor a folder is refused with
what to do instead: by `splitserve serve` before it starts anything, and by a role process
started alone before it builds its worker. It is not a check of the cluster file itself: on a
cluster of several hosts, a host that does not load the model need not hold it.
"""

from __future__ import annotations

import os

from splitserve.config import ModelConfig

HOW = ("this server downloads nothing (from a model hub or anywhere): download the model "
       "yourself (e.g. `huggingface-cli download ID --local-dir DIR`) and give that folder or a "
       '.gguf file; or "default" (SmolLM2-135M-Instruct, installed with splitserve) or '
       "random:<preset> (random weights)")  # fmt: skip


def model_problem(model: ModelConfig, weights: bool = True) -> str | None:
    """Why this host cannot load what `model` names, or None. weights: the caller loads the
    weights (a prefill or decode worker, or a launcher of the whole stack); the others load
    only the tokenizer, which is the model's own unless [model] tokenizer names one."""
    if model.tokenizer and not (os.path.isfile(model.tokenizer) or os.path.isdir(model.tokenizer)):
        return f"tokenizer {model.tokenizer!r} is neither a file nor a folder"
    if model.engine == "fake" or (not weights and model.tokenizer):
        return None
    path = model.path
    if path == "default":
        from splitserve.engine.model.default_model import default_model_path

        try:
            default_model_path()
        except FileNotFoundError as exc:
            return str(exc)
        return None
    if path.startswith("random:"):
        from splitserve.engine.model.llama_config import preset

        parts = path.split(":")
        if len(parts) not in (2, 3) or (len(parts) == 3 and not parts[2].isdigit()):
            return f"model {path!r}: expected random:<preset>[:<seed>]"
        try:
            preset(parts[1])
        except ValueError as exc:
            return f"model {path!r}: {exc}"
        return None
    if not (os.path.isfile(path) or os.path.isdir(path)):
        return f"model {path!r} is neither a file nor a folder: {HOW}"
    return None


def check_model(model: ModelConfig, weights: bool = True) -> None:
    """ValueError with model_problem's reason, if any."""
    problem = model_problem(model, weights)
    if problem is not None:
        raise ValueError(problem)
