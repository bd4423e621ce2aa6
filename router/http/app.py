"""build_app(core, tokenizer, config): the FastAPI application of the router process.

Middleware, outermost first: the access log (one line per request), X-Request-Id (every
response carries it), the API key (when one is configured), the body size limit. Then the
routes, one module per API: completions, chat, responses, vLLM's /tokenize and /detokenize,
native /generate, the operator's /admin/detok-workers, and /health,
/metrics, /v1/models.
"""

from __future__ import annotations

from fastapi import FastAPI

from router.core import RouterCore
from router.http import admin, chat, completions, native, ops, responses, tokenize
from router.http.access_log import AccessLogMiddleware
from router.http.auth import ApiKeyMiddleware, open_paths
from router.http.context import ServerContext
from router.http.errors import install_error_handlers
from router.http.limits import BodyLimitMiddleware
from router.http.request_id import RequestIdMiddleware
from splitserve.config import ClusterConfig
from splitserve.tokenizers import Tokenizer


def build_app(core: RouterCore, tokenizer: Tokenizer, config: ClusterConfig) -> FastAPI:
    app = FastAPI(title="splitserve", docs_url=None, redoc_url=None)
    app.state.ctx = ServerContext(core, tokenizer, config)
    for module in (completions, chat, responses, tokenize, native, ops, admin):
        app.include_router(module.routes)
    install_error_handlers(app)
    app.add_middleware(BodyLimitMiddleware)  # added last = runs first: the order is reversed
    if config.router.api_key:
        app.add_middleware(
            ApiKeyMiddleware, api_key=config.router.api_key, open_paths=open_paths(config.router)
        )
    app.add_middleware(RequestIdMiddleware)
    app.add_middleware(AccessLogMiddleware)
    return app
