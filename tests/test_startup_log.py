"""A start-up that says what it does: the worker's start-up log (each warm-up program, n of N,
from the engine's executable store or compiled; a line at least every quiet_s) and the serve
command's ready lines."""

from __future__ import annotations

import logging
import threading

import pytest

from splitserve.launch.health import Health
from splitserve.launch.ready_lines import ReadyLines
from splitserve.startup_log import StartupLog


def test_warm_up_progress_lines(caplog):
    log = logging.getLogger("test.startup")
    startup = StartupLog("decode[0]", log)
    with caplog.at_level(logging.INFO, logger="test.startup"):
        startup.phase("compiling the warm-up programs")
        startup.compiled(("decode", 64), 1, 2, 0.25, "cache")
        startup.compiled(("insert", 16, 64), 2, 2, 1.5, "compiled")
        startup.done()
    lines = [r.getMessage() for r in caplog.records]
    assert "decode[0]: warm-up 1/2: decode(64) in 0.2 s (cache)" in lines
    assert "decode[0]: warm-up 2/2: insert(16, 64) in 1.5 s (compiled)" in lines
    assert lines[-1].startswith("decode[0]: started in ")
    assert lines[-1].endswith("1 of 2 programs from the compilation cache")
    assert startup.finished


def test_a_quiet_start_still_speaks(caplog):
    """The ticker speaks once quiet_s passed without a line (a fake clock moves it)."""
    now = [0.0]
    spoke = threading.Event()

    class Spy(logging.Handler):
        def emit(self, record):
            if "still loading" in record.getMessage():
                spoke.set()

    log = logging.getLogger("test.startup.quiet")
    log.addHandler(Spy())
    log.setLevel(logging.INFO)
    startup = StartupLog("prefill[0]", log, quiet_s=0.05, clock=lambda: now[0])
    startup.phase("loading the model")
    startup.start()
    now[0] = 12.0
    try:
        assert spoke.wait(30), "no line while the start-up was quiet"
    finally:
        startup.done()


def health(states: dict[tuple[str, int], str], status: int = 503) -> Health:
    return Health(status, {"workers": [{"role": r, "index": i, "state": s}
                                       for (r, i), s in states.items()]})  # fmt: skip


def test_ready_lines_name_each_worker_once_and_who_is_left():
    now = [0.0]
    out: list[str] = []
    lines = ReadyLines(out.append, clock=lambda: now[0], quiet_s=8.0)
    lines(None)  # the router does not answer yet
    now[0] = 9.0
    lines(None)
    assert out == ["splitserve: still starting after 9 s: waiting for the router's HTTP port"]
    now[0] = 10.0
    lines(health({("prefill", 0): "starting", ("detok", 0): "ready"}))
    lines(health({("prefill", 0): "starting", ("detok", 0): "ready"}))
    assert out[1:] == ["splitserve: detok[0] ready after 10 s"]
    now[0] = 19.0
    lines(health({("prefill", 0): "starting", ("detok", 0): "ready"}))
    assert out[2] == "splitserve: still starting after 19 s: waiting for prefill[0] starting"
    now[0] = 20.0
    lines(health({("prefill", 0): "ready", ("detok", 0): "ready"}, 200))
    assert out[3:] == ["splitserve: prefill[0] ready after 20 s"]


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_role_main_takes_log_flags(fmt):
    from splitserve.role_main import parse_args

    argv = ["--config", "x.toml", "--log-level", "DEBUG", "--log-format", fmt]
    args = parse_args("prefill", argv)
    assert (args.log_level, args.log_format) == ("debug", fmt)


STUCK_WORKER = """
import sys, time
from splitserve.role_main import run_role
from splitserve.worker import WorkerLoop

class Stuck(WorkerLoop):
    role = "prefill"

    def setup(self):  # a model that takes forever to load
        print("setting up", flush=True)
        time.sleep(3600)

sys.exit(run_role("prefill", Stuck, ["--config", sys.argv[1]]))
"""


def test_a_signal_while_starting_exits_at_once(tmp_path, tokenizer_512):
    """Nothing to drain before Ready: SIGTERM ends a worker still loading or compiling at once
    instead of after its warm-up (Ctrl-C during a cold start took 20 s)."""
    import signal
    import subprocess
    import sys

    from splitserve.launch.pipeline import fake_engine_config
    from splitserve.launch.roles import write_config

    path = write_config(fake_engine_config(tokenizer_512), str(tmp_path / "cluster.toml"))
    proc = subprocess.Popen([sys.executable, "-c", STUCK_WORKER, path], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert proc.stdout.readline().strip() == "setting up"
        proc.send_signal(signal.SIGTERM)
        try:  # both pipes read while it exits: a full stderr pipe cannot hold it up
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired as late:
            proc.kill()
            _, err = proc.communicate()
            raise AssertionError(
                f"still running 60 s after SIGTERM; its stderr:\n{err[-3000:]}"
            ) from late
        assert proc.returncode == 0, err[-3000:]
        assert "while starting: nothing to drain, exiting now" in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
