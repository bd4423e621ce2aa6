"""ContainedPool: the router's contained children (child.py), and the jobs they run.

A job waits for a free child (at most max_waiting jobs wait; beyond that the pool is busy),
is written to it, and its answer is awaited under the job's time limit; the event loop never
blocks on a child. A child that dies during a job (a native crash), or passes the limit (it is
killed), fails that job alone: each child runs one job at a time, so the job that ended a child
is known. The next job on that place starts a fresh child, whose start-up does not count
against any job's time limit.

A job whose caller goes away (a client that disconnects) runs to its end on the child all the
same, so a child is never left holding half a job.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from typing import Any

from router.contained import frames
from splitserve.procutil import API_KEY_ENV

log = logging.getLogger(__name__)

CHILDREN = 2  # jobs take milliseconds; two keep one hostile job from holding up the rest
MAX_WAITING = 256  # jobs waiting for a child (a burst of structured requests), then overload
# a child's start (Python and its imports) takes a fraction of a second; generous, for a host
# busy compiling
START_TIMEOUT_S = 120.0
OUTCOMES = ("ok", "refused", "crashed", "time_limit", "busy")  # how a job ended (metrics.py)


class JobRefused(Exception):
    """The job's input was refused by the child: a message, a code and the field it names."""

    def __init__(self, message: str, code: str, param: str = ""):
        super().__init__(message)
        self.code = code
        self.param = param


class JobKilled(Exception):
    """The job ended its child (a crash) or passed its time limit (the child was killed)."""

    def __init__(self, message: str, outcome: str):
        super().__init__(message)
        self.outcome = outcome  # "crashed" or "time_limit"


class PoolBusy(Exception):
    """Every child is busy and max_waiting jobs already wait."""


class PoolUnavailable(Exception):
    """A child could not be started."""


# (tokenizer path, vocabulary size): the grammar vocabulary a child checks grammars against
Vocabulary = tuple[str, int]


def child_argv(vocabulary: Vocabulary | None = None) -> list[str]:
    argv = [sys.executable, "-m", "router.contained.child", "--parent", str(os.getpid())]
    if vocabulary is not None:
        argv += ["--tokenizer", vocabulary[0], "--vocab-size", str(vocabulary[1])]
    return argv


class Child:
    """One child process, started on demand, one job at a time."""

    def __init__(self, vocabulary: Vocabulary | None = None) -> None:
        self.vocabulary = vocabulary
        self.proc: asyncio.subprocess.Process | None = None
        self.closed = False  # the router is stopping: no child starts any more

    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def run(self, job: str, args: dict[str, Any], limit_s: float) -> Any:
        frame = frames.pack({"job": job, "args": args})  # ValueError before any child is used
        if not self.alive():
            await self._start()
        proc = self.proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        stdin, stdout = proc.stdin, proc.stdout

        async def exchange() -> dict[str, Any]:
            stdin.write(frame)
            await stdin.drain()
            return await frames.read_async(stdout)

        try:
            reply = await asyncio.wait_for(exchange(), limit_s)
        except TimeoutError:
            await self.kill()
            raise JobKilled(f"it took longer than {limit_s:g} s", "time_limit") from None
        except (asyncio.IncompleteReadError, ConnectionError):
            status = await self.kill()  # it has ended or is ending: this reads its status
            raise JobKilled(f"it ended the process that ran it ({describe(status)})",
                            "crashed") from None  # fmt: skip
        except frames.FrameError as exc:
            await self.kill()
            raise RuntimeError(f"a contained child answered garbage: {exc}") from None
        if "ok" in reply:
            return reply["ok"]
        if reply.get("code") in ("internal", "unsendable"):
            raise RuntimeError(f"a contained job failed: {reply.get('error')}")
        raise JobRefused(str(reply.get("error")), str(reply.get("code")),
                         str(reply.get("param") or ""))  # fmt: skip

    async def _start(self) -> None:
        env = {k: v for k, v in os.environ.items() if k != API_KEY_ENV}  # it needs no key
        try:
            if self.closed:
                raise OSError("the router is stopping")
            pipe = asyncio.subprocess.PIPE
            self.proc = await asyncio.create_subprocess_exec(
                *child_argv(self.vocabulary), stdin=pipe, stdout=pipe, env=env
            )
            if self.closed:  # closed while the process was being made
                raise OSError("the router is stopping")
            assert self.proc.stdout is not None
            ready = await asyncio.wait_for(frames.read_async(self.proc.stdout), START_TIMEOUT_S)
            if ready.get("ready") is not True:
                raise frames.FrameError(f"not a ready frame: {ready}")
        except (OSError, ValueError, TimeoutError, asyncio.IncompleteReadError) as exc:
            await self.kill()
            log.error("a contained child could not start: %r", exc)
            raise PoolUnavailable(str(exc) or type(exc).__name__) from None
        log.info("contained child %d started", self.proc.pid)

    async def close(self) -> None:
        self.closed = True
        await self.kill()

    async def kill(self) -> int | None:
        """Kill the child if it is still running; its exit status."""
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        return await proc.wait()


def describe(status: int | None) -> str:
    if status is not None and status < 0:
        with contextlib.suppress(ValueError):
            return signal.Signals(-status).name
    return f"exit status {status}"


class ContainedPool:
    def __init__(
        self, children: int = CHILDREN, max_waiting: int = MAX_WAITING,
        vocabulary: Vocabulary | None = None,
    ):  # fmt: skip
        """vocabulary: the model's, which grammars are checked against as the workers will
        build them (a token id past it is the client's error); None: compiled only."""
        self.idle = [Child(vocabulary) for _ in range(children)]
        self.all = list(self.idle)
        self.free = asyncio.Semaphore(children)
        self.max_waiting = max_waiting
        self.waiting = 0
        self.ended = dict.fromkeys(OUTCOMES, 0)

    def running(self) -> int:
        return len(self.all) - len(self.idle)

    async def run(self, job: str, args: dict[str, Any], limit_s: float) -> Any:
        """The job's answer; JobRefused, JobKilled, PoolBusy or PoolUnavailable otherwise."""
        if self.waiting >= self.max_waiting:
            self.ended["busy"] += 1
            raise PoolBusy(f"{self.waiting} jobs are waiting already")
        self.waiting += 1
        try:
            await self.free.acquire()
        finally:
            self.waiting -= 1
        child = self.idle.pop()
        task = asyncio.ensure_future(self._run_on(child, job, args, limit_s))
        task.add_done_callback(_retrieved)
        return await asyncio.shield(task)

    async def _run_on(self, child: Child, job: str, args: dict[str, Any], limit_s: float) -> Any:
        try:
            answer = await child.run(job, args, limit_s)
        except JobRefused:
            self.ended["refused"] += 1
            raise
        except JobKilled as exc:
            self.ended[exc.outcome] += 1
            raise
        finally:
            self.idle.append(child)
            self.free.release()
        self.ended["ok"] += 1
        return answer

    def pids(self) -> list[int]:
        return [c.proc.pid for c in self.all if c.proc is not None and c.alive()]

    async def close(self) -> None:
        """Kill every child (a job on one fails); no child starts after this."""
        for child in self.all:
            await child.close()


def _retrieved(task: asyncio.Future) -> None:
    """A job whose caller went away: its outcome is read here, so that asyncio does not report
    an exception that nobody retrieved."""
    if not task.cancelled():
        task.exception()
