"""The JAX Llama math equals a textbook numpy implementation (tests/engine_reference.py)."""

from __future__ import annotations

import zlib

import jax
import numpy as np
import pytest

from splitserve.engine.model import llama_model
from splitserve.engine.model.llama_config import LlamaConfig, preset
from splitserve.engine.model.params import HEAD_BLOCK, check_weights, prepare_params
from splitserve.engine.model.weights_random import random_weights
from tests.engine_reference import random_hf_weights, reference_logits

# (hidden, intermediate, layers, heads, kv_heads, head_dim, tied, rope_theta)
CONFIGS = {
    "gqa-untied": (64, 96, 2, 4, 2, 16, False, 10000.0),
    "mha-tied": (48, 80, 2, 4, 4, 12, True, 500000.0),
    # also a vocabulary large enough for the head to be split into column blocks
    "mqa-untied-wide-heads": (32, 64, 1, 2, 1, 24, False, 100000.0),
}


def canonical_from_hf(w: dict[str, np.ndarray], layers: int, tied: bool) -> dict:
    """HF names, torch [out, in] -> the engine's canonical layout ([in, out], stacked)."""

    def stack(name: str, transpose: bool) -> np.ndarray:
        mats = [w[f"model.layers.{i}.{name}.weight"] for i in range(layers)]
        return np.stack([m.T if transpose else m for m in mats])

    out = {
        "embed": w["model.embed_tokens.weight"],
        "attn_norm": stack("input_layernorm", False),
        "wq": stack("self_attn.q_proj", True),
        "wk": stack("self_attn.k_proj", True),
        "wv": stack("self_attn.v_proj", True),
        "wo": stack("self_attn.o_proj", True),
        "ffn_norm": stack("post_attention_layernorm", False),
        "w_gate": stack("mlp.gate_proj", True),
        "w_up": stack("mlp.up_proj", True),
        "w_down": stack("mlp.down_proj", True),
        "final_norm": w["model.norm.weight"],
    }
    if not tied:
        out["head"] = w["lm_head.weight"].T
    return out


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_logits_match_numpy_reference(name):
    hidden, inter, layers, heads, kv_heads, head_dim, tied, theta = CONFIGS[name]
    vocab = 97 if name != "mqa-untied-wide-heads" else 2 * HEAD_BLOCK + 5
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    w = random_hf_weights(rng, vocab, hidden, inter, layers, heads, kv_heads, head_dim, tied)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden=hidden,
        intermediate=inter,
        layers=layers,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        rope_theta=theta,
        rms_eps=1e-5,
        tie_embeddings=tied,
    )
    tokens = [int(t) for t in rng.integers(0, vocab, 19)]
    params = prepare_params(cfg, canonical_from_hf(w, layers, tied))
    got = np.asarray(jax.jit(llama_model.forward, static_argnums=0)(cfg, params, np.array(tokens)))
    want = reference_logits(
        w,
        tokens,
        layers=layers,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        rope_theta=theta,
        rms_eps=1e-5,
    )
    assert np.abs(want).max() > 1.0  # the comparison is not between near-zero numbers
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)


def test_random_weights_are_deterministic_and_sized():
    cfg = preset("tiny-7m")
    assert 6.5e6 < cfg.num_params() < 7.5e6
    a = random_weights(preset("test-tiny"), seed=3)
    b = random_weights(preset("test-tiny"), seed=3)
    c = random_weights(preset("test-tiny"), seed=4)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["wq"], c["wq"])
    check_weights(preset("test-tiny"), a)


def test_wrong_weight_shape_is_named():
    cfg = preset("test-tiny")
    w = random_weights(cfg)
    w["wk"] = w["wk"][:, :, :-1]
    with pytest.raises(ValueError, match="wk"):
        check_weights(cfg, w)
