"""The grammar and template work of a request, run in the router's contained children
(router/contained/), and its outcome as the HTTP answer:

- refused by the child (the grammar engine's or the template's own error): 400 naming the field;
- the child crashed on it (a native stack overflow) or it passed its time limit: 400,
  grammar_too_complex / chat_template_too_complex;
- every child busy and too many jobs waiting: 429; no child could be started: 503.

Compiled grammars are kept (a few hundred, each small) by their spec: an application sends the
same response_format with every request, and compiles it once.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from router.contained.pool import ContainedPool, JobKilled, JobRefused, PoolBusy, PoolUnavailable
from router.http.errors import APIError
from router.requests import NotReady, Overloaded
from splitserve.grammar.specs import GrammarSpec

# compiling a schema and computing its first mask takes milliseconds; rendering a chat template
# too. Both limits are far beyond that, and far below what would hold up the requests waiting.
GRAMMAR_LIMIT_S = 5.0
TEMPLATE_LIMIT_S = 2.0
GRAMMARS_KEPT = 256
KEPT_GRAMMAR_CHARS = 64 << 10  # a larger spec or grammar is compiled each time, not kept


@dataclass(frozen=True)
class RenderJob:
    """A chat template rendering: the template's source with its bos and eos texts, and what it
    renders (messages and extra variables as the template sees them)."""

    source: str
    bos: str
    eos: str
    messages: list[dict[str, Any]]
    add_generation_prompt: bool
    extra: dict[str, Any]
    own: bool  # the request's own template (its errors name chat_template), or the model's

    def args(self) -> dict[str, Any]:
        return {"source": self.source, "bos": self.bos, "eos": self.eos,
                "messages": self.messages, "add_generation_prompt": self.add_generation_prompt,
                "extra": self.extra}  # fmt: skip


class ContainedWork:
    def __init__(self, pool: ContainedPool):
        self.pool = pool
        self.grammars: OrderedDict[GrammarSpec, str] = OrderedDict()

    async def grammar(self, spec: GrammarSpec, param: str) -> str:
        """The serialized grammar of a spec already within bounds (specs.py)."""
        kept = self.grammars.get(spec)
        if kept is not None:
            self.grammars.move_to_end(spec)
            return kept
        args = {"kind": spec.kind, "text": spec.text}
        grammar = await self._run("grammar", args, GRAMMAR_LIMIT_S, param, "grammar")
        if len(spec.text) + len(grammar) <= KEPT_GRAMMAR_CHARS:
            self.grammars[spec] = grammar
            while len(self.grammars) > GRAMMARS_KEPT:
                self.grammars.popitem(last=False)
        return grammar

    async def render(self, job: RenderJob) -> str:
        param = "chat_template" if job.own else "messages"
        return await self._run("template", job.args(), TEMPLATE_LIMIT_S, param, "chat_template")

    async def _run(self, job: str, args: dict[str, Any], limit_s: float, param: str,
                   what: str) -> Any:  # fmt: skip
        try:
            return await self.pool.run(job, args, limit_s)
        except JobRefused as exc:
            raise APIError(400, f"{exc.param or param}: {exc}", param=exc.param or param,
                           code=exc.code) from None  # fmt: skip
        except JobKilled as exc:
            raise APIError(400, f"{param}: too complex: {exc}", param=param,
                           code=f"{what}_too_complex") from None  # fmt: skip
        except (ValueError, TypeError, OverflowError) as exc:  # not MessagePack: a huge integer
            raise APIError(400, f"{param}: a value cannot be passed on ({exc})", param=param,
                           code="invalid_value") from None  # fmt: skip
        except PoolBusy:
            raise Overloaded("too many grammars and chat templates are waiting to be processed;"
                             " retry later") from None  # fmt: skip
        except PoolUnavailable:
            raise NotReady("grammars and chat templates cannot be processed now (see the"
                           " server's log); retry later") from None  # fmt: skip

    async def close(self) -> None:
        await self.pool.close()
