"""The optional API key: when config.router.api_key is set, every route but /health (and
/metrics with router.open_metrics, as vLLM serves it to scrapers) wants
`Authorization: Bearer <key>` and answers 401 (OpenAI's error shape) without it. The admin
endpoints (/admin/...) are not the clients': they take the admin key instead, checked by
router/http/admin.py, which refuses the API key there."""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from router.http.errors import send_error
from splitserve.config import RouterConfig

ADMIN_PREFIX = "/admin/"  # the admin key's (router/http/admin.py)
OPEN_PATHS = frozenset({"/health"})  # load balancers and the launcher probe it without a key


def open_paths(config: RouterConfig) -> frozenset[str]:
    """The paths served without the key."""
    return OPEN_PATHS | ({"/metrics"} if config.open_metrics else set())


class ApiKeyMiddleware:
    def __init__(self, app: ASGIApp, api_key: str, open_paths: frozenset[str] = OPEN_PATHS):
        self.app = app
        self.expected = f"Bearer {api_key}".encode()
        self.open_paths = open_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or path in self.open_paths or path.startswith(ADMIN_PREFIX):
            await self.app(scope, receive, send)
            return
        given = b""
        for name, value in scope["headers"]:
            if name == b"authorization":
                given = value
                break
        if not hmac.compare_digest(given, self.expected):  # constant time: no timing oracle
            message = "missing or invalid API key: send 'Authorization: Bearer <key>'"
            await send_error(send, 401, message, code="invalid_api_key")
            return
        await self.app(scope, receive, send)
