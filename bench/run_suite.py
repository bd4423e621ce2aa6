"""The standard benchmark suite: `.venv/bin/python bench/run_suite.py [--quick] [--sections ...]`
writes lab/suite.md and its plots. The suite lives in splitserve/bench/suite/ (see there);
this is its documented entry point."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from splitserve.bench.suite.__main__ import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
