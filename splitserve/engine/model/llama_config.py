"""The shape of a Llama-family decoder, and named presets for tests and benchmarks.

One frozen dataclass describes every model the engine runs, whatever the weights came from
(GGUF metadata, a Hugging Face config.json, or a preset with random weights), so the model
math never reads a file format.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LlamaConfig:
    """Hyper-parameters of a Llama decoder (RMSNorm, RoPE, grouped-query attention, SwiGLU)."""

    vocab_size: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5
    tie_embeddings: bool = False
    max_position: int = 2048

    def __post_init__(self) -> None:
        if self.heads % self.kv_heads:
            raise ValueError(f"heads {self.heads} not a multiple of kv_heads {self.kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} must be even for RoPE")

    @property
    def group(self) -> int:
        """Query heads that share one KV head."""
        return self.heads // self.kv_heads

    def kv_bytes_per_token(self, itemsize: int) -> int:
        """The K and V of one position in every layer, `itemsize` bytes a number."""
        return 2 * self.layers * self.kv_heads * self.head_dim * itemsize

    def num_params(self) -> int:
        """Parameter count (embedding counted once when tied)."""
        attn = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        mlp = 3 * self.hidden * self.intermediate
        per_layer = attn + mlp + 2 * self.hidden
        head = 0 if self.tie_embeddings else self.vocab_size * self.hidden
        return self.vocab_size * self.hidden + self.layers * per_layer + self.hidden + head


PRESETS: dict[str, LlamaConfig] = {
    # ~7M parameters: the shape the serving benchmarks compare against.
    "tiny-7m": LlamaConfig(
        vocab_size=8000, hidden=256, intermediate=688, layers=4, heads=4, kv_heads=2,
        head_dim=64, rope_theta=10000.0, rms_eps=1e-5, tie_embeddings=False, max_position=4096,
    ),
    # Small enough that a test compiles and runs in well under a second.
    "test-tiny": LlamaConfig(
        vocab_size=512, hidden=64, intermediate=172, layers=2, heads=4, kv_heads=2,
        head_dim=16, rope_theta=10000.0, rms_eps=1e-5, tie_embeddings=True, max_position=1024,
    ),
}


def preset(name: str) -> LlamaConfig:
    """The named preset; a clear error lists the known names."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; known: {sorted(PRESETS)}") from None
