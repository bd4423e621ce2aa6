"""OpenAI-style error bodies, {"error": {"message", "type", "param", "code"}}, for every failure.

Each kind of failure maps to one status: bad input 400, a missing API key 401, an oversized body
413, overload 429 (or 503 when no pipeline is ready), anything unexpected 500 with a message and
never a stack trace (that goes to the log).

A 500's body is one fixed sentence naming the request id (internal_error()): what went wrong may
hold internal state or the request's own content (a worker's grammar error carries the engine's
parser state and the client's schema), so it goes to the log under that id and never to the
client, in a JSON body or in a stream's error event alike.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.types import Send

from router.requests import RequestError

log = logging.getLogger(__name__)

INVALID = "invalid_request_error"
INTERNAL = "internal_error"
HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}
# when to try again after an overload (429) or while a worker is being replaced (503): a worker
# restarts in seconds with its compilation cache warm
RETRY_AFTER_S = {429: 1, 503: 5}


class APIError(Exception):
    """A failure the client is told about, with its HTTP status."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str = INVALID,
        param: str | None = None,
        code: str | None = None,
        detail: str = "",
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.param = param
        self.code = code
        self.detail = detail  # what the log says instead of message; never sent

    @property
    def logged(self) -> str:
        return self.detail or self.message

    @classmethod
    def from_core(cls, exc: RequestError) -> APIError:
        return cls(exc.status, str(exc), exc.kind, exc.param, exc.code)

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.kind, self.param, self.code)

    def response(self, headers: dict[str, str] | None = None) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


class ClientGone(APIError):
    """The client disconnected before its request was read or admitted: nobody reads the
    answer, which is logged as one info line (nginx's 499), never as a server error."""

    def __init__(self) -> None:
        super().__init__(499, "the client closed the request", code="client_closed_request")


def internal_error(request_id: str, detail: str = "", status: int = 500) -> APIError:
    """A 5xx for the client: no internal state and no request content, only the id under
    which the log keeps `detail`."""
    message = f"internal server error: see the server's log for request {request_id}"
    return APIError(status, message, INTERNAL, detail=detail)


def error_body(
    message: str, kind: str = INVALID, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


async def send_error(
    send: Send, status: int, message: str, kind: str = INVALID, code: str | None = None
) -> None:
    """Answer with an error from a raw ASGI middleware, before any route runs."""
    body = json.dumps(error_body(message, kind, None, code)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def validation_error(errors: Sequence[Any]) -> APIError:
    """The first pydantic error, phrased for a client: 'temperature: Input should be <= 2'."""
    if not errors:
        return APIError(400, "invalid request body")
    first = errors[0]
    loc = [str(part) for part in first.get("loc", ())]
    if first.get("type") == "json_invalid":
        reason = (first.get("ctx") or {}).get("error", "JSON decode error")
        where = f" at position {loc[1]}" if len(loc) > 1 else ""
        return APIError(400, f"malformed JSON body: {reason}{where}", code="invalid_json")
    path = loc[1:] if loc[:1] == ["body"] else loc
    message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    if first.get("type") == "extra_forbidden":  # refused, never ignored
        message = "not a field this server knows (refused rather than ignored)"
        return APIError(400, f"{'.'.join(path)}: {message}", param=path[0], code="unknown_field")
    if not path:
        return APIError(400, f"request body: {message}", code="invalid_value")
    return APIError(400, f"{'.'.join(path)}: {message}", param=path[0], code="invalid_value")


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        _log_client_error(request, exc)
        return exc.response()

    @app.exception_handler(RequestError)
    async def _core_error(request: Request, exc: RequestError) -> JSONResponse:
        error = APIError.from_core(exc)
        _log_client_error(request, error)
        retry = RETRY_AFTER_S.get(exc.status)
        return error.response(headers={"Retry-After": str(retry)} if retry else None)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        error = validation_error(exc.errors())
        _log_client_error(request, error)
        return error.response()

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> JSONResponse:
        headers = getattr(exc, "headers", None)
        if exc.status_code >= 500:
            log.error("%s: HTTP %d on %s: %s", _request_id(request), exc.status_code,
                      request.url.path, exc.detail)  # fmt: skip
            error = internal_error(_request_id(request), status=exc.status_code)
            return error.response(headers=headers)
        code = HTTP_CODES.get(exc.status_code)
        return APIError(exc.status_code, str(exc.detail), code=code).response(headers=headers)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        log.error(
            "%s: internal error on %s %s",
            _request_id(request), request.method, request.url.path, exc_info=exc,
        )  # fmt: skip
        return internal_error(_request_id(request)).response()


def _request_id(request: Request) -> str:
    return getattr(request.state, "request_id", "-")


def _log_client_error(request: Request, error: APIError) -> None:
    log.info("%s: HTTP %d on %s: %s", _request_id(request), error.status, request.url.path,
             error.logged)  # fmt: skip
