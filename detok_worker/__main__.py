"""python -m detok_worker --config FILE [--index K]: one detok worker process."""

import sys

from detok_worker.worker import DetokWorker
from splitserve.role_main import run_role

if __name__ == "__main__":
    sys.exit(run_role("detok", DetokWorker))
