"""The router's OpenAI-compatible HTTP API (FastAPI), on the event loop of the router core.

One idea per file:
  app.py          build_app(core, tokenizer, config): routes, middleware, error handlers
  schemas.py      pydantic request models: types, ranges, bounds, refused fields; parse_body
  chat_schemas.py chat messages (tool calls and results), tools, the chat-only fields
  responses_schemas.py  the Responses API's bodies, and their translation into a chat request
  unicode.py      lone UTF-16 surrogates in a JSON body: refused, naming the field
  limits.py       every bound on client input, and the body size limit
  errors.py       OpenAI-style error bodies and the status of each kind of failure
  access_log.py   one log line per request: method, path, status, tokens, duration, id
  auth.py         the optional API key (and the paths open without it)
  request_id.py   X-Request-Id: read or made, checked, echoed
  context.py      what endpoints share: core, tokenizer, served model names
  generation.py   the core requests behind one HTTP request: submit, merge, abort on disconnect
  streaming.py    server-sent events, shared by every streaming endpoint
  logprobs.py     logprobs in OpenAI's completion and chat shapes, vLLM's prompt_logprobs
  request_params.py  a body's core RequestParams (bad words tokenized, default max_tokens)
  structured.py   response_format / structured_outputs / guided_* -> one grammar
  contained.py    a request's grammar and template work in the contained children
                  (router/contained/), and its outcome as 400 / 429 / 503
  tools.py        tools and tool messages into the chat template; the grammar of a required call
  tool_parser.py  tool calls out of the model's text, whole or streamed
  chat_templates.py  a chat request's prompt (the model's template or the request's own)
  completions.py  POST /v1/completions (echo and prompt logprobs included)
  chat.py         POST /v1/chat/completions
  responses.py    POST /v1/responses, over the chat path, streamed as the API's typed events
  tokenize.py     POST /tokenize, /detokenize (vLLM's)
  native.py       POST /generate
  ops.py          GET /health, /metrics, /v1/models (one card per served name)
  connections.py  client connections: header and body timeouts, per-peer and total limits
                  (the protocol uvicorn runs, set up in router/__main__.py)
"""

from router.http.app import build_app

__all__ = ["build_app"]
