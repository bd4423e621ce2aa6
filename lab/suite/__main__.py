"""`python -m lab.suite`: run the suite's sections and write the document; exit status 1 when
any section recorded an error."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time

from lab import suite
from lab.suite import REPO
from lab.suite.cpus import Cpus
from lab.suite.document import SuiteRun, write_doc
from lab.suite.results import SectionResult
from lab.suite.running import run_section
from lab.suite.sections import sections

log = logging.getLogger("lab.suite")


def configure_logging() -> None:
    """The suite's own progress lines on stderr; the libraries' loggers stay quiet."""
    if log.handlers:  # main() called again in this process
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("[suite %(asctime)s] %(message)s", "%H:%M:%S"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.suite", description=suite.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--quick", action="store_true", help="small sizes: a few minutes")
    p.add_argument("--sections", default="tiny,detok,fake,smollm2",
                   help="comma-separated subset of: tiny, detok, fake, smollm2")
    p.add_argument("--doc", default=os.path.join(REPO, "lab", "suite.md"))
    p.add_argument("--assets", default=os.path.join(REPO, "lab", "results", "suite"),
                   help="where the PNG plots and JSON records go")
    p.add_argument("--work-dir", help="stack configs and logs (default: a temp dir)")
    args = p.parse_args(argv)
    configure_logging()
    run = SuiteRun(args.quick, os.getloadavg(), time.monotonic(), Cpus.of_this_process())
    work_dir = args.work_dir or tempfile.mkdtemp(prefix="splitserve-suite-")
    os.makedirs(work_dir, exist_ok=True)
    log.info("logs and configs in %s", work_dir)
    wanted = [k.strip() for k in args.sections.split(",") if k.strip()]

    from splitserve.tokenizers.synthetic import build_synthetic_tokenizer

    tok8000 = build_synthetic_tokenizer(
        os.path.join(os.path.expanduser("~"), ".cache", "splitserve", "tok8000"), 8000
    )
    smollm2 = None
    if "smollm2" in wanted:
        try:
            from splitserve.engine.model.default_model import default_model_path

            smollm2 = default_model_path()
        except FileNotFoundError as exc:
            log.info("smollm2 skipped: %s", exc)
    results: dict[str, SectionResult] = {}
    for s in sections(args.quick, tok8000, smollm2):
        if s.key in wanted:
            log.info("section %s: %s", s.key, s.title)
            results[s.key] = run_section(s, work_dir, run.cpus)
    write_doc(args.doc, args.assets, run, results)
    minutes = (time.monotonic() - run.started) / 60
    log.info("wrote %s and %s/ in %.1f min", args.doc, args.assets, minutes)
    return 1 if any(r.errors for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
