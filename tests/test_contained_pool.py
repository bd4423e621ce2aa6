"""The router's contained children (router/contained/): real child processes, driven as the
router drives them (on uvloop). A job that crashes its child or passes its time limit fails
alone, and the next job gets a fresh child; a caller that goes away never leaves a child with
half a job; a full pool says so; what the grammar bounds let through compiles in the child's
small stack, and a template that grows without bound meets the memory bound."""

from __future__ import annotations

import asyncio
import json

import pytest
import uvloop

from router.contained.pool import (
    ContainedPool,
    JobKilled,
    JobRefused,
    PoolBusy,
    PoolUnavailable,
)
from splitserve.grammar import bounds, specs
from tests.hostile_grammars import lark_chain, ref_chain

pytestmark = pytest.mark.timeout(180)

DEADLINE_S = 120.0
# a template whose loops run for hours: only the time limit ends it
ENDLESS = ("{% for i in range(100000) %}{% for j in range(100000) %}{% for k in range(100000) %}"
           "{% endfor %}{% endfor %}{% endfor %}")  # fmt: skip
ECHO = "{% for m in messages %}{{ m.content }}{% endfor %}"


def run(coro):
    async def bounded():
        return await asyncio.wait_for(coro, DEADLINE_S)

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(bounded())


def pool_for(children: int = 1, max_waiting: int = 8) -> ContainedPool:
    return ContainedPool(children, max_waiting)


def grammar_job(spec: specs.GrammarSpec) -> dict:
    return {"kind": spec.kind, "text": spec.text}


def template_job(source: str, content: str = "") -> dict:
    return {"source": source, "bos": "", "eos": "", "add_generation_prompt": True, "extra": {},
            "messages": [{"role": "user", "content": content}]}  # fmt: skip


def test_a_grammar_that_crashes_the_compiler_fails_alone_and_the_next_job_is_served():
    async def body():
        pool = pool_for()
        try:
            fine = grammar_job(specs.json_spec({"type": "integer"}))
            assert await pool.run("grammar", fine, 30)
            first = pool.pids()
            # past the rule bound, given to the child directly: the engine overflows its stack
            with pytest.raises(JobKilled, match="SIGSEGV"):
                await pool.run("grammar", {"kind": "lark", "text": lark_chain(3000)}, 30)
            assert pool.pids() == []  # that child is gone ...
            assert await pool.run("grammar", fine, 30)  # ... and a fresh one serves
            assert pool.pids() != first
            assert pool.ended["crashed"] == 1 and pool.ended["ok"] == 2
        finally:
            await pool.close()

    run(body())


def test_a_template_past_its_time_limit_is_killed_and_the_next_job_is_served():
    async def body():
        pool = pool_for()
        try:
            with pytest.raises(JobKilled, match="longer than 0.5 s"):
                await pool.run("template", template_job(ENDLESS), 0.5)
            assert await pool.run("template", template_job(ECHO, "after"), 30) == "after"
            assert pool.ended["time_limit"] == 1
        finally:
            await pool.close()

    run(body())


def test_a_caller_that_goes_away_leaves_the_child_in_step():
    """The job of a caller that was cancelled (a client gone) runs to its end on the child; the
    next job gets its own answer, not the abandoned one's."""

    async def body():
        pool = pool_for()
        try:
            slow = "{% for i in range(3000) %}{% for j in range(300) %}{% endfor %}{% endfor %}x"
            caller = asyncio.ensure_future(pool.run("template", template_job(slow), 60))
            while pool.running() == 0:
                await asyncio.sleep(0.01)
            caller.cancel()
            with pytest.raises(asyncio.CancelledError):
                await caller
            assert await pool.run("template", template_job(ECHO, "mine"), 60) == "mine"
            assert pool.ended["ok"] == 2  # the abandoned job ended too, on the same child
        finally:
            await pool.close()

    run(body())


def test_a_full_pool_turns_a_job_away_and_closing_it_ends_its_jobs():
    async def body():
        pool = pool_for(children=1, max_waiting=1)
        try:
            busy = asyncio.ensure_future(pool.run("template", template_job(ENDLESS), 60))
            waiting = asyncio.ensure_future(pool.run("template", template_job(ECHO, "w"), 60))
            while pool.running() == 0 or pool.waiting == 0:
                await asyncio.sleep(0.01)
            with pytest.raises(PoolBusy):
                await pool.run("template", template_job(ECHO), 60)
            assert pool.ended["busy"] == 1
            await pool.close()  # the router stops: the endless job's child is killed
            with pytest.raises((JobKilled, PoolUnavailable)):
                await busy
            with pytest.raises(PoolUnavailable):
                await waiting  # no child starts once closed
        finally:
            await pool.close()

    run(body())


def test_what_the_bounds_let_through_compiles_in_the_child():
    """The longest chains the cheap bounds accept fit the child's small stack (which a worker's
    has four times over): the bounds refuse what would crash, not less."""

    async def body():
        pool = pool_for()
        try:
            rules = specs.lark_spec(lark_chain(bounds.MAX_GRAMMAR_RULES - 2))
            assert await pool.run("grammar", grammar_job(rules), 30)
            refs = specs.json_spec(ref_chain(bounds.MAX_REF_CHAIN - 1))
            assert await pool.run("grammar", grammar_job(refs), 30)
            with pytest.raises(JobRefused, match="chain of 3001") as refused:
                await pool.run("grammar", grammar_job(specs.json_spec(ref_chain(3000))), 30)
            assert refused.value.code == "grammar_too_complex"
            assert pool.ended["crashed"] == 0
        finally:
            await pool.close()

    run(body())


def test_a_template_that_doubles_a_string_meets_the_memory_bound():
    doubling = ("{% set ns = namespace(s='x') %}{% for i in range(48) %}"
                "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}")  # fmt: skip

    async def body():
        pool = pool_for()
        try:
            with pytest.raises(JobRefused, match="MemoryError") as refused:
                await pool.run("template", template_job(doubling), 60)
            assert refused.value.code == "chat_template_too_complex"
            assert await pool.run("template", template_job(ECHO, "ok"), 30) == "ok"
        finally:
            await pool.close()

    run(body())


def test_a_refused_grammar_names_the_engine_reason():
    async def body():
        pool = pool_for()
        try:
            with pytest.raises(JobRefused, match="nope") as refused:
                await pool.run("grammar", {"kind": "lark", "text": "start: nope"}, 30)
            assert refused.value.code == "invalid_grammar"
            schema = json.dumps({"type": "intger"})
            with pytest.raises(JobRefused, match="intger"):
                await pool.run("grammar", {"kind": "json", "text": schema}, 30)
        finally:
            await pool.close()

    run(body())
