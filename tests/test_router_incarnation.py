"""A restarted router never hands one client another's text, and its predecessor's requests do not
hold the workers. Real processes, the fake engine: the router is
SIGKILLed while a client's request is queued at the prefill worker (frozen by SIGSTOP, so that
the request is surely still there) or decoding (streaming, so that it surely is); after the
restart a second client sends another prompt under the same X-Request-Id and must get exactly
its own greedy text, and the decode worker's slots must come free without waiting for the
orphans to run to max_tokens."""

from __future__ import annotations

import dataclasses
import signal
import threading

import httpx
import pytest

from splitserve import protocol
from splitserve.protocol import RouterHello
from tests.http_stack import http_stack, metric_sum, wait_healthy, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SHARED_ID = "shared-id"
SLOTS = 2
# long enough that an orphan would hold its slot far past every deadline below (0.02 s a step)
ORPHAN_TOKENS = 6000
DEADLINE_S = 60.0


@pytest.fixture(scope="module")
def stack(tokenizer_512):
    # a liveness timeout far past the test's SIGSTOP: the frozen prefill worker must still be
    # taken for alive when the request is admitted to it
    with http_stack(
        tokenizer_512,
        model={"fake_step_s": 0.02, "num_slots": SLOTS, "max_seq_len": 8192},
        lifecycle={"liveness_timeout_s": 60.0},
    ) as s:
        yield s


def complete(stack, prompt: str, request_id: str | None = None, max_tokens: int = 24) -> dict:
    headers = {"X-Request-Id": request_id} if request_id else {}
    with stack.http() as c:
        r = c.post("/v1/completions", headers=headers, json={
            "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
        })  # fmt: skip
    assert r.status_code == 200, r.text
    return r.json()


def stream_in_background(
    stack, prompt: str, request_id: str, chunks: list[str]
) -> threading.Thread:
    """A streaming request whose text chunks land in `chunks`; its connection dies with the
    router."""

    def run() -> None:
        body = {"prompt": prompt, "max_tokens": ORPHAN_TOKENS, "temperature": 0,
                "ignore_eos": True, "stream": True}  # fmt: skip
        try:
            with httpx.stream("POST", f"{stack.url}/v1/completions", json=body, timeout=120,
                              headers={"X-Request-Id": request_id}) as r:  # fmt: skip
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        chunks.append(line)
        except httpx.HTTPError:
            pass  # the router was killed under it

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def decode_free_slots(stack) -> float:
    try:
        return metric_sum(stack.metrics(), "splitserve_decode_free_slots")
    except (httpx.HTTPError, AssertionError):
        return -1


def running(stack) -> float:
    try:
        return metric_sum(stack.metrics(), "vllm:num_requests_running")
    except (httpx.HTTPError, AssertionError):
        return -1


def restart_router(stack) -> None:
    stack.stack.kill("router", 0, signal.SIGKILL)
    stack.stack.restart("router", 0)


def test_a_request_queued_at_prefill_is_not_handed_to_the_next_client_of_its_id(stack):
    own_text = complete(stack, "the second client's prompt")["choices"][0]["text"]
    prefill = stack.stack.children[("prefill", 0)].popen
    prefill.send_signal(signal.SIGSTOP)  # the first client's request waits in its socket
    try:
        chunks: list[str] = []
        first = stream_in_background(stack, "the first client's prompt", SHARED_ID, chunks)
        wait_until(lambda: running(stack) == 1, DEADLINE_S, "the first request admitted")
        restart_router(stack)
        first.join(timeout=DEADLINE_S)
    finally:
        prefill.send_signal(signal.SIGCONT)
    wait_healthy(stack.url, DEADLINE_S, stack.stack)
    second = complete(stack, "the second client's prompt", SHARED_ID)
    assert second["choices"][0]["text"] == own_text
    assert chunks == []  # the first client saw nothing: its request never ran
    wait_until(lambda: decode_free_slots(stack) == SLOTS, DEADLINE_S, "every decode slot free")


def test_a_decoding_request_is_not_handed_to_the_next_client_of_its_id(stack):
    own_text = complete(stack, "another prompt of the second client")["choices"][0]["text"]
    chunks: list[str] = []
    first = stream_in_background(stack, "the first client's long prompt", SHARED_ID + "-2", chunks)
    wait_until(lambda: len(chunks) >= 3, DEADLINE_S, "the first request streaming")
    restart_router(stack)
    first.join(timeout=DEADLINE_S)
    wait_healthy(stack.url, DEADLINE_S, stack.stack)
    second = complete(stack, "another prompt of the second client", SHARED_ID + "-2")
    assert second["choices"][0]["text"] == own_text


def test_a_dead_routers_requests_free_the_decode_slots(stack):
    chunks: list[list[str]] = [[] for _ in range(SLOTS)]
    threads = [
        stream_in_background(stack, f"orphan {i}", f"orphan-{i}", chunks[i]) for i in range(SLOTS)
    ]
    wait_until(lambda: all(len(c) >= 3 for c in chunks), DEADLINE_S, "every slot streaming")
    assert decode_free_slots(stack) == 0
    restart_router(stack)
    for t in threads:
        t.join(timeout=DEADLINE_S)
    wait_healthy(stack.url, DEADLINE_S, stack.stack)
    # the orphans would hold both slots for minutes: they are ended as the router comes back
    wait_until(lambda: decode_free_slots(stack) == SLOTS, DEADLINE_S, "the orphans' slots freed")
    for i in range(SLOTS):
        assert complete(stack, f"new {i}")["choices"][0]["finish_reason"] == "length"


def test_only_the_routers_own_word_ends_its_predecessors_requests(tokenizer_512):
    """A prefix (from a prefill worker) of a newer router incarnation is served, and ends
    nothing: a prefill host cannot end every stream by forging one. The router's RouterHello
    does end the older router's slots, and a prefix of the older router is then dropped."""
    from tests.test_worker_fuzz import DecodeWorker, genuine_prefix, one_pass, worker_of

    def prefix(rid: str, router: int):
        header, frames = genuine_prefix(rid)
        return dataclasses.replace(header, router_incarnation=router), frames

    with worker_of(DecodeWorker, tokenizer_512) as (worker, _):
        worker.dispatch([protocol.decode(protocol.encode(RouterHello(5)))])
        worker.dispatch([prefix("old", 5)])
        one_pass(worker)
        worker.dispatch([prefix("newer", 9)])
        one_pass(worker)
        assert worker.slots.get("old") is not None and worker.slots.get("newer") is not None
        assert worker.router_incarnation == 5
        worker.dispatch([protocol.decode(protocol.encode(RouterHello(9)))])
        assert worker.slots.get("old") is None and worker.slots.get("newer") is not None
        worker.dispatch([prefix("late", 5)])
        one_pass(worker)
        assert worker.slots.get("late") is None
