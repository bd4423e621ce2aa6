"""The access log: one line per HTTP request once its response is complete (a stream: once it
ended), on the `router.access` logger:

    POST /v1/chat/completions 200 prompt_tokens=12 completion_tokens=30 1.234s id=<request id>

With --log-format json the same figures are fields of the record (see splitserve/logfmt.py).
Tokens come from the request's Generation, which leaves its usage in the request's state when it
closes (router/http/generation.py); requests that generate nothing show none. A client gone
before any response is 499, as nginx logs it. The outermost middleware: refusals by the inner
ones (401, 400, 413) are logged too. Probes (/health, /metrics: a launcher polls /health ten
times a second while a stack starts, scrapers and kubelets keep polling) log at debug level.
"""

from __future__ import annotations

import logging
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("router.access")

CLIENT_GONE = 499
PROBES = frozenset({"/health", "/metrics"})


class AccessLogMiddleware:
    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        level = logging.DEBUG if scope.get("path") in PROBES else logging.INFO
        if scope["type"] != "http" or not log.isEnabledFor(level):
            await self.app(scope, receive, send)
            return
        start = time.monotonic()
        status = CLIENT_GONE

        async def send_and_watch(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_watch)
        finally:
            self.record(scope, status, time.monotonic() - start, level)

    @staticmethod
    def record(scope: Scope, status: int, seconds: float, level: int) -> None:
        state = scope.get("state") or {}
        usage = state.get("usage")
        fields = {
            "method": scope.get("method", ""),
            "path": scope.get("path", ""),
            "status": status,
            "prompt_tokens": usage["prompt_tokens"] if usage else None,
            "completion_tokens": usage["completion_tokens"] if usage else None,
            "duration_s": round(seconds, 4),
            "request_id": state.get("request_id", "-"),
        }
        tokens = (
            f" prompt_tokens={fields['prompt_tokens']} completion_tokens="
            f"{fields['completion_tokens']}" if usage else ""
        )  # fmt: skip
        log.log(
            level, "%s %s %d%s %.3fs id=%s", fields["method"], fields["path"], status, tokens,
            seconds, fields["request_id"], extra={"access": fields},
        )  # fmt: skip
