"""The compile decorators every gocore kernel goes through, and the helper that spreads a batch
over cores, so the CPU/CUDA choice lives in one place.

Kernels are plain Python functions over arrays: no allocation, no recursion, no exceptions, no
dicts, no numpy calls beyond indexing and scalar casts. That keeps one source compilable with
`numba.njit` here and as `numba.cuda` device functions later.

Why these options (each measured on 9x9 random games, see `tengen bench rules`):
- `_nrt=False`: kernels never allocate, so they need none of numba's reference-counting
  runtime; with it, every call passing the board batch (a named tuple of ~20 arrays) paid an
  incref and a decref per array, ~170 ns a call against ~1 ns without. A kernel that tried to
  allocate would fail to compile, which keeps them honest.
- `inline="always"`: a call that is not inlined passes that tuple by value (~1 KB pushed on the
  stack); inlining every kernel took random 9x9 games from 19k to 44k per second.
- Batched drivers are serial loops over a range of games, spread over cores by `over_games`
  with threads (they release the GIL). Numba's `prange` is not used: inside a parfor, writes
  through a named tuple's arrays from inlined code are lost (numba 0.68).

Numba's on-disk cache is keyed on each function's own source file: after editing this file,
run `make clean-cache`, or machine code compiled with the old options is reused.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numba

# A per-game kernel: operates on one row (game) of the batched arrays.
kernel = numba.njit(cache=True, nogil=True, _nrt=False, inline="always")

# A driver: a loop over games [start, stop) or any other entry point called from Python.
driver = numba.njit(cache=True, nogil=True, _nrt=False)

_pool: ThreadPoolExecutor | None = None
_pool_threads = 0


def cpu_threads() -> int:
    """Threads for batched drivers: TENGEN_THREADS, else the cores this process may use."""
    env = os.environ.get("TENGEN_THREADS")
    if env:
        return max(1, int(env))
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def over_games(fn, games: int, *args, threads: int | None = None) -> None:
    """Run `fn(*args, start, stop)` over [0, games) split into one contiguous range per thread."""
    global _pool, _pool_threads
    threads = min(threads or cpu_threads(), games)
    if threads <= 1:
        fn(*args, 0, games)
        return
    if _pool is None or _pool_threads < threads:
        _pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="gocore")
        _pool_threads = threads
    bounds = [games * i // threads for i in range(threads + 1)]
    futures = [_pool.submit(fn, *args, bounds[i], bounds[i + 1]) for i in range(threads)]
    for f in futures:
        f.result()
