"""X-Request-Id: the client's (checked) or a fresh one, kept in request.state.request_id and echoed
in the response. The router passes it to the core as the request id, so one id names the request
in the log of every process that handled it."""

from __future__ import annotations

import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from router.http.errors import send_error
from router.http.limits import MAX_REQUEST_ID_CHARS

HEADER = b"x-request-id"


def valid_request_id(value: bytes) -> bool:
    # printable ASCII, no spaces: it goes into log lines and response headers verbatim
    return 0 < len(value) <= MAX_REQUEST_ID_CHARS and all(0x21 <= b <= 0x7E for b in value)


class RequestIdMiddleware:
    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = next((v for k, v in scope["headers"] if k == HEADER), None)
        if given is not None and not valid_request_id(given):
            message = f"X-Request-Id must be 1-{MAX_REQUEST_ID_CHARS} printable ASCII characters"
            await send_error(send, 400, message, code="invalid_request_id")
            return
        rid = given.decode() if given is not None else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = rid

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (HEADER, rid.encode())]
            await send(message)

        await self.app(scope, receive, send_with_id)
