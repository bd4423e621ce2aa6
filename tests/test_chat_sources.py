"""Chat templates from every place a checkpoint keeps them: GGUF metadata (the default model's;
tests/test_tokenizers.py), tokenizer_config.json, chat_template.jinja (what current
transformers writes), and a file the operator names (--chat-template, model.chat_template),
which a running stack renders chats with."""

from __future__ import annotations

import json
import os
import shutil

import httpx
import pytest

from splitserve.cli import add_serve_args, config_from_args
from splitserve.tokenizers import load_tokenizer
from splitserve.tokenizers.chat_sources import use_template_file
from tests.http_stack import http_stack

MESSAGES = [{"role": "user", "content": "hi"}]
JINJA = "{% for m in messages %}[{{ m.role }}: {{ m.content }}]{% endfor %}{{ eos_token }}"


def folder_with(tmp_path, tokenizer_512, config: dict, jinja: str | None) -> str:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    shutil.copy(tokenizer_512, folder / "tokenizer.json")
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "<|endoftext|>", **config}))  # fmt: skip
    if jinja is not None:
        (folder / "chat_template.jinja").write_text(jinja)
    return str(folder)


def test_a_folder_s_chat_template_jinja_is_its_template(tmp_path, tokenizer_512):
    tok = load_tokenizer(folder_with(tmp_path, tokenizer_512, {}, JINJA))
    assert tok.apply_chat_template(MESSAGES) == "[user: hi]<|endoftext|>"


def test_chat_template_jinja_wins_over_tokenizer_config(tmp_path, tokenizer_512):
    config = {"chat_template": "{{ 'from the config' }}"}
    tok = load_tokenizer(folder_with(tmp_path, tokenizer_512, config, JINJA))
    assert tok.apply_chat_template(MESSAGES).startswith("[user: hi]")


def test_tokenizer_config_s_named_templates(tmp_path, tokenizer_512):
    config = {"chat_template": [{"name": "tool_use", "template": "{{ 'tools' }}"},
                                {"name": "default", "template": "{{ 'default' }}"}]}  # fmt: skip
    tok = load_tokenizer(folder_with(tmp_path, tokenizer_512, config, None))
    assert tok.apply_chat_template(MESSAGES) == "default"


def test_a_template_file_replaces_the_model_s_own(tmp_path, tokenizer_512):
    tok = load_tokenizer(tokenizer_512)
    path = tmp_path / "mine.jinja"
    path.write_text(JINJA)
    use_template_file(tok, str(path))
    assert tok.apply_chat_template(MESSAGES) == "[user: hi]<|endoftext|>"
    use_template_file(tok, "")  # none named: nothing changes
    assert tok.apply_chat_template(MESSAGES).startswith("[user: hi]")


@pytest.mark.parametrize("content, error", [
    (None, "No such file"),
    ("{% for %}", "does not compile"),
    (b"\xff\xfe", "not UTF-8"),
])  # fmt: skip
def test_a_bad_template_file_is_a_start_up_error(tmp_path, tokenizer_512, content, error):
    path = tmp_path / "bad.jinja"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(ValueError, match=error):
        use_template_file(load_tokenizer(tokenizer_512), str(path))


def test_the_serve_flag_sets_the_config_key(tmp_path):
    import argparse

    parser = argparse.ArgumentParser()
    add_serve_args(parser)
    args = parser.parse_args(["--engine", "fake", "--tokenizer", "t", "--chat-template", "x.j"])
    assert config_from_args(args, lambda: str(tmp_path)).model.chat_template == "x.j"


@pytest.mark.timeout(120)
def test_a_running_stack_renders_chats_with_the_named_file(tmp_path, tokenizer_512):
    path = tmp_path / "served.jinja"
    path.write_text(JINJA)
    with http_stack(tokenizer_512, model={"chat_template": str(path)}) as s:
        r = httpx.post(f"{s.url}/tokenize", json={"messages": MESSAGES}, timeout=30)
        tokens = r.json()["tokens"]
        text = httpx.post(f"{s.url}/detokenize", json={"tokens": tokens}, timeout=30).json()
    assert text["prompt"] == "[user: hi]<|endoftext|>"
    assert os.path.isfile(path)
