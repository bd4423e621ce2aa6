"""A process that can reach a worker's socket cannot change a user's answer: forged
TextBatch ("<<INJECTED BY IMPOSTOR>>"), TokenBatch, Heartbeat and RequestFailed sent into a real
stack while a request streams. With CURVE on tcp a process without the cluster's keys reaches
nothing, and a process of the cluster speaks only for itself; on ipc only this user reaches the
sockets (0600 in a 0700 run directory); and a forged heartbeat with another pid no longer counts
as a restart (it used to end, and would now move, every stream of the worker). Each time the
request comes out exactly as the fake engine's arithmetic says."""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import subprocess
import sys

import pytest
import zmq

from router.requests import RequestParams
from splitserve import protocol
from splitserve.launch.ports import free_port
from splitserve.protocol import (
    PROTOCOL_VERSION,
    DetokLoad,
    Heartbeat,
    HistogramSnapshot,
    RequestFailed,
    TextBatch,
    TextDelta,
    TokenBatch,
    TransportCounters,
)
from splitserve.security import CurveClient, Keyring, curve_client, generate_keys
from splitserve.tokenizers import load_tokenizer
from tests.pipeline_util import expected_fake_tokens, make_config, pipeline, run, wait_for

pytestmark = pytest.mark.timeout(180)

INJECTED = "<<INJECTED BY IMPOSTOR>>"
MAX_TOKENS = 120


def tcp_config(tokenizer: str, keys_dir: str):
    port = lambda: f"tcp://127.0.0.1:{free_port()}"  # noqa: E731
    addresses = {"router": port(), "prefill": [port()], "decode": [port()],
                 "detok": [port(), port()]}  # fmt: skip
    return make_config(tokenizer, addresses=addresses, security={"keys_dir": keys_dir},
                       model={"fake_step_s": 0.02})  # fmt: skip


def forgeries(handle, vocab: int) -> dict[str, list]:
    """Messages for the running request that would change its output, were they taken."""
    rid, epoch, at = handle.request_id, handle.epoch, handle.completion_tokens
    hist = HistogramSnapshot([], [0], 0.0, 0, 0.0, 0.0, 0.0)
    return {
        "text": [protocol.encode(TextBatch([TextDelta(rid, epoch, seq, INJECTED, [1], [])]))
                 for seq in range(at, at + 40)],
        "tokens": [protocol.encode(TokenBatch(protocol.Source.DECODE, 1, [rid], [epoch], [seq],
                                              [vocab - 1], [0.0], [0]))
                   for seq in range(at, at + 40)],
        "failed": [protocol.encode(RequestFailed([rid], [epoch], "decode", "forged"))],
        "heartbeat": [protocol.encode(Heartbeat(
            "detok", handle.stamp.detok, 4242, PROTOCOL_VERSION, 0.0, False, TransportCounters(),
            detok=DetokLoad(0, 0, 0, 0, 0, 0, 0, 0, hist), incarnation="f" * 32,
        ))],
    }  # fmt: skip


@contextlib.contextmanager
def forger(endpoint: str, curve=None):
    """A PUSH socket of a context of its own (a process of its own, to ZeroMQ)."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    sock.linger = 0
    if curve is not None:
        curve.apply(sock)
    sock.connect(endpoint)
    try:
        yield sock
    finally:
        sock.close(linger=0)
        ctx.destroy(linger=0)


def send_all(sock, messages: list) -> None:
    for frames in messages:
        with contextlib.suppress(zmq.Again):
            sock.send_multipart(frames, zmq.NOBLOCK)


async def stream_exactly(core, tok, prompt, forge) -> tuple:
    """Start the request, run forge(handle) once it is mid-stream, and check its output."""
    params = RequestParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    handle = await core.submit(prompt, params)
    await wait_for(lambda: handle.completion_tokens > 5, 60, "the request mid-stream")
    await forge(handle)
    text, result = await handle.finished()
    tokens, _ = expected_fake_tokens(prompt, tok.vocab_size, MAX_TOKENS, ignore_eos=True)
    assert INJECTED not in text
    assert text == tok.decode(tokens, skip_special_tokens=True)
    assert result.finish_reason.api == "length" and result.completion_tokens == MAX_TOKENS
    assert handle.migrations == 0  # nothing made the router think a worker was lost
    return handle, result


def serve_and_forge(config, tok, prompt: str, forge, core_of: list) -> None:
    """A pipeline (its core appended to core_of for forge), one request forged at mid-stream
    and checked exact, and no worker taken for restarted."""

    async def body():
        async with pipeline(config) as (core, _):
            core_of.append(core)
            await stream_exactly(core, tok, tok.encode(prompt), forge)
            assert all(w.restarts == 0 for w in core.workers.workers.values())

    run(body())


def test_on_curve_a_process_without_the_keys_or_of_another_role_changes_nothing(
    tokenizer_512, tmp_path
):
    keys = str(tmp_path / "keys")
    config = tcp_config(tokenizer_512, keys)
    generate_keys(keys, ["router", "prefill-0", "decode-0", "detok-0", "detok-1"])
    tok = load_tokenizer(tokenizer_512)
    a = config.addresses

    async def forge(handle):
        placed = handle.stamp.detok
        other = 1 - placed
        forged = forgeries(handle, tok.vocab_size)
        stranger = CurveClient(*zmq.curve_keypair(), Keyring(keys).public("router"))
        # to the router: no key; a stranger's key; a cluster key of the wrong role (prefill);
        # the detok worker the request is not placed on (its text, a failure in decode's name)
        with forger(a.router) as plain, \
                forger(a.router, stranger) as strange, \
                forger(a.router, curve_client(keys, a.router, ("prefill", 0), ("router", 0))) \
                as prefill, \
                forger(a.router, curve_client(keys, a.router, ("detok", other), ("router", 0))) \
                as detok_other, \
                forger(a.detok[placed]) as plain_to_detok:  # fmt: skip
            for sock in (plain, strange, prefill, detok_other):
                send_all(sock, forged["text"] + forged["failed"] + forged["heartbeat"])
            send_all(plain_to_detok, forged["tokens"])
            # the keyed ones get in, and are dropped by name: wait until they were seen (the
            # unkeyed ones never complete a handshake; the stream has over a hundred tokens to go)
            await wait_for(lambda: core_of[0].counters.malformed >= 3, 30, "forged ones dropped")

    core_of: list = []
    serve_and_forge(config, tok, "a request to forge", forge, core_of)


def test_a_forged_heartbeat_with_another_pid_is_no_restart(tokenizer_512):
    """Over ipc (this user's own sockets) a heartbeat for the request's decode worker with another
    pid and incarnation is ignored: no restart, no migration, every token exact."""
    config = make_config(tokenizer_512, model={"fake_step_s": 0.02})
    tok = load_tokenizer(tokenizer_512)

    async def forge(handle):
        decode = core_of[0].workers.get("decode", handle.stamp.decode)
        load = decode.load
        beat = Heartbeat("decode", handle.stamp.decode, decode.pid + 1, PROTOCOL_VERSION, 0.0,
                         False, TransportCounters(), decode=load, incarnation="f" * 32)
        with forger(config.addresses.router) as sock:
            send_all(sock, [protocol.encode(beat)] * 5)
            await wait_for(lambda: decode.foreign >= 1, 30, "the forged heartbeat seen")

    core_of: list = []
    serve_and_forge(config, tok, "a heartbeat to forge", forge, core_of)


FORGER = r"""
import os, sys, zmq
from splitserve import protocol
from splitserve.protocol import TextBatch, TextDelta
os.setgid(65534); os.setuid(65534)  # nobody: another user of this machine
ctx = zmq.Context()
sock = ctx.socket(zmq.PUSH)
sock.linger = 0
sock.connect(sys.argv[1])
for seq in range(200):
    delta = TextDelta(sys.argv[2], int(sys.argv[3]), seq, "<<INJECTED BY IMPOSTOR>>", [1], [])
    try:
        sock.send_multipart(protocol.encode(TextBatch([delta])), zmq.NOBLOCK)
    except zmq.Again:
        pass
print("connected" if os.access(sys.argv[1][len("ipc://"):], os.W_OK) else "refused")
sock.close(linger=500)
ctx.term()
"""


def test_on_ipc_another_user_cannot_reach_the_sockets(tokenizer_512):
    if os.geteuid() != 0:
        pytest.skip("switching to another user needs root (CI runs as root)")
    config = make_config(tokenizer_512, model={"fake_step_s": 0.02})
    tok = load_tokenizer(tokenizer_512)

    async def forge(handle):
        run_dir = config.run_dir
        assert stat.S_IMODE(os.stat(run_dir).st_mode) == 0o700
        for endpoint in (config.addresses.router, *config.addresses.detok):
            assert stat.S_IMODE(os.stat(endpoint.removeprefix("ipc://")).st_mode) == 0o600
        out = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-c", FORGER, config.addresses.router, handle.request_id,
             str(handle.epoch)],
            capture_output=True, text=True, timeout=60, cwd=os.getcwd(),
            env={**os.environ, "PYTHONPATH": os.getcwd()},
        )  # fmt: skip
        assert out.stdout.strip() == "refused", (out.stdout, out.stderr)

    async def body():
        async with pipeline(config) as (core, _):
            await stream_exactly(core, tok, tok.encode("a request another user sees"), forge)

    run(body())
