"""python -m decode_worker --config FILE [--index K]: one decode worker process."""

import sys

from decode_worker.worker import DecodeWorker
from splitserve.role_main import run_role

if __name__ == "__main__":
    sys.exit(run_role("decode", DecodeWorker))
