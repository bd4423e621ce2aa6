"""python -m prefill_worker --config FILE [--index K]: one prefill worker process."""

import sys

from prefill_worker.worker import PrefillWorker
from splitserve.role_main import run_role

if __name__ == "__main__":
    sys.exit(run_role("prefill", PrefillWorker))
