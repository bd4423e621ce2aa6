"""The optional API key: when config.router.api_key is set, every route but /health wants
`Authorization: Bearer <key>` and answers 401 (OpenAI's error shape) without it."""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from router.http.errors import send_error

OPEN_PATHS = frozenset({"/health"})  # load balancers and the launcher probe it without a key


class ApiKeyMiddleware:
    def __init__(self, app: ASGIApp, api_key: str):
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
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
