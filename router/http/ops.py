"""The operator's endpoints: GET /health (200 only when a full pipeline is ready, naming every
worker and its state), GET /metrics (Prometheus text) and GET /v1/models (one card per served
name, as vLLM lists its --served-model-name)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from router.http.context import ServerContext
from router.http.errors import APIError

routes = APIRouter()

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@routes.get("/health")
async def health(request: Request) -> JSONResponse:
    ctx: ServerContext = request.app.state.ctx
    state = ctx.core.health()
    ready = ctx.core.is_ready()
    body = {"status": "ready" if ready else "unavailable", **state}
    return JSONResponse(body, status_code=200 if ready else 503)


@routes.get("/metrics")
async def metrics(request: Request) -> Response:
    ctx: ServerContext = request.app.state.ctx
    return Response(ctx.core.metrics.render(), headers={"Content-Type": PROMETHEUS_CONTENT_TYPE})


def _model_card(ctx: ServerContext, name: str) -> dict:
    return {
        "id": name,
        "object": "model",
        "created": ctx.created,
        "owned_by": "splitserve",
        "max_model_len": ctx.config.model.max_seq_len,
    }


@routes.get("/v1/models")
async def list_models(request: Request) -> JSONResponse:
    ctx: ServerContext = request.app.state.ctx
    return JSONResponse({"object": "list", "data": [_model_card(ctx, n) for n in ctx.names]})


@routes.get("/v1/models/{model:path}")
async def get_model(model: str, request: Request) -> JSONResponse:
    ctx: ServerContext = request.app.state.ctx
    if model not in ctx.accepted:
        raise APIError(404, f"model {model!r} is not served here", param="model",
                       code="model_not_found")  # fmt: skip
    return JSONResponse(_model_card(ctx, model if model in ctx.names else ctx.model_name))
