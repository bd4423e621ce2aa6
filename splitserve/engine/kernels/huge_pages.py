"""The weights on 2 MiB pages.

A decode step reads every weight once (the float32 default model: 538 MB a step); on 4 KiB
pages that stream walks through some 130,000 page translations a step, on 2 MiB pages through
about 270. Linux (6.1 and later) moves a range that is already in memory onto huge pages on
request (madvise MADV_COLLAPSE; madvise(2): independent of the system's transparent-huge-page
settings), so the engine asks for it once its weights are placed: the decode step is a few
percent shorter (lab/benchmarks.md, "The one-stream decode step"). The move itself costs
start-up time (the kernel must find free 2 MiB runs of memory, and compacts it when it has
none).

The matrices are a few MB each, most smaller than two huge pages, and the allocator puts them
next to each other: the ranges are joined first, and the whole huge pages inside each run are
moved (without joining, much of the layers' bytes were left out). Where the kernel or the
platform cannot (older kernels, no THP, not Linux), madvise fails and the weights stay where
they are: the engine works the same, only without the gain.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys
import time
from collections.abc import Iterable

import jax

log = logging.getLogger(__name__)

HUGE_PAGE = 2 << 20
SMALL_PAGE = 4096
_MADV_HUGEPAGE = 14  # also mark the range, so that the pages stay huge after a split
_MADV_COLLAPSE = 25


def _madvise():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    except OSError:
        return None
    fn = libc.madvise
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def whole_pages(address: int, nbytes: int) -> tuple[int, int]:
    """The 2 MiB pages wholly inside [address, address + nbytes): (start, length), length 0
    when there is none (a range's ragged ends stay on small pages)."""
    start = -(-address // HUGE_PAGE) * HUGE_PAGE
    end = (address + nbytes) // HUGE_PAGE * HUGE_PAGE
    return start, max(0, end - start)


def joined(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """(address, nbytes) ranges joined where they touch the same or adjacent 4 KiB pages: the
    allocator puts most of a model's matrices (a few MB each, most smaller than two huge
    pages) next to each other, and only the whole run of them holds whole huge pages. The
    bytes between two joined ranges are on pages one of them holds, so mapped."""
    runs: list[list[int]] = []
    for address, nbytes in sorted(ranges):
        if runs and address // SMALL_PAGE <= -(-runs[-1][1] // SMALL_PAGE):
            runs[-1][1] = max(runs[-1][1], address + nbytes)
        else:
            runs.append([address, address + nbytes])
    return [(a, b - a) for a, b in runs]


def collapse(arrays: Iterable) -> int:
    """Move the CPU buffers of `arrays` (a pytree's leaves: jax arrays) onto huge pages;
    returns the bytes moved (0 where the kernel declines). The arrays' values and addresses
    stay the same: the kernel copies the pages and remaps them."""
    madvise = _madvise()
    if madvise is None:
        return 0
    began = time.perf_counter()
    ranges = []
    for x in jax.block_until_ready(jax.tree.leaves(list(arrays))):  # written before they move
        try:
            ranges.append((x.unsafe_buffer_pointer(), x.nbytes))
        except (AttributeError, RuntimeError, ValueError):  # not one buffer in host memory
            continue
    moved, eligible, refused = 0, 0, None
    for address, nbytes in joined(ranges):
        start, length = whole_pages(address, nbytes)
        if not length:
            continue
        eligible += length
        madvise(start, length, _MADV_HUGEPAGE)
        if madvise(start, length, _MADV_COLLAPSE) == 0:
            moved += length
        elif refused is None:
            refused = ctypes.get_errno()
    took = time.perf_counter() - began
    if not eligible:  # a small model's weights: nothing as large as a huge page
        return 0
    if refused is None:
        log.info("weights on huge pages: %.0f MB in %.1f s", moved / 1e6, took)
    else:
        log.info("weights on huge pages: %.0f of %.0f MB in %.1f s (madvise MADV_COLLAPSE: "
                 "errno %d)", moved / 1e6, eligible / 1e6, took, refused)  # fmt: skip
    return moved
