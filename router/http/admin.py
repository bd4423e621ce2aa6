"""The operator's admin endpoints, behind the API key (refused when none is configured: resizing
the pool is not for anyone who can reach the port).

- GET /admin/detok-workers: the detok pool's target size and each worker's state and streams.
- POST /admin/detok-workers {"count": N}: resize the pool to N workers (indices 0..N-1). Workers
  past N leave the ring at once and their streams move to the others, losing nothing; the
  launcher (`splitserve serve`) starts and stops the processes to match. Under supervisord,
  change the detok program's numprocs instead: new workers join when they say Ready, and a
  stopping one hands its streams over while it drains.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import Field

from router.http.context import ServerContext
from router.http.errors import APIError
from router.http.schemas import StrictModel, parse_body
from router.workers import MAX_DETOK_WORKERS

routes = APIRouter()


class DetokPoolRequest(StrictModel):
    count: int = Field(ge=1, le=MAX_DETOK_WORKERS)


def _admin(request: Request) -> ServerContext:
    ctx: ServerContext = request.app.state.ctx
    if not ctx.config.router.api_key:
        raise APIError(403, "admin endpoints need an API key: configure router.api_key",
                       code="admin_needs_api_key")  # fmt: skip
    return ctx


@routes.get("/admin/detok-workers")
async def get_detok_pool(request: Request) -> JSONResponse:
    return JSONResponse(_admin(request).core.detok_pool())


@routes.post("/admin/detok-workers")
async def resize_detok_pool(request: Request) -> JSONResponse:
    ctx = _admin(request)
    body = await parse_body(request, DetokPoolRequest)
    ctx.core.resize_detok_pool(body.count)
    return JSONResponse(ctx.core.detok_pool())
