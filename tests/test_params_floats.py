"""Parameter values the float32 sampler cannot honour (router/params.py) are refused, or resolved
to the value it runs exactly; and the resolved values do run exactly."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from router.params import validate
from router.requests import InvalidRequest, RequestParams
from splitserve.engine.jax import sampling
from splitserve.protocol.params import FLOAT32_TINY, MIN_TEMPERATURE

VOCAB = 512
PROMPT = [1, 2, 3]


def _valid(**kw) -> RequestParams:
    return validate(PROMPT, RequestParams(**kw), VOCAB, 1024)


@pytest.mark.parametrize("top_p", [1e-38, 1e-40, 5e-324, FLOAT32_TINY / 2])
def test_a_top_p_below_float32_resolution_runs_as_the_smallest_it_resolves(top_p):
    assert _valid(top_p=top_p).top_p == FLOAT32_TINY
    assert np.float32(FLOAT32_TINY) == np.finfo(np.float32).tiny


@pytest.mark.parametrize("top_p", [FLOAT32_TINY, 1e-30, 0.5, 1.0])
def test_a_top_p_float32_resolves_is_left_alone(top_p):
    assert _valid(top_p=top_p).top_p == top_p


def test_the_resolved_top_p_samples_the_greedy_token():
    """What the floor promises: the sampler keeps only the most likely token at FLOAT32_TINY
    (before the floor, top_p 1e-38 reached it as a subnormal and drew tokens of logprob -8 to
    -13 instead)."""
    rng = np.random.default_rng(0)
    logits = rng.normal(0.0, 3.0, (8, VOCAB)).astype(np.float32)
    n = logits.shape[0]
    tokens, logprobs = jax.jit(sampling.sample)(
        jnp.asarray(logits),
        jnp.ones(n, jnp.float32),  # temperature 1: a real draw, not argmax
        jnp.zeros(n, jnp.int32),
        jnp.full(n, _valid(top_p=1e-40).top_p, jnp.float32),
        jnp.arange(n, dtype=jnp.uint32),
        jnp.zeros(n, jnp.int32),
    )
    np.testing.assert_array_equal(np.asarray(tokens), logits.argmax(axis=-1))


@pytest.mark.parametrize("top_p", [0.0, -1e-40, 1.0000001, float("nan")])
def test_a_top_p_outside_its_range_is_refused(top_p):
    with pytest.raises(InvalidRequest) as info:
        _valid(top_p=top_p)
    assert info.value.param == "top_p"


@pytest.mark.parametrize("temperature", [1e-30, 1e-40, 5e-324, MIN_TEMPERATURE / 2])
def test_a_temperature_that_would_overflow_is_refused_naming_greedy(temperature):
    with pytest.raises(InvalidRequest, match=r"temperature must be 0\.0 or in \[1e-12") as info:
        _valid(temperature=temperature)
    assert info.value.param == "temperature"


@pytest.mark.parametrize("temperature", [0.0, MIN_TEMPERATURE, 1e-6, 1.0, 2.0])
def test_a_temperature_in_range_is_left_alone(temperature):
    assert _valid(temperature=temperature).temperature == temperature


@pytest.mark.parametrize("top_k, runs", [(VOCAB - 1, VOCAB - 1), (VOCAB, 0), (VOCAB + 1, 0),
                                         (1 << 20, 0), (0, 0)])  # fmt: skip
def test_a_top_k_beyond_the_vocabulary_is_off(top_k, runs):
    """Exactly: keeping the top vocabulary-size tokens keeps all of them, as off does."""
    assert _valid(top_k=top_k).top_k == runs


def test_a_lone_surrogate_in_a_stop_string_is_refused():
    with pytest.raises(InvalidRequest) as info:
        _valid(stop=("fine", "\udfff"))
    assert info.value.param == "stop"
