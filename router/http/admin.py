"""The operator's admin endpoints, behind an admin key of their own ([router] admin_key_file or
SPLITSERVE_ADMIN_KEY): never the clients' API key, which is refused here (403), and refused
altogether, saying how to turn them on, when no admin key is configured (resizing the pool is
not for anyone who can reach the port, nor for every client).

- GET /admin/detok-workers: the detok pool's target size and each worker's state and streams.
- POST /admin/detok-workers {"count": N}: resize the pool to N workers (indices 0..N-1). Workers
  past N leave the ring at once and their streams move to the others, losing nothing; the
  launcher (`splitserve serve`) starts and stops the processes to match, a few at a time. A
  growth this host's memory cannot hold is refused (409, router/detok_memory.py). Under
  supervisord, change the detok program's numprocs instead: new workers join when they say
  Ready, and a stopping one hands its streams over while it drains.
"""

from __future__ import annotations

import hmac

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import Field

from router.detok_memory import available_bytes, detok_worker_bytes, growth_refusal
from router.http.context import ServerContext
from router.http.errors import APIError
from router.http.schemas import StrictModel, parse_body
from router.workers import MAX_DETOK_WORKERS
from splitserve.procutil import ADMIN_KEY_ENV

routes = APIRouter()


class DetokPoolRequest(StrictModel):
    count: int = Field(ge=1, le=MAX_DETOK_WORKERS)


def _admin(request: Request) -> ServerContext:
    ctx: ServerContext = request.app.state.ctx
    router = ctx.config.router
    if not router.admin_key:
        raise APIError(403, "the admin endpoints are off: give the router an admin key of their "
                       f"own ([router] admin_key_file, --admin-key-file or {ADMIN_KEY_ENV})",
                       code="admin_disabled")  # fmt: skip
    given = request.headers.get("authorization", "").encode()
    if hmac.compare_digest(given, f"Bearer {router.admin_key}".encode()):
        return ctx
    if router.api_key and hmac.compare_digest(given, f"Bearer {router.api_key}".encode()):
        raise APIError(403, "the clients' API key does not open the admin endpoints: send the "
                       "admin key", code="admin_key_required")  # fmt: skip
    raise APIError(401, "missing or invalid admin key: send 'Authorization: Bearer <admin key>'",
                   code="invalid_admin_key")  # fmt: skip


@routes.get("/admin/detok-workers")
async def get_detok_pool(request: Request) -> JSONResponse:
    return JSONResponse(_admin(request).core.detok_pool())


@routes.post("/admin/detok-workers")
async def resize_detok_pool(request: Request) -> JSONResponse:
    ctx = _admin(request)
    body = await parse_body(request, DetokPoolRequest)
    workers = [w for w in ctx.core.workers.of("detok") if w.state in ("starting", "ready")]
    running = sum(1 for w in workers if w.index < body.count)
    per_worker = detok_worker_bytes([w.pid for w in workers], ctx.config.router.detok_worker_mib)
    refusal = growth_refusal(body.count, running, per_worker, available_bytes())
    if refusal is not None:
        raise APIError(409, refusal, param="count", code="insufficient_memory")
    ctx.core.resize_detok_pool(body.count)
    return JSONResponse(ctx.core.detok_pool())
