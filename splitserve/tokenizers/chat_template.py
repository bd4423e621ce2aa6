"""Chat templates: render the model's own Jinja template in a sandbox.

Templates come from GGUF metadata (tokenizer.chat_template), a checkpoint folder's
chat_template.jinja or tokenizer_config.json, or a file the operator names (--chat-template,
model.chat_template; chat_sources.py), or from a request (vLLM's chat_template field, when
the operator allows it). They are untrusted input, so they run in jinja2's
ImmutableSandboxedEnvironment (no attribute access to Python internals, no mutation of the
messages), with the globals that Hugging Face's apply_chat_template provides, and bounded:
repeating a string or list (`'x' * n`) and raising to a power are checked before they run,
and a rendering stops once it passes MAX_RENDERED_CHARS. Time and memory are bounded where a
request's own template runs: in the router's contained child (router/contained/).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from datetime import datetime

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

# a rendered prompt: twice the router's largest request body (a whole chat history, rendered
# with a template's few characters per message, stays well under it)
MAX_RENDERED_CHARS = 16 << 20
MAX_POWER_BITS = 1 << 16  # an integer power of at most this many bits


class ChatTemplateError(ValueError):
    """A chat request the template cannot render (a client error: HTTP 400)."""


class NoChatTemplateError(ChatTemplateError):
    """The model ships no chat template, so chat requests cannot be served."""


# Texts of special tokens that end an assistant turn in common chat formats (llama.cpp marks the
# same ones "end of generation"). Only ids that exist, and are special, are used.
END_OF_TURN_TEXTS = (
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end|>",
    "<end_of_turn>",
    "<|end_of_text|>",
    "<｜end▁of▁sentence｜>",
    "<EOT>",
    "</s>",
)


def end_of_generation_ids(
    explicit: Iterable[int | None], special_id_of: Callable[[str], int | None]
) -> frozenset[int]:
    """The explicit eos ids plus every special end-of-turn token the vocabulary has."""
    ids = {i for i in explicit if i is not None and i >= 0}
    for text in END_OF_TURN_TEXTS:
        token_id = special_id_of(text)
        if token_id is not None:
            ids.add(token_id)
    return frozenset(ids)


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(message)


def _tojson(value, ensure_ascii: bool = False, indent=None, separators=None, sort_keys=False):
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """The sandbox, with `*` and `**` checked first: `'x' * n` (or a list's) and an integer
    power may not outgrow a rendered prompt's bound. (Intercepted operators are also never
    folded into constants when a template compiles.)"""

    intercepted_binops = frozenset({"*", "**"})

    def call_binop(self, context, operator: str, left, right):
        if operator == "*":
            _check_repeat(left, right)
            _check_repeat(right, left)
        elif _is_int(left) and _is_int(right) and right > 0 and abs(left) > 1:
            if right * abs(left).bit_length() > MAX_POWER_BITS:
                raise ChatTemplateError(f"a power over {MAX_POWER_BITS} bits")
        return super().call_binop(context, operator, left, right)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_repeat(seq, times) -> None:
    if isinstance(seq, str | list | tuple) and _is_int(times):
        if len(seq) * times > MAX_RENDERED_CHARS:
            raise ChatTemplateError(f"a repetition over {MAX_RENDERED_CHARS} items")


class ChatTemplate:
    """One model's compiled chat template."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "") -> None:
        env = BoundedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"the model's chat template does not compile: {exc}") from exc
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token

    def with_source(self, source: str) -> ChatTemplate:
        """Another template with this one's bos and eos texts (a request's own, vLLM's
        chat_template field)."""
        return ChatTemplate(source, self.bos_token, self.eos_token)

    def render(self, messages: list[dict], add_generation_prompt: bool = True, **extra) -> str:
        """Render messages ([{"role": ..., "content": ...}, ...]) into the prompt text."""
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise ChatTemplateError("messages must be a list of objects")
        try:
            pieces = self._template.generate(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
                **extra,
            )
            return _bounded_join(pieces)
        except ChatTemplateError:
            raise
        except (jinja2.TemplateError, TypeError, KeyError, AttributeError, ValueError) as exc:
            raise ChatTemplateError(f"the chat template failed on these messages: {exc}") from exc


def _bounded_join(pieces: Iterable[str]) -> str:
    out, size = [], 0
    for piece in pieces:
        size += len(piece)
        if size > MAX_RENDERED_CHARS:
            raise ChatTemplateError(f"the chat template renders over {MAX_RENDERED_CHARS}"
                                    " characters")  # fmt: skip
        out.append(piece)
    return "".join(out)


def render_chat(
    template: ChatTemplate | None, messages: list[dict], add_generation_prompt: bool, **extra
) -> str:
    """Render with the model's template, or fail clearly when the model has none."""
    if template is None:
        raise NoChatTemplateError(
            "this model has no chat template (none in its GGUF metadata, chat_template.jinja or"
            " tokenizer_config.json, and no --chat-template); use the completions endpoint with"
            " a plain prompt"
        )
    return template.render(messages, add_generation_prompt, **extra)
