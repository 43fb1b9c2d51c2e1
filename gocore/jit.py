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
- `error_model="numpy"`: integer division by zero gives 0 instead of raising, so no kernel
  carries a hidden exception path (kernels never divide by zero anyway).
- Batched drivers are serial loops over a range of games, spread over cores by `over_games`
  with threads (they release the GIL). Numba's `prange` is not used: inside a parfor, writes
  through a named tuple's arrays from inlined code are lost (numba 0.68).

The on-disk cache: numba decides whether a cached function is stale from its own source file
only, but drivers inline kernels from other files, so an edit to board.py would leave
playout.py's cached drivers running the old rules. The cache therefore lives in a folder named
by a digest of the kernel sources (the gocore modules that compile with these decorators and
the gocore modules they import): any edit to them compiles everything afresh.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numba
from numba.core import event


def kernel_sources() -> list[Path]:
    """This file, every gocore module that compiles kernels, and what they import from gocore."""
    here = Path(__file__).parent
    texts = {path.stem: path.read_text() for path in here.glob("*.py")}
    wanted = {"jit"} | {name for name, text in texts.items() if "gocore.jit import" in text}
    todo = list(wanted)
    while todo:
        # Both `from gocore.board import x` and `from gocore import board`.
        text = texts[todo.pop()]
        deps = re.findall(r"from gocore\.(\w+) import", text)
        deps += re.findall(r"from gocore import (\w+)", text)
        for dep in deps:
            if dep in texts and dep not in wanted:
                wanted.add(dep)
                todo.append(dep)
    return sorted(here / f"{name}.py" for name in wanted)


def _cache_dir() -> Path:
    digest = hashlib.sha256()
    for path in kernel_sources():
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    base = os.environ.get("NUMBA_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tengen", "numba"
    )
    return Path(base) / f"gocore-{digest.hexdigest()[:16]}"


CACHE_DIR = _cache_dir()
# Read by numba when each cached function below is decorated. (This is numba's global cache
# setting; nothing else in tengen caches numba code.)
numba.config.CACHE_DIR = str(CACHE_DIR)

# Every function compiled by `kernel` or `routine`, in order: gocore.cuda compiles the same
# Python functions again as CUDA device functions.
KERNELS: list = []

_inlined = numba.njit(cache=True, nogil=True, _nrt=False, inline="always", error_model="numpy")
_called = numba.njit(cache=True, nogil=True, _nrt=False, error_model="numpy")


def kernel(fn):
    """A per-game kernel: operates on one row (game) of the batched arrays; inlined into its
    callers (numba IR inlining), so it should be small or called from few places."""
    dispatcher = _inlined(fn)
    KERNELS.append(dispatcher)
    return dispatcher


def routine(fn):
    """A per-game kernel too large to inline everywhere (the ladder reader, Benson, the
    encoder): called, not inlined. Nesting inlined kernels several levels deep multiplies the IR
    numba must compile (the encoder took 20 GB and minutes that way). A routine called in a
    hot loop takes rows of arrays rather than the batch tuple, which would be copied per call.
    """
    dispatcher = _called(fn)
    KERNELS.append(dispatcher)
    return dispatcher


class _CompileLog(event.Listener):
    """Logs each outermost numba compile (what it calls included) that took `min_seconds` or
    more: where a fresh process's first seconds go. (Compiles hold numba's global lock: one at
    a time, so one stack serves every thread.)"""

    def __init__(self, min_seconds: float):
        self.min_seconds = min_seconds
        self.started: list[float] = []

    def on_start(self, e) -> None:
        self.started.append(time.perf_counter())

    def on_end(self, e) -> None:
        if not self.started:  # registered while a compile was under way
            return
        seconds = time.perf_counter() - self.started.pop()
        if not self.started and seconds >= self.min_seconds:
            name = getattr(e.data.get("dispatcher"), "__qualname__", None) or "?"
            logging.getLogger(__name__).info("numba compiled %s in %.1f s", name, seconds)


_compile_log: _CompileLog | None = None


def log_compiles(min_seconds: float = 1.0) -> None:
    """Log (logger gocore.jit, INFO) every CPU compile of min_seconds or more from now on in
    this process; a function loaded from the on-disk cache does not compile and is not logged."""
    global _compile_log
    if _compile_log is None:
        _compile_log = _CompileLog(min_seconds)
        event.register("numba:compile", _compile_log)
    _compile_log.min_seconds = min_seconds


# A driver: a loop over games [start, stop) or any other entry point called from Python.
driver = numba.njit(cache=True, nogil=True, _nrt=False, error_model="numpy")

_pool: ThreadPoolExecutor | None = None
_pool_threads = 0
_pool_lock = threading.Lock()


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
    with _pool_lock:
        if _pool is None or _pool_threads < threads:
            _pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="gocore")
            _pool_threads = threads
        pool = _pool
    bounds = [games * i // threads for i in range(threads + 1)]
    futures = [pool.submit(fn, *args, bounds[i], bounds[i + 1]) for i in range(threads)]
    for f in futures:
        f.result()
