"""RouterCore.submit holds nothing for a request that fails: a failure injected at each of its
steps leaves no admission place, no reserved id and no live request behind, and the core goes on
serving. Real sockets stand in for the workers: a PUSH socket announces them (Ready) and a PULL
socket bound at the prefill worker's address receives what the core sends."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest
import zmq

import router.core
import router.params
from router.core import RouterCore
from router.requests import InvalidRequest, NotReady, RequestParams
from splitserve import protocol
from splitserve.protocol import PROTOCOL_VERSION, GenerateRequest, Ready, WorkerInfo
from splitserve.tokenizers import load_tokenizer
from tests.pipeline_util import make_config, run, wait_for

pytestmark = pytest.mark.timeout(120)

PROMPT = [5, 6, 7]


class Injected(Exception):
    """The failure a test puts into one step of submit."""


@dataclass
class FakeWorkers:
    """The workers' side of the core's sockets: Ready announced, the prefill socket read."""

    ctx: zmq.Context
    prefill: zmq.Socket

    def receive_request(self, request_id: str, timeout_s: float = 10.0) -> GenerateRequest:
        """Read until the GenerateRequest of request_id arrives (skipping what came before:
        aborts, and requests a failure after their send did send)."""
        while self.prefill.poll(int(timeout_s * 1000)):
            msg, _ = protocol.decode(self.prefill.recv_multipart())
            if isinstance(msg, GenerateRequest) and msg.request_id == request_id:
                return msg
        raise AssertionError(f"{request_id} never reached the prefill socket")


async def _ready_core(config, tok) -> tuple[RouterCore, FakeWorkers]:
    core = RouterCore(config, tok.vocab_size, tok.eos_ids)
    ctx = zmq.Context()
    prefill = ctx.socket(zmq.PULL)
    prefill.setsockopt(zmq.LINGER, 0)
    prefill.bind(config.addresses.prefill[0])
    await core.start()
    announce = ctx.socket(zmq.PUSH)
    announce.setsockopt(zmq.LINGER, 0)
    announce.connect(config.addresses.router)
    for role, index in (("prefill", 0), ("decode", 0), ("detok", 0), ("detok", 1)):
        announce.send_multipart(
            protocol.encode(Ready(role, index, 1000 + index, PROTOCOL_VERSION, WorkerInfo(),
                                  f"{role}{index}".ljust(32, "x")))  # fmt: skip
        )
    announce.close(linger=1000)
    await core.wait_ready(30)
    await wait_for(lambda: len(core.workers.live_detoks()) == 2, 30, "both detok workers")
    return core, FakeWorkers(ctx, prefill)


def assert_nothing_held(core: RouterCore, after: str = "") -> None:
    held = (core.admission.running, len(core.admission.waiters), core.requests.reserved(),
            len(core.requests))  # fmt: skip
    assert held == (0, 0, frozenset(), 0), f"after {after}: (running, waiting, reserved, live)"


def _boom(*_args, **_kwargs):
    raise Injected("injected failure")


async def _aboom(*_args, **_kwargs):
    raise Injected("injected failure")


def _second_call_fails(real):
    """The real function once (the unstamped message's check), then a failure (the stamped)."""
    calls = []

    def fn(*args, **kwargs):
        calls.append(1)
        if len(calls) > 1:
            raise Injected("injected failure")
        return real(*args, **kwargs)

    return fn


# Each step of submit in order, as (name, how to make it fail). The core is `c`.
STEPS = {
    "validate": lambda c, mp: mp.setattr(router.core, "validate", _boom),
    "build the message": lambda c, mp: mp.setattr(router.params, "GenerateRequest", _boom),
    "encode it": lambda c, mp: mp.setattr(protocol, "encode", _boom),
    "decode it back": lambda c, mp: mp.setattr(protocol, "decode", _boom),
    "reserve the id": lambda c, mp: mp.setattr(c.requests, "reserve", _boom),
    "check readiness": lambda c, mp: mp.setattr(c, "is_ready", _boom),
    "acquire admission": lambda c, mp: mp.setattr(c.admission, "acquire", _aboom),
    "place it": lambda c, mp: mp.setattr(c.placement, "place", _boom),
    "encode stamped": lambda c, mp: mp.setattr(protocol, "encode", _second_call_fails(
        protocol.encode)),
    "make the handle": lambda c, mp: mp.setattr(router.core, "RequestHandle", _boom),
    "register it": lambda c, mp: mp.setattr(c.requests, "add", _boom),
    "count it": lambda c, mp: mp.setattr(c.metrics, "admitted", _boom),
    "send it": lambda c, mp: mp.setattr(c.links.senders[("prefill", 0)], "send_frames", _boom),
    "log it": lambda c, mp: mp.setattr(router.core.log, "info", _boom),
}  # fmt: skip


def test_a_failure_at_any_step_of_submit_leaks_nothing(tokenizer_512):
    tok = load_tokenizer(tokenizer_512)
    config = make_config(tokenizer_512, lifecycle={"liveness_timeout_s": 3600.0})

    async def body():
        core, workers = await _ready_core(config, tok)
        try:
            for name, inject in STEPS.items():
                with pytest.MonkeyPatch.context() as mp:
                    inject(core, mp)
                    with pytest.raises(Injected):
                        await core.submit(PROMPT, RequestParams(max_tokens=4))
                assert_nothing_held(core, name)
                # and the core still serves: the next request reaches the prefill worker
                handle = await core.submit(PROMPT, RequestParams(max_tokens=4))
                assert workers.receive_request(handle.request_id).prompt == PROMPT, name
                core.abort(handle)
                assert_nothing_held(core)
        finally:
            await core.close()
            workers.ctx.destroy(linger=0)

    run(body())


def test_a_send_the_prefill_worker_refuses_ends_the_request_at_once(tokenizer_512):
    tok = load_tokenizer(tokenizer_512)
    config = make_config(tokenizer_512, lifecycle={"liveness_timeout_s": 3600.0})

    async def body():
        core, workers = await _ready_core(config, tok)
        try:
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(core.links.senders[("prefill", 0)], "send_frames", lambda frames: False)
                handle = await core.submit(PROMPT, RequestParams(max_tokens=4))
            assert handle.result is not None and handle.result.finish_reason.api == "error"
            assert "not accepting" in handle.result.error
            assert_nothing_held(core)
        finally:
            await core.close()
            workers.ctx.destroy(linger=0)

    run(body())


@pytest.mark.parametrize(
    "params, field",
    [
        (RequestParams(stop=("\udfff",)), "stop"),  # the 16 requests that once froze admission
        (RequestParams(temperature=1e-30), "temperature"),
        (RequestParams(temperature=float("nan")), "temperature"),
    ],
)
def test_invalid_requests_hold_nothing(tokenizer_512, params, field):
    tok = load_tokenizer(tokenizer_512)
    config = make_config(tokenizer_512, lifecycle={"liveness_timeout_s": 3600.0})

    async def body():
        core, workers = await _ready_core(config, tok)
        try:
            for _ in range(2 * config.model.num_slots):
                with pytest.raises(InvalidRequest) as info:
                    await core.submit(PROMPT, params)
                assert info.value.param == field
            assert_nothing_held(core)
            handle = await core.submit(PROMPT, RequestParams(max_tokens=4))
            assert workers.receive_request(handle.request_id).prompt == PROMPT
        finally:
            await core.close()
            workers.ctx.destroy(linger=0)

    run(body())


def test_unencodable_input_the_bounds_miss_is_refused_before_admission(tokenizer_512):
    """The encode-and-decode check of the message stands behind the bounds: with the stop check
    of validate() skipped, a lone surrogate is still refused, holding nothing."""
    tok = load_tokenizer(tokenizer_512)
    config = make_config(tokenizer_512, lifecycle={"liveness_timeout_s": 3600.0})

    async def body():
        core, workers = await _ready_core(config, tok)
        try:
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(router.core, "validate", lambda prompt, p, vocab, ctx: p)
                with pytest.raises(InvalidRequest, match="cannot be sent"):
                    await core.submit(PROMPT, RequestParams(stop=("\udfff",)))
            assert_nothing_held(core)
        finally:
            await core.close()
            workers.ctx.destroy(linger=0)

    run(body())


def test_a_request_cancelled_while_queued_holds_nothing(tokenizer_512):
    tok = load_tokenizer(tokenizer_512)
    config = make_config(
        tokenizer_512, router={"max_running": 1}, lifecycle={"liveness_timeout_s": 3600.0}
    )

    async def body():
        core, workers = await _ready_core(config, tok)
        try:
            first = await core.submit(PROMPT, RequestParams(max_tokens=4))
            queued = asyncio.create_task(core.submit(PROMPT, RequestParams(max_tokens=4)))
            await wait_for(lambda: core.admission.waiters, 10, "the second request queued")
            queued.cancel()
            with pytest.raises(asyncio.CancelledError):
                await queued
            core.abort(first)
            assert_nothing_held(core)
        finally:
            await core.close()
            workers.ctx.destroy(linger=0)

    run(body())


def test_not_ready_holds_nothing(tokenizer_512):
    tok = load_tokenizer(tokenizer_512)
    config = make_config(tokenizer_512)

    async def body():
        core = RouterCore(config, tok.vocab_size, tok.eos_ids)
        await core.start()
        try:
            with pytest.raises(NotReady):
                await core.submit(PROMPT, RequestParams())
            assert_nothing_held(core)
        finally:
            await core.close()

    run(body())


def test_an_engine_without_logits_controls_refuses_requests_that_need_them(
    tokenizer_512, monkeypatch
):
    """The router says 400 before anything is held, instead of a worker failing the request.
    (Both engines apply controls now: the JAX engine is marked without them here.)"""
    monkeypatch.setattr("router.params.supports_controls", lambda engine: engine != "jax")
    tok = load_tokenizer(tokenizer_512)
    config = make_config(tokenizer_512, model={"engine": "jax", "path": "random:tiny-7m"})
    core = RouterCore(config, tok.vocab_size, tok.eos_ids, ctx=zmq.Context.instance())
    for params in (RequestParams(max_tokens=4, grammar="start: \"a\""),
                   RequestParams(max_tokens=4, frequency_penalty=0.5),
                   RequestParams(max_tokens=4, logprobs=True, top_logprobs=2)):  # fmt: skip
        with pytest.raises(InvalidRequest, match="jax engine"):
            run(core.submit(PROMPT, params))
    assert_nothing_held(core)
