"""Bounds on what one HTTP request may ask for, so that no client input can exhaust the router.

The body size is enforced here, while the body streams in (a declared Content-Length is refused
before any of it is read); the bounds of the generation parameters are the one table in
splitserve/protocol/params.py, which the schemas (schemas.py), the core (router/params.py) and the
wire's checks all read.
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from router.http.errors import send_error

MAX_BODY_BYTES = 8 << 20  # a long chat history is well under this; a prompt must fit the context
MAX_N = 16  # choices per prompt
MAX_CHOICES = 64  # choices per request: prompts x n
MAX_MESSAGES = 4096
MAX_PROMPTS = MAX_CHOICES
MAX_REQUEST_ID_CHARS = 128


class BodyTooLarge(HTTPException):
    """Raised from receive() inside body parsing; FastAPI passes HTTPExceptions through as is."""

    def __init__(self, limit: int):
        super().__init__(413, f"request body larger than {limit} bytes")


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, limit: int = MAX_BODY_BYTES):
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"content-length":
                if not value.isdigit() or int(value) > self.limit:
                    message = f"request body larger than {self.limit} bytes (or a bad length)"
                    await send_error(send, 413, message, code="request_too_large")
                    return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise BodyTooLarge(self.limit)
            return message

        await self.app(scope, limited_receive, send)
