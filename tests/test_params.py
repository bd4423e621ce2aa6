"""The one table of parameter bounds (splitserve/protocol/params.py): the HTTP schemas, the router
core and the wire's checks read the same values."""

import annotated_types
import pytest

from router.http.chat_schemas import ChatCompletionRequest
from router.http.schemas import CompletionRequest, GenerateRequestBody
from router.params import BOUNDS, logits_controls, validate
from router.requests import InvalidRequest, RequestParams
from splitserve.protocol.params import LIMITS, PARAM_SPECS

SCHEMAS = (CompletionRequest, ChatCompletionRequest, GenerateRequestBody)


def _limits(model, name: str) -> dict[str, float]:
    out = {}
    for meta in model.model_fields[name].metadata:
        for kind in (annotated_types.Ge, annotated_types.Gt, annotated_types.Le):
            if isinstance(meta, kind):
                key = kind.__name__.lower()
                out[key] = getattr(meta, key)
    return out


@pytest.mark.parametrize("model", SCHEMAS)
@pytest.mark.parametrize("name", ["temperature", "top_p", "min_tokens", "seed", "max_tokens"])
def test_the_schemas_take_their_bounds_from_the_table(model, name):
    assert _limits(model, name) == BOUNDS[name].pydantic()


def _with(name: str, value) -> RequestParams:
    fields = {"max_tokens": 8, "min_tokens": 0, name: value}
    return RequestParams(**fields)


@pytest.mark.parametrize("name", sorted(BOUNDS))
def test_the_core_takes_the_edges_of_each_bound_and_refuses_past_them(name):
    bound = BOUNDS[name]
    step = 1 if isinstance(bound.hi, int) else 1e-3
    context = 1 << 21  # room for any max_tokens: no clamping in the way
    if name != "min_tokens":  # min_tokens is also bounded by max_tokens
        assert validate([1], _with(name, bound.hi), 10, context)
    if not bound.lo_open:
        assert validate([1], _with(name, bound.lo), 10, context)
    for outside in (bound.hi + step, bound.lo if bound.lo_open else bound.lo - step):
        with pytest.raises(InvalidRequest) as err:
            validate([1], _with(name, outside), 10, context)
        assert err.value.param == name


@pytest.mark.parametrize("model", SCHEMAS)
@pytest.mark.parametrize("name", ["presence_penalty", "frequency_penalty", "repetition_penalty",
                                  "min_p", "prompt_logprobs"])  # fmt: skip
def test_the_schemas_take_the_logits_controls_bounds_from_the_table(model, name):
    assert _limits(model, name) == BOUNDS[name].pydantic()


def test_max_tokens_beyond_the_context_is_refused_not_clamped():
    """vLLM's rule: a client asking for more than the context holds learns it (400)."""
    assert validate([1] * 10, RequestParams(max_tokens=6), 100, 16).max_tokens == 6
    with pytest.raises(InvalidRequest) as err:
        validate([1] * 10, RequestParams(max_tokens=7), 100, 16)
    assert err.value.param == "max_tokens" and "at most 6" in str(err.value)


@pytest.mark.parametrize("fields, param", [
    ({"logit_bias": ((100, 1.0),)}, "logit_bias"),  # an id outside the vocabulary
    ({"logit_bias": ((1, 101.0),)}, "logit_bias"),
    ({"logit_bias": ((1, 1.0), (1, 2.0))}, "logit_bias"),
    ({"bad_words": ((),)}, "bad_words"),
    ({"bad_words": ((1000,),)}, "bad_words"),
    ({"repetition_penalty": 0.0}, "repetition_penalty"),
    ({"prompt_logprobs": 21}, "prompt_logprobs"),
])  # fmt: skip
def test_logits_controls_out_of_bounds_are_refused(fields, param):
    with pytest.raises(InvalidRequest) as err:
        validate([1], RequestParams(max_tokens=2, **fields), 100, 64)
    assert err.value.param == param


def test_neutral_controls_take_the_plain_path():
    assert logits_controls(RequestParams()) is None
    assert logits_controls(RequestParams(top_logprobs=3)) is None  # without logprobs: none
    controls = logits_controls(RequestParams(logprobs=True, top_logprobs=3, logit_bias=((5, 2.0),)))
    assert controls.top_logprobs == 3 and controls.bias_ids == [5]


def _ranges(limit):
    """(client's admitted range, wire's range) of a row, and of its items when it has them."""
    yield limit.client.admitted(), limit.on_wire(), limit.why
    if limit.item is not None:
        yield from _ranges(limit.item)


@pytest.mark.parametrize("name", sorted(LIMITS))
def test_whatever_a_client_may_send_travels_and_a_wider_wire_says_why(name):
    """Every value the router admits is one the wire's checks accept (else an admitted request
    would be dropped by its worker as malformed); where the wire takes more, the row says why."""
    for (lo, hi), (wire_lo, wire_hi), why in _ranges(LIMITS[name]):
        assert wire_lo <= lo and hi <= wire_hi
        assert why or (wire_lo, wire_hi) == (lo, hi)


def test_the_wire_checks_are_built_from_the_table():
    """A sample of PARAM_SPECS read back against LIMITS (field_specs.py takes them as they are)."""
    specs = {name: spec for fields in PARAM_SPECS.values() for name, spec in fields.items()}
    assert (specs["temperature"].lo, specs["temperature"].hi) == LIMITS["temperature"].on_wire()
    assert (specs["top_k"].lo, specs["top_k"].hi) == LIMITS["top_k"].on_wire()
    assert specs["stop"].max_len == LIMITS["stop"].on_wire()[1]
    assert specs["stop"].item.max_len == LIMITS["stop"].item.on_wire()[1]
    assert specs["bias_ids"].max_len == LIMITS["logit_bias"].client.hi
