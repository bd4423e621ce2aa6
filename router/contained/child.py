"""A contained child of the router: `python -m router.contained.child --parent PID`, started by
router/contained/pool.py, never by hand.

A job's path through this process:
 1. At start: die with the router (PR_SET_PDEATHSIG), build the model's grammar vocabulary
    (given --tokenizer and --vocab-size), bound this process's memory to what it uses now plus
    MEMORY_HEADROOM_BYTES, then say {"ready": true}.
 2. The router writes one job frame on stdin (frames.py): {"job": "grammar" | "template",
    "args": {...}}.
 3. grammar: the spec checked against the bounds and compiled and validated by the grammar
    engine (splitserve/grammar/specs.py compile_spec), then its matcher built over the model's
    vocabulary as a worker will build it (a token id past the vocabulary is refused here, not
    failed at a worker), on a thread whose stack is
    CHECK_STACK_BYTES, a quarter of what a worker's thread has: the engine recurses as deep when
    a worker builds the grammar's matcher (a few per cent more), so what passes here cannot
    overflow a worker's stack.
    template: the template compiled (kept for the next job) and rendered in the sandbox
    (splitserve/tokenizers/chat_template.py), on the main thread.
 4. One answer frame on stdout: {"ok": value}, or {"error": message, "code": code, "param":
    which field}. Stray writes to file descriptor 1 go to stderr, never into the frames.
A native crash ends this process, and the router kills it at a job's time limit; either way
the router answers that request 400 and starts a fresh child for the next job.
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import queue
import resource
import signal
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from router.contained import frames
from splitserve.grammar.bounds import GrammarTooComplex
from splitserve.grammar.matcher import GrammarError, GrammarState
from splitserve.grammar.specs import GrammarSpec, compile_spec
from splitserve.grammar.vocabulary import grammar_tokenizer
from splitserve.tokenizers.chat_template import ChatTemplate, ChatTemplateError

log = logging.getLogger("router.contained")

PR_SET_PDEATHSIG = 1
# Worker threads get 8 MiB (the main thread's usual limit; splitserve/launch/threads.py sets
# it for threads mode); the grammar engine needs a few KiB per link of a chain, so a grammar
# compiled here with a quarter of that has room to spare in any worker.
CHECK_STACK_BYTES = 2 << 20
# beyond what the process holds once ready: a job that needs more fails (MemoryError, or the
# engine aborts) instead of taking the host's memory
MEMORY_HEADROOM_BYTES = 512 << 20
TEMPLATES_KEPT = 16


class Refused(Exception):
    """A job's input refused, with the field it names and a code (HTTP 400)."""

    def __init__(self, message: str, code: str, param: str = ""):
        super().__init__(message)
        self.code = code
        self.param = param


class GrammarJobs:
    """Grammars checked and compiled on a small-stack thread."""

    def __init__(self, vocabulary: Any = None) -> None:
        """vocabulary: the model's llguidance.LLTokenizer (None: compile only)."""
        self.vocabulary = vocabulary
        self.jobs: queue.Queue = queue.Queue(1)
        self.answers: queue.Queue = queue.Queue(1)
        threading.stack_size(CHECK_STACK_BYTES)
        try:
            threading.Thread(target=self._serve, name="grammar-check", daemon=True).start()
        finally:
            threading.stack_size(0)

    def __call__(self, args: dict[str, Any]) -> Any:
        self.jobs.put(args)
        ok, value = self.answers.get()
        if not ok:
            raise value
        return value

    def _serve(self) -> None:
        while True:
            args = self.jobs.get()
            try:
                self.answers.put((True, self._check(args)))
            except BaseException as exc:  # noqa: BLE001 - handed to the main thread
                self.answers.put((False, exc))

    def _check(self, args: dict[str, Any]) -> str:
        try:
            grammar = compile_spec(GrammarSpec(str(args["kind"]), str(args["text"])))
            if self.vocabulary is not None:
                GrammarState(self.vocabulary, grammar, ())
            return grammar
        except GrammarTooComplex as exc:
            raise Refused(str(exc), "grammar_too_complex") from None
        except GrammarError as exc:
            raise Refused(str(exc), "invalid_grammar") from None
        except (RecursionError, MemoryError) as exc:
            raise Refused(f"too complex to compile ({type(exc).__name__})",
                          "grammar_too_complex") from None  # fmt: skip


class TemplateJobs:
    """Chat templates rendered in the sandbox; the last few compiled ones kept."""

    def __init__(self) -> None:
        self.compiled: OrderedDict[tuple[str, str, str], ChatTemplate] = OrderedDict()

    def __call__(self, args: dict[str, Any]) -> str:
        key = (str(args["source"]), str(args.get("bos", "")), str(args.get("eos", "")))
        try:
            template = self._template(key)
        except ChatTemplateError as exc:
            raise Refused(str(exc), "chat_template_error", "chat_template") from None
        except (RecursionError, MemoryError) as exc:
            raise Refused(f"the chat template is too complex to compile ({type(exc).__name__})",
                          "chat_template_too_complex", "chat_template") from None  # fmt: skip
        extra = args.get("extra") or {}
        try:
            return template.render(args["messages"], bool(args["add_generation_prompt"]), **extra)
        except ChatTemplateError as exc:
            raise Refused(str(exc), "chat_template_error") from None
        except (RecursionError, MemoryError) as exc:
            raise Refused(f"the chat template needed too much to render ({type(exc).__name__})",
                          "chat_template_too_complex") from None  # fmt: skip

    def _template(self, key: tuple[str, str, str]) -> ChatTemplate:
        template = self.compiled.pop(key, None) or ChatTemplate(*key)
        self.compiled[key] = template
        while len(self.compiled) > TEMPLATES_KEPT:
            self.compiled.popitem(last=False)
        return template


def answer(job: Callable[[dict[str, Any]], Any], args: Any) -> dict[str, Any]:
    if not isinstance(args, dict):
        return {"error": "a job's arguments must be a map", "code": "internal"}
    try:
        return {"ok": job(args)}
    except Refused as exc:
        return {"error": str(exc), "code": exc.code, "param": exc.param}
    except Exception:  # noqa: BLE001 - this job fails, the child goes on
        log.exception("a contained job failed")
        return {"error": "the job failed", "code": "internal"}


def die_with(parent: int) -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass  # not Linux: the closed pipe still ends this process
    if os.getppid() != parent:  # the router died before prctl took effect
        os._exit(1)


def bound_memory(headroom: int) -> None:
    """RLIMIT_DATA at what this process holds now plus headroom (Linux counts heap and private
    mappings in it)."""
    try:
        with open("/proc/self/status") as fh:
            fields = dict(line.split(":", 1) for line in fh if ":" in line)
        now = int(fields["VmData"].split()[0]) * 1024
        _, hard = resource.getrlimit(resource.RLIMIT_DATA)
        limit = now + headroom
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
    except (OSError, KeyError, ValueError) as exc:
        log.warning("cannot bound this process's memory: %s", exc)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m router.contained.child")
    p.add_argument("--parent", type=int, required=True)
    p.add_argument("--tokenizer", help="the model's tokenizer: grammars are checked against it")
    p.add_argument("--vocab-size", type=int, default=0)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s contained[%(process)d] "
                        "%(levelname)s %(message)s")  # fmt: skip
    die_with(args.parent)
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # whatever else writes to stdout lands in the log, not in a frame
    inp = sys.stdin.buffer
    vocabulary = None
    if args.tokenizer:
        from splitserve.tokenizers import load_tokenizer

        vocabulary = grammar_tokenizer(load_tokenizer(args.tokenizer), args.vocab_size)
    jobs = {"grammar": GrammarJobs(vocabulary), "template": TemplateJobs()}
    bound_memory(MEMORY_HEADROOM_BYTES)
    frames.write(out, {"ready": True})
    while True:
        try:
            frame = frames.read(inp)
        except EOFError:
            return 0
        job = jobs.get(frame.get("job"))
        if job is None:
            reply = {"error": f"no job {frame.get('job')!r}", "code": "internal"}
        else:
            reply = answer(job, frame.get("args"))
        try:
            body = frames.pack(reply)
        except (ValueError, TypeError, OverflowError) as exc:  # e.g. a lone surrogate in a text
            body = frames.pack({"error": f"its result cannot be sent back: {exc}",
                                "code": "unsendable"})  # fmt: skip
        out.write(body)
        out.flush()


if __name__ == "__main__":
    sys.exit(main())
