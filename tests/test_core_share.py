"""Cores shared between the prefill and decode workers of one host (splitserve/core_share.py):
the marks file, when a stack shares, the decode kernels following the marks with the same
tokens, and real processes: a prefill worker marks while it runs a prompt, and a restart clears
the mark a killed one left."""

from __future__ import annotations

import os
import signal
import stat
import threading

import httpx
import numpy as np
import pytest

from splitserve.config import config_from_dict
from splitserve.core_share import FILE, MARKS, PrefillMarks, open_marks, threads_while_marked
from splitserve.engine.interface import SamplingParams
from splitserve.engine.jax.build import build_jax_engine
from splitserve.engine.kernels import qkernel
from splitserve.launch.supervise import RestartWithBackoff, supervise
from tests.http_stack import http_stack, wait_until

pytestmark = pytest.mark.timeout(300)


def test_marks_are_shared_through_the_file(tmp_path):
    path = str(tmp_path / FILE)
    prefill, decode = PrefillMarks(path), PrefillMarks(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert os.path.getsize(path) == MARKS
    assert decode.marked() == []
    prefill.mark(3, True)
    prefill.mark(0, True)
    assert decode.marked() == [0, 3]
    prefill.mark(3, False)
    prefill.mark(MARKS, True)  # an index past the file's: no mark, no error
    assert decode.marked() == [0]
    assert PrefillMarks(path).marked() == [0]  # a later opener keeps what is there


def test_a_symlink_in_place_of_the_file_is_refused(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_bytes(b"")
    os.symlink(target, tmp_path / FILE)
    with pytest.raises(OSError):
        PrefillMarks(str(tmp_path / FILE))


def _config(**keys):
    cluster = {"run_dir": keys.pop("run_dir", "/tmp/x"), **keys.pop("cluster", {})}
    return config_from_dict({"model": keys, "cluster": cluster})


def test_only_a_processes_stack_with_a_run_dir_and_no_pinning_shares(tmp_path):
    run_dir = str(tmp_path)
    assert open_marks(_config(run_dir=run_dir)) is not None
    assert open_marks(_config(run_dir=run_dir, share_cores=False)) is None
    assert open_marks(_config(run_dir=run_dir, cluster={"mode": "threads"})) is None
    assert open_marks(_config(run_dir=run_dir, cluster={"cpus": {"decode": [1]}})) is None
    with pytest.raises(ValueError, match="share_cores"):
        _config(run_dir=run_dir, share_cores="yes")


def test_decode_keeps_what_prefill_leaves_and_at_least_one_thread():
    assert threads_while_marked(0, 1, cpus=2) == 1  # the defaults on this machine's size
    assert threads_while_marked(0, 8, cpus=16) == 8
    assert threads_while_marked(0, 0, cpus=4) == 1  # prefill on every CPU
    assert threads_while_marked(2, 4, cpus=8) == 1
    assert threads_while_marked(6, 2, cpus=8) == 4


@pytest.mark.skipif(not qkernel.available(), reason="native kernel not built")
@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.9, seed=3)],
                         ids=["greedy", "seeded"])
def test_decode_kernels_follow_the_marks_and_give_the_same_tokens(tmp_path, sampling):
    eng = build_jax_engine("random:test-tiny:4", 3, 64, prefill_buckets=(16, 64),
                           decode_buckets=(32, 64))  # fmt: skip
    prompts = [[int(t) for t in np.random.default_rng(s).integers(1, 512, 5 + 9 * s)]
               for s in range(3)]  # fmt: skip
    prefixes = [eng.prefill(p, sampling) for p in prompts]

    def tokens() -> np.ndarray:
        for s, prefix in enumerate(prefixes):
            eng.insert(prefix, s, sampling)
        out = np.stack([eng.generate().tokens for _ in range(12)])
        for s in range(len(prefixes)):
            eng.free(s)
        return out

    marks = PrefillMarks(str(tmp_path / FILE))
    alone = tokens()
    eng.share_cores(marks.map, 1)
    try:
        before = qkernel.shared_calls()
        assert np.array_equal(tokens(), alone)  # nothing marked
        assert qkernel.shared_calls() == before
        marks.mark(0, True)
        assert np.array_equal(tokens(), alone)  # marked: the calls take one thread
        after = qkernel.shared_calls()
        assert after > before
        marks.mark(0, False)
        assert np.array_equal(tokens(), alone)
        assert qkernel.shared_calls() == after
    finally:
        eng.share_cores(None, 1)
        eng.close()


def _post(url: str, model: str) -> None:
    try:
        httpx.post(f"{url}/v1/completions", timeout=600,
                   json={"model": model, "prompt": "a prompt", "max_tokens": 4})  # fmt: skip
    except httpx.HTTPError:
        pass  # the prefill worker is killed under it: the outcome is not what this test checks


@pytest.mark.slow
def test_a_prefill_worker_marks_a_running_prompt_and_its_restart_clears_the_mark(tokenizer_512):
    # a prompt that takes 20 s (the fake engine's warm-up prefill takes as long, at each
    # start): it is running when the test looks, which it does every 50 ms
    with http_stack(tokenizer_512, model={"fake_prefill_s": 20.0}) as s:
        marks = PrefillMarks(os.path.join(s.config.run_dir, FILE))
        assert marks.marked() == []
        stop = threading.Event()
        policy = RestartWithBackoff(backoff_s=0.0)
        loop = threading.Thread(target=supervise, args=(s.stack, policy, stop), daemon=True)
        loop.start()
        try:
            model = s.openai().models.list().data[0].id
            threading.Thread(target=_post, args=(s.url, model), daemon=True).start()
            wait_until(lambda: marks.marked() == [0], 120, "the prefill worker's mark")
            old = s.stack.children[("prefill", 0)].popen.pid
            os.kill(old, signal.SIGKILL)  # dies marked
            wait_until(lambda: s.stack.children[("prefill", 0)].popen.pid != old, 120,
                       "prefill[0] restarted")  # fmt: skip
            wait_until(lambda: marks.marked() == [], 120, "the restarted worker's clear mark")
        finally:
            stop.set()
            loop.join(timeout=30)


def test_the_mark_is_cleared_once_the_prompts_are_done(tokenizer_512):
    with http_stack(tokenizer_512, model={"fake_prefill_s": 0.2}) as s:
        marks = PrefillMarks(os.path.join(s.config.run_dir, FILE))
        client = s.openai()
        model = client.models.list().data[0].id
        for i in range(4):
            out = client.completions.create(model=model, prompt=f"prompt {i}", max_tokens=3)
            assert out.choices[0].finish_reason in ("stop", "length")
        wait_until(lambda: marks.marked() == [], 60, "no mark left")
