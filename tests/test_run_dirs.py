"""Run directories: private (0700; another user's, or one open to others, refused),
removed by the launcher that made them on a clean stop, and reclaimed by the next start once
their launcher is gone; a role started on its own with neither run_dir nor [addresses] refuses
to start instead of making a directory nobody else finds (every request got 503 under
supervisord). And the serve command leaves nothing behind. One stack to a run dir: a
second launcher, or a second copy of a role process, is refused by name and touches nothing of
the stack that holds it (it used to take over its sockets and hang in "starting")."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time

import pytest

from splitserve import run_dirs
from splitserve.config import config_from_dict
from splitserve.launch.ports import free_port
from tests.http_stack import wait_until
from tests.test_serve_command import children_of
from tests.test_serve_supervises import API_KEY, Serve


def mode(path: str) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_a_run_dir_is_made_private_and_an_open_or_foreign_one_is_refused(tmp_path):
    fresh = str(tmp_path / "a" / "run")
    run_dirs.ensure_private_dir(fresh)
    assert mode(fresh) == 0o700
    run_dirs.ensure_private_dir(fresh)  # once more: it is ours, and private
    open_one = tmp_path / "open"
    open_one.mkdir(mode=0o755)
    os.chmod(open_one, 0o755)
    with pytest.raises(ValueError, match="open to other users"):
        run_dirs.ensure_private_dir(str(open_one))
    link = tmp_path / "link"
    link.symlink_to(fresh)
    with pytest.raises(ValueError, match="not a directory"):
        run_dirs.ensure_private_dir(str(link))
    if os.geteuid() == 0:
        foreign = tmp_path / "foreign"
        foreign.mkdir(mode=0o700)
        os.chown(foreign, 65534, 65534)
        with pytest.raises(ValueError, match="belongs to uid 65534"):
            run_dirs.ensure_private_dir(str(foreign))


def test_fresh_run_dirs_are_removed_by_their_maker_and_stale_ones_reclaimed(tmp_path):
    mine = run_dirs.create(str(tmp_path))
    assert mode(mine) == 0o700 and run_dirs.owned_here(mine)
    # one whose launcher is gone: a child that exited, its pid and start time in the owner file
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    started = run_dirs.process_start_time(child.pid)
    stale = tmp_path / "splitserve-stale"
    stale.mkdir(mode=0o700)
    (stale / run_dirs.OWNER_FILE).write_text(f"{child.pid} {started}\n")
    (stale / "cluster.toml").write_text("secret things\n")
    live = tmp_path / "splitserve-live"  # another launcher's, alive: this test's parent
    live.mkdir(mode=0o700)
    parent = os.getppid()
    (live / run_dirs.OWNER_FILE).write_text(f"{parent} {run_dirs.process_start_time(parent)}\n")
    legacy = tmp_path / "splitserve-legacy"  # an older version's: no owner file, a day old
    legacy.mkdir(mode=0o700)
    day_old = time.time() - run_dirs.LEGACY_AGE_S - 60
    os.utime(legacy, (day_old, day_old))
    recent = tmp_path / "splitserve-recent"  # no owner file yet: being made right now
    recent.mkdir(mode=0o700)
    child.kill()
    child.wait()
    other = run_dirs.create(str(tmp_path))
    assert not stale.exists() and not legacy.exists()
    assert live.exists() and recent.exists() and os.path.isdir(mine)
    assert not run_dirs.remove(str(live)) and live.exists()  # not this process's making
    assert run_dirs.remove(mine) and not os.path.exists(mine)
    assert run_dirs.remove(other)


def test_a_role_process_needs_a_run_dir_or_addresses():
    with pytest.raises(ValueError, match=r"needs \[cluster\] run_dir .* or \[addresses\]"):
        config_from_dict({"cluster": {"detok_workers": 2}})


def test_one_host_toml_names_a_run_dir_that_every_program_meets():
    """Each program supervisord starts reads deploy/one-host.toml on its own: they meet at the
    same sockets only because the file names the place."""
    from splitserve.config import load_config

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    first = load_config(os.path.join(root, "deploy", "one-host.toml"))
    second = load_config(os.path.join(root, "deploy", "one-host.toml"))
    assert first.run_dir == "/tmp/splitserve" and first.addresses == second.addresses
    assert first.addresses.router == "ipc:///tmp/splitserve/router.sock"


def test_serve_removes_its_run_dir_on_a_clean_stop(tokenizer_512):
    port = free_port()
    cmd = [sys.executable, "-m", "splitserve", "serve", "--engine", "fake", "--tokenizer",
           tokenizer_512, "--port", str(port), "--ready-timeout", "120"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        deadline = time.monotonic() + 120
        while "ready on" not in proc.stdout.readline():
            assert proc.poll() is None and time.monotonic() < deadline, "serve did not start"
        run_dir = None
        for pid in children_of(proc.pid):
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                argv = fh.read().decode().split("\0")
            run_dir = os.path.dirname(argv[argv.index("--config") + 1])
        assert run_dir and os.path.basename(run_dir).startswith(run_dirs.PREFIX)
        assert mode(run_dir) == 0o700 and mode(os.path.join(run_dir, "cluster.toml")) == 0o600
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        assert not os.path.exists(run_dir), os.listdir(run_dir)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def entries(path) -> dict[str, tuple[int, int]]:
    """Each file of a directory: its inode and modification time (a rebound socket or a
    rewritten file changes them)."""
    out = {}
    for entry in os.scandir(path):
        st = entry.stat(follow_symlinks=False)
        out[entry.name] = (st.st_ino, st.st_mtime_ns)
    return out


def serve_cmd(config, port: int) -> list[str]:
    return [sys.executable, "-m", "splitserve", "serve", "--config", str(config), "--port",
            str(port), "--ready-timeout", "60"]  # fmt: skip


def role_cmd(role: str, config, index: int = 0) -> list[str]:
    return [sys.executable, "-m", f"{role}_worker", "--config", str(config), "--index", str(index)]


@pytest.mark.timeout(300)
def test_a_second_stack_on_a_run_dir_in_use_is_refused_by_name(tokenizer_512, tmp_path):
    run_dir = tmp_path / "run"
    first = Serve(tokenizer_512, tmp_path, sections={"cluster": {"run_dir": str(run_dir)}})
    try:
        first.wait(lambda: first.health().get("status") == "ready", "the first stack ready")
        pids = {(w["role"], w["index"]): w["pid"] for w in first.health()["workers"]}
        before = entries(run_dir)
        env = {**os.environ, "SPLITSERVE_API_KEY": API_KEY}
        second = subprocess.run(serve_cmd(tmp_path / "cluster.toml", free_port()), env=env,
                                capture_output=True, text=True, timeout=120)  # fmt: skip
        assert second.returncode == 1, second.stdout + second.stderr
        assert (f"run dir {run_dir} is in use by splitserve serve pid {first.proc.pid}"
                in second.stderr), second.stderr  # fmt: skip
        assert "Traceback" not in second.stdout + second.stderr
        # a role process started on its own on that run dir: refused, it is the launcher's
        alone = subprocess.run(role_cmd("prefill", run_dir / "cluster.toml"),
                               capture_output=True, text=True, timeout=120)  # fmt: skip
        assert alone.returncode == 2, alone.stderr
        assert (f"run dir {run_dir} is in use by splitserve serve pid {first.proc.pid}"
                in alone.stderr and "Traceback" not in alone.stderr), alone.stderr  # fmt: skip
        assert entries(run_dir) == before  # no socket rebound, no file rewritten
        assert {(w["role"], w["index"]): w["pid"] for w in first.health()["workers"]} == pids
        r = first.http.post("/v1/completions", json={"prompt": "hello", "max_tokens": 4})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4, r.text
    finally:
        first.close()


@pytest.mark.timeout(300)
def test_role_processes_started_alone_hold_their_places_in_the_run_dir(tokenizer_512, tmp_path):
    """supervisord's way: no launcher, each program started on its own and restarted alone. A
    second copy of a process, or a launcher on that run dir, is refused by name; a restarted
    process (its predecessor gone) takes its place again."""
    run_dir = tmp_path / "run"
    config = tmp_path / "cluster.toml"
    config.write_text(f"[model]\nengine = 'fake'\ntokenizer = '{tokenizer_512}'\n"
                      f"[cluster]\nrun_dir = '{run_dir}'\n")  # fmt: skip
    lock = run_dir / "detok-0.lock"

    def holds(proc) -> bool:
        return lock.exists() and lock.read_text() == f"detok[0] pid {proc.pid}\n"

    worker = subprocess.Popen(role_cmd("detok", config), stderr=subprocess.DEVNULL)
    try:
        wait_until((run_dir / "detok-0.sock").exists, 60, "detok[0] to bind its socket")
        again = subprocess.run(role_cmd("detok", config), capture_output=True, text=True,
                               timeout=60)  # fmt: skip
        assert again.returncode == 2, again.stderr
        assert (f"run dir {run_dir} is in use by detok[0] pid {worker.pid}" in again.stderr
                and "Traceback" not in again.stderr), again.stderr  # fmt: skip
        serve = subprocess.run(serve_cmd(config, free_port()), capture_output=True, text=True,
                               timeout=120)  # fmt: skip
        assert serve.returncode == 1, serve.stdout + serve.stderr
        assert f"run dir {run_dir} is in use by detok[0] pid {worker.pid}" in serve.stderr
        assert not (run_dir / run_dirs.LAUNCHER_LOCK).exists() and holds(worker)
        worker.kill()
        worker.wait()
        worker = subprocess.Popen(role_cmd("detok", config), stderr=subprocess.DEVNULL)
        wait_until(lambda: holds(worker), 60, "the restarted detok[0] to hold its place")
    finally:
        worker.kill()
        worker.wait()
