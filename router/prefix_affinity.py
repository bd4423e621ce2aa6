"""Which prefill worker likely holds a prompt's beginning, for prefix-aware placement.

The router records, for every block key (splitserve/prefix_blocks.py) of every prompt it sends to
a prefill worker, that the worker has seen it. A prompt's likely cached tokens at a worker are its
longest run of leading blocks recorded there. The record is the router's, not the cache's: a
worker may have evicted a block since, so the record guides placement and never promises a hit
(the worker's own lookup decides). Bounded: the least recently recorded keys are forgotten first;
a worker that restarts (its cache gone) is forgotten at once.
"""

from __future__ import annotations

from collections import OrderedDict

MAX_KEYS = 1 << 17  # about 20 MiB of record at most


class PrefixAffinity:
    def __init__(self, block_tokens: int, max_keys: int = MAX_KEYS):
        self.block_tokens = block_tokens
        self.max_keys = max_keys
        self._where: OrderedDict[bytes, set[int]] = OrderedDict()

    def cached_tokens(self, keys: list[bytes], worker: int) -> int:
        """Prompt tokens the worker likely has cached: its longest recorded run of leading keys."""
        run = 0
        for key in keys:
            workers = self._where.get(key)
            if workers is None or worker not in workers:
                break
            run += 1
        return run * self.block_tokens

    def record(self, keys: list[bytes], worker: int) -> None:
        """The prompt of these keys goes to this worker (which will cache its blocks)."""
        for key in keys:
            workers = self._where.get(key)
            if workers is None:
                self._where[key] = {worker}
            else:
                workers.add(worker)
                self._where.move_to_end(key)
        while len(self._where) > self.max_keys:
            self._where.popitem(last=False)

    def forget_worker(self, worker: int) -> None:
        """The worker restarted: its cache is empty."""
        for key in [k for k, ws in self._where.items() if worker in ws]:
            workers = self._where[key]
            workers.discard(worker)
            if not workers:
                del self._where[key]
