"""The router's OpenAI-compatible HTTP API (FastAPI), on the event loop of the router core.

One idea per file:
  app.py          build_app(core, tokenizer, config): routes, middleware, error handlers
  schemas.py      pydantic request models: types, ranges, bounds; parse_body
  unicode.py      lone UTF-16 surrogates in a JSON body: refused, naming the field
  limits.py       every bound on client input, and the body size limit
  errors.py       OpenAI-style error bodies and the status of each kind of failure
  access_log.py   one log line per request: method, path, status, tokens, duration, id
  auth.py         the optional API key (and the paths open without it)
  request_id.py   X-Request-Id: read or made, checked, echoed
  context.py      what endpoints share: core, tokenizer, served model names
  generation.py   the core requests behind one HTTP request: submit, merge, abort on disconnect
  streaming.py    server-sent events, shared by every streaming endpoint
  logprobs.py     logprobs in OpenAI's completion and chat shapes
  completions.py  POST /v1/completions
  chat.py         POST /v1/chat/completions
  native.py       POST /generate
  ops.py          GET /health, /metrics, /v1/models (one card per served name)
  connections.py  client connections: header and body timeouts, per-peer and total limits
                  (the protocol uvicorn runs, set up in router/__main__.py)
"""

from router.http.app import build_app

__all__ = ["build_app"]
