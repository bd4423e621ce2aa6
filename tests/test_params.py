"""The one table of parameter bounds: the HTTP schemas and the router core read the same values."""

import annotated_types
import pytest

from router.http.chat_schemas import ChatCompletionRequest
from router.http.schemas import CompletionRequest, GenerateRequestBody
from router.params import BOUNDS, validate
from router.requests import InvalidRequest, RequestParams

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
