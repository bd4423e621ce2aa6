"""Where a model's chat template comes from, in the order the first one found wins:

1. a file the operator names (`--chat-template FILE`, model.chat_template in the cluster file);
2. a checkpoint folder's chat_template.jinja (what current transformers writes);
3. its tokenizer_config.json's chat_template (a string, or a list of named templates);
4. a GGUF file's tokenizer.chat_template metadata.

2-4 are the tokenizer loaders' (hf_tokenizer.py, sentencepiece_tokenizer.py, gguf_tokenizer.py);
this module applies 1 over them.
"""

from __future__ import annotations

from splitserve.tokenizers.base import Tokenizer
from splitserve.tokenizers.chat_template import ChatTemplate, ChatTemplateError

MAX_TEMPLATE_BYTES = 1 << 20


def read_template_file(path: str) -> str:
    """The file's text; ValueError (a start-up error) when it is missing, too large or not
    UTF-8."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_TEMPLATE_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"chat template {path}: {exc.strerror}") from None
    if len(raw) > MAX_TEMPLATE_BYTES:
        raise ValueError(f"chat template {path}: larger than {MAX_TEMPLATE_BYTES} bytes")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"chat template {path}: not UTF-8") from None


def use_template_file(tokenizer: Tokenizer, path: str) -> None:
    """Replace the tokenizer's chat template with the file's (nothing when path is empty);
    ValueError if it cannot be read or does not compile."""
    if not path:
        return
    source = read_template_file(path)
    current = tokenizer.chat_template
    try:
        if current is not None:
            tokenizer.chat_template = current.with_source(source)
        else:
            tokenizer.chat_template = ChatTemplate(source, *_bos_eos_texts(tokenizer))
    except ChatTemplateError as exc:
        raise ValueError(f"chat template {path}: {exc}") from None


def _bos_eos_texts(tokenizer: Tokenizer) -> tuple[str, str]:
    pieces = tokenizer.token_table().pieces
    bos = tokenizer.bos_id
    eos = min(tokenizer.eos_ids, default=None)
    text = lambda i: pieces[i].decode("utf-8", "replace") if i is not None else ""  # noqa: E731
    return text(bos), text(eos)
