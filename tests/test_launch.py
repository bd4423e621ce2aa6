"""The launcher's lifecycle pieces: the supervision loop's two policies (on a stand-in stack, with
a clock the test moves, so no timing), a real role restarted after SIGKILL, the readiness wait
giving up when a role exits, and the router refusing threads mode when run alone."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import pytest

from splitserve.launch.health import StackNotReady, wait_ready
from splitserve.launch.pipeline import fake_engine_config
from splitserve.launch.ports import free_port
from splitserve.launch.processes import ProcessStack
from splitserve.launch.roles import role_module, stack_roles, write_config
from splitserve.launch.supervise import RestartWithBackoff, StopAll, supervise

pytestmark = pytest.mark.timeout(120)


@dataclass
class FakePopen:
    returncode: int | None = -9


@dataclass
class FakeChild:
    role: str
    index: int
    popen: FakePopen = field(default_factory=FakePopen)

    @property
    def name(self) -> str:
        return f"{self.role}[{self.index}]"


class FakeStack:
    """dead() answers from a script, one list per round; the last round sets `stop`."""

    def __init__(self, rounds: list[list[FakeChild]], stop: threading.Event, clock: list[float]):
        self.rounds, self.stop, self.clock = rounds, stop, clock
        self.spawned: list[tuple[str, int, float]] = []

    def dead(self) -> list[FakeChild]:
        if not self.rounds:
            self.stop.set()
            return []
        self.clock[0] += 1.0  # each round is one second later
        return self.rounds.pop(0)

    def spawn(self, role: str, index: int) -> None:
        self.spawned.append((role, index, self.clock[0]))


def _run(rounds, policy):
    stop, clock = threading.Event(), [0.0]
    stack = FakeStack(rounds, stop, clock)
    exited = supervise(stack, policy, stop, clock=lambda: clock[0], interval_s=0)
    return stack, exited


def test_stop_all_returns_the_first_child_that_exited_and_restarts_nothing():
    detok = FakeChild("detok", 1)
    stack, exited = _run([[], [detok], [FakeChild("decode", 0)]], StopAll())
    assert exited is detok and stack.spawned == []


def test_restart_with_backoff_restarts_at_once_then_backs_off_doubling(caplog):
    decode = FakeChild("decode", 0)
    policy = RestartWithBackoff(backoff_s=2.5, stable_s=60.0)
    with caplog.at_level(logging.WARNING, logger="splitserve.launch.supervise"):
        # dead at t = 1: restarted at once; dead again at 2 (a quick crash: the back-off doubles
        # to 5 s), so the next restart is at 6; dead again at 7 (back-off 10 s): waits
        rounds = [[decode], [decode], [decode], [decode], [decode], [decode], [decode]]
        stack, exited = _run(rounds, policy)
    assert exited is None
    assert stack.spawned == [("decode", 0, 1.0), ("decode", 0, 6.0)]
    assert policy.restarts[("decode", 0)] == 2
    assert policy.backoff(("decode", 0)) == 10.0
    lines = [r.getMessage() for r in caplog.records]
    assert lines[-1] == "decode[0] exited with status -9: restarting it (restart 2)"


def test_a_stable_run_resets_the_backoff():
    decode = FakeChild("decode", 0)
    policy = RestartWithBackoff(backoff_s=1.0, stable_s=3.0)
    # dead at 1 (restart), at 2 (quick: back-off 2 s, restart at 3), up from 4 to 7, dead at 8
    # after a 5 s run: stable, so the back-off is 1 s again and the restart comes at once
    rounds = [[decode], [decode], [decode], [], [], [], [], [decode]]
    stack, _ = _run(rounds, policy)
    assert stack.spawned == [("decode", 0, 1.0), ("decode", 0, 3.0), ("decode", 0, 8.0)]
    assert policy.backoff(("decode", 0)) == 1.0


def test_a_killed_role_is_restarted_and_the_stack_still_stops(tokenizer_512):
    config = fake_engine_config(tokenizer_512)
    stack = ProcessStack(config, roles=("detok",), log_dir=f"{config.run_dir}/logs")
    stop = threading.Event()
    policy = RestartWithBackoff(backoff_s=0.0)
    loop = threading.Thread(target=supervise, args=(stack, policy, stop), daemon=True)
    try:
        stack.start()
        old = stack.children[("detok", 1)].popen.pid
        loop.start()
        os.kill(old, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while stack.children[("detok", 1)].popen.pid == old:
            assert time.monotonic() < deadline, "detok[1] was not restarted"
            time.sleep(0.05)
        assert policy.restarts == {("detok", 1): 1}
    finally:
        stop.set()
        loop.join(timeout=10)
        stack.stop(timeout_s=10)
    assert not [c.name for c in stack.children.values() if c.popen.poll() is None]


def test_waiting_for_readiness_ends_when_a_role_exits(tokenizer_512):
    # a router alone on a port: it exits at once when its config is unreadable
    config = fake_engine_config(tokenizer_512, router={"port": free_port()})
    stack = ProcessStack(config, roles=("router",), config_path=write_config(config))
    with open(stack.config_path, "a") as fh:
        fh.write("\n[nonsense]\n")
    try:
        stack.start()
        with pytest.raises(StackNotReady) as err:
            wait_ready(f"http://127.0.0.1:{config.router.port}/health", 60, stack=stack)
        assert err.value.exited == ["router[0]"]
    finally:
        stack.stop(timeout_s=10)


def test_threads_mode_is_composed_by_the_launcher_not_the_router(tokenizer_512):
    threads = fake_engine_config(tokenizer_512, "threads")
    assert stack_roles(threads) == ("router",)
    assert role_module("router", "threads") == "splitserve.launch.threads_main"
    assert role_module("router", "processes") == "router"
    # the router alone cannot serve threads mode: it says where to go instead of hanging
    out = subprocess.run(
        [sys.executable, "-m", "router", "--config", write_config(threads)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2 and "splitserve.launch.threads_main" in out.stderr
    code = ("import sys, router.__main__; "
            "print(any(m.startswith('splitserve.launch') for m in sys.modules))")
    imported = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=60, check=True)  # fmt: skip
    assert imported.stdout.strip() == "False"  # the router does not import the launcher
