"""The run directory of a serving stack deleted (a tmp cleaner; the next worker restart
once failed on the missing cluster file, and after a decode worker died the stack answered 503 for
good with its launcher up): `splitserve serve` notices on its next supervision pass and starts
the stack again whole, in the same run dir when the cluster file names one, else a fresh one,
and serves again (splitserve/launch/run_dir_watch.py)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal

import pytest

from splitserve import run_dirs
from splitserve.launch.run_dir_watch import RunDirWatch
from tests.test_serve_command import children_of
from tests.test_serve_supervises import Serve

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def run_dir_of(serve: Serve) -> str | None:
    """The run directory of the stack's children (where their --config file is)."""
    for pid in children_of(serve.proc.pid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                argv = fh.read().decode().split("\0")
        except OSError:
            continue
        if "--config" in argv:
            return os.path.dirname(argv[argv.index("--config") + 1])
    return None


def worker_pids(serve: Serve) -> dict[tuple[str, int], int]:
    return {(w["role"], w["index"]): w["pid"] for w in serve.health().get("workers", [])
            if w["state"] == "ready"}  # fmt: skip


@pytest.mark.parametrize("named", [True, False], ids=["named-run-dir", "made-run-dir"])
def test_a_deleted_run_dir_makes_the_launcher_start_the_stack_again(tokenizer_512, tmp_path,
                                                                    named):  # fmt: skip
    sections = {"cluster": {"run_dir": str(tmp_path / "run")}} if named else {}
    serve = Serve(tokenizer_512, tmp_path, sections=sections)
    try:
        serve.wait(lambda: "splitserve: ready on" in serve.log_path.read_text(), "ready")
        serve.wait(lambda: len(worker_pids(serve)) == 4, "every worker ready")
        before = worker_pids(serve)
        run_dir = run_dir_of(serve)
        assert run_dir and os.path.exists(os.path.join(run_dir, "cluster.toml"))
        shutil.rmtree(run_dir)
        with contextlib.suppress(ProcessLookupError):  # the launcher may be stopping it already
            os.kill(before[("decode", 0)], signal.SIGKILL)

        def serving_again() -> bool:
            pids = worker_pids(serve)
            if len(pids) < 4 or set(pids.values()) & set(before.values()):
                return False
            r = serve.http.post("/v1/completions", json={"prompt": "hello", "max_tokens": 4})
            return r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4

        serve.wait(serving_again, "the stack serving again, every process new", timeout_s=180)
        assert "is gone: starting the stack again" in serve.log_path.read_text()
        again = run_dir_of(serve)
        assert again and os.path.exists(os.path.join(again, "cluster.toml"))
        assert (again == run_dir) == named
    finally:
        serve.close()


def test_the_watch_names_what_is_lost(tmp_path):
    run_dir = tmp_path / "run"
    lock = run_dirs.hold_for_launcher(str(run_dir))
    try:
        config = run_dir / "cluster.toml"
        config.write_text("")
        watch = RunDirWatch(str(run_dir), lock, [str(config)])
        assert watch.lost() is None
        config.unlink()
        assert watch.lost().reason == f"{config} is gone"
        shutil.rmtree(run_dir)
        assert watch.lost().reason == f"run dir {run_dir} is gone"
        run_dir.mkdir()  # made again in its place, whatever its inode (a restarted worker's doing)
        config.write_text("")
        assert watch.lost().reason == f"run dir {run_dir} was deleted and made again"
    finally:
        os.close(lock)
