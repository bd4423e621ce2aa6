"""python -m lab.versus install NAME | run --server ... (see __init__.py)."""

from __future__ import annotations

import argparse
import json
import sys

from lab.versus.installs import DEFAULT_ROOT, PACKAGES, install, install_llama_server
from lab.versus.run import run_all, table


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.versus")
    ap.add_argument("--root", default=DEFAULT_ROOT, help="where competitor venvs live")
    sub = ap.add_subparsers(dest="cmd", required=True)
    inst = sub.add_parser("install", help="make a competitor's virtual environment")
    inst.add_argument("name", choices=[*sorted(PACKAGES), "llama-server"])
    copy = sub.add_parser("hf-copy", help="a float32 Hugging Face copy of a model (for vLLM)")
    copy.add_argument("out_dir")
    copy.add_argument("--model", default="", help="a GGUF file or model path (default model)")
    run = sub.add_parser("run", help="servers in turn under one load")
    run.add_argument("--server", action="append", required=True,
                     help="splitserve, llama-cpp, vllm=HF_DIR, llama-server=BINARY, or "
                     "LABEL=CLUSTER_FILE "
                     "(repeatable; the first is the ratios' base)")  # fmt: skip
    run.add_argument("--concurrency", type=_ints, default=(1, 16))
    run.add_argument("--num-requests", type=_ints, default=(8, 32))
    run.add_argument("--prompt-tokens", type=int, default=128)
    run.add_argument("--output-tokens", type=int, default=128)
    run.add_argument("--warmup-requests", type=int, default=2)
    run.add_argument("--rounds", type=int, default=2)
    run.add_argument("--port", type=int, default=8100)
    run.add_argument("--ready-timeout", type=float, default=900.0)
    run.add_argument("--log-dir", default="")
    run.add_argument("--out-json", default="")
    run.add_argument("--out-md", default="")
    args = ap.parse_args(argv)
    if args.cmd == "install":
        if args.name == "llama-server":
            return install_llama_server(args.root)
        return install(args.name, args.root)
    if args.cmd == "hf-copy":
        from lab.versus.hf_copy import export
        from splitserve.engine.model.default_model import default_model_path

        print(export(args.model or default_model_path(), args.out_dir))
        return 0
    rows = run_all(args)
    labels = list(dict.fromkeys(s.split("=", 1)[0] for s in args.server))
    text = table(rows, labels)
    print(text)
    if args.out_json:
        with open(args.out_json, "w", encoding="utf-8") as fh:
            json.dump(rows, fh, indent=1)
    if args.out_md:
        with open(args.out_md, "w", encoding="utf-8") as fh:
            fh.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
