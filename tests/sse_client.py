"""A small streaming client for tests that drive a stack over HTTP, also runnable as a script
(the two-host test runs it inside a network namespace):

    python tests/sse_client.py --url http://10.0.0.1:8000 --requests 4 --max-tokens 500

prints one JSON line per request: its prompt, request id, finish reason, error, text, and when its
first text came and when it ended (time.time(), comparable across processes). With --progress (one
request) it also prints `chunk N` as the Nth chunk of text arrives, for a test that acts
mid-stream; with --distinct each request has a prompt of its own (distinct_prompt).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import uuid

import httpx


def stream_completion(
    url: str,
    prompt: str,
    max_tokens: int,
    request_id: str | None = None,
    timeout_s: float = 120,
    headers: dict[str, str] | None = None,
    on_chunk=None,
) -> dict:
    """on_chunk(n): called as the nth chunk of text arrives."""
    chunks = 0
    request_id = request_id or f"t-{uuid.uuid4().hex[:12]}"
    out = {"request_id": request_id, "finish_reason": None, "error": None, "text": "", "tokens": 0,
           "first_at": None}  # fmt: skip
    body = {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    try:
        with httpx.stream(
            "POST",
            f"{url}/v1/completions",
            json=body,
            headers={"X-Request-Id": request_id, **(headers or {})},
            timeout=timeout_s,
        ) as resp:
            if resp.status_code != 200:
                resp.read()
                out["error"] = f"HTTP {resp.status_code}: {resp.text}"
                out["finish_reason"] = "http_error"
                return out
            for line in resp.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    out["error"] = chunk["error"]["message"]
                    out["finish_reason"] = "error"
                    continue
                if chunk.get("usage"):
                    out["tokens"] = chunk["usage"]["completion_tokens"]
                for choice in chunk.get("choices", []):
                    if choice.get("text") and out["first_at"] is None:
                        out["first_at"] = time.time()
                    out["text"] += choice.get("text", "")
                    if choice.get("text") and on_chunk is not None:
                        chunks += 1
                        on_chunk(chunks)
                    if choice.get("finish_reason"):
                        out["finish_reason"] = choice["finish_reason"]
    except httpx.HTTPError as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
        out["finish_reason"] = "transport_error"
    finally:
        out["ended_at"] = time.time()
    return out


def distinct_prompt(i: int) -> str:
    """Request i's prompt under --distinct: each its own, so that each has its own output."""
    return f"request {i}: hello world"


def stream_many(
    url: str, n: int, max_tokens: int, prompt: str = "hello world", distinct: bool = False
) -> list[dict]:
    results: list[dict] = [{} for _ in range(n)]

    def one(i: int) -> None:
        text = distinct_prompt(i) if distinct else prompt
        results[i] = {"prompt": text, **stream_completion(url, text, max_tokens)}

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--requests", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--progress", action="store_true", help="one request; `chunk N` lines")
    p.add_argument("--timeout", type=float, default=120)
    p.add_argument("--distinct", action="store_true", help="request i's prompt: distinct_prompt(i)")
    args = p.parse_args()
    if args.progress:
        progress = lambda n: print(f"chunk {n}", flush=True)  # noqa: E731
        r = stream_completion(args.url, "hello world", args.max_tokens, timeout_s=args.timeout,
                              on_chunk=progress)  # fmt: skip
        print(json.dumps(r), flush=True)
        return
    for r in stream_many(args.url, args.requests, args.max_tokens, distinct=args.distinct):
        print(json.dumps(r), flush=True)


if __name__ == "__main__":
    sys.exit(main())
