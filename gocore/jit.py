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
import numpy as np
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


# ---------------------------------------------------------------------------------------------
# Per-game steps: declared once, run on either target
# ---------------------------------------------------------------------------------------------


class Step:
    """One game's share of a batched call, declared once with `per_game`. From it come:
    - `kernel`: the step itself, compiled as a `kernel` (inlined into what runs it), which
      gocore.cuda compiles again as a CUDA device function as it does every kernel;
    - `over(*args, start, stop)`: the CPU driver, the step for each game in [start, stop),
      which `CPU.run` spreads over cores with `over_games`;
    - the CUDA entry `entry(*args, games)`, a thread a game, which gocore.cuda makes for every
      declared step (`gocore.cuda.ENTRIES`) and its `GPU.run` launches.
    A batched function written over `on` (`CPU` here, gocore.cuda's `GPU`) runs it on either:
    `on.run(step, games, *args)`."""

    def __init__(self, name: str, fn, capped: bool):
        self.name = name
        self.kernel = kernel(fn)
        self.params = tuple(fn.__code__.co_varnames[1 : fn.__code__.co_argcount])
        self.capped = capped  # the CUDA entry takes the encoder's register cap (gocore.cuda)
        where = {"step": self.kernel, "__name__": fn.__module__}
        self.over = driver(self.source("cpu", fn.__code__.co_filename, where))

    def source(self, target: str, filename: str, namespace: dict):
        """The function that runs the step over games on `target` ("cpu": over [start, stop);
        "cuda": game cuda.grid(1) of `games`), made from source text in `namespace` (which
        holds the step as `step`, `cuda` for the CUDA entry, and `__name__`, the module whose
        globals numba gives the function when it loads it from its on-disk cache). `filename`
        is the file that numba's on-disk caches are kept against: it must exist."""
        args = ", ".join(self.params)
        if target == "cpu":
            name = f"_{self.name}_range"
            text = (
                f"def {name}({args}, start, stop):\n"
                f"    for g in range(start, stop):\n"
                f"        step(g, {args})\n"
            )
        else:
            name = f"_{self.name}_entry"
            text = (
                f"def {name}({args}, games):\n"
                f"    g = cuda.grid(1)\n"
                f"    if g < games:\n"
                f"        step(g, {args})\n"
            )
        exec(compile(text, filename, "exec"), namespace)  # noqa: S102 - our own text
        return namespace[name]


# Every declared step by name, in order.
STEPS: dict[str, Step] = {}


def per_game(name: str, *, capped: bool = False):
    """Declare a per-game step `fn(g, *args)`: it does game g's part of a batched call (g the
    game, or any other index the call runs over) with the call's arguments, outputs among them.
    The one place a batched kernel is wired to both targets: see `Step`."""

    def declare(fn) -> Step:
        if name in STEPS:
            raise ValueError(f"a per-game step named {name!r} is declared twice")
        STEPS[name] = step = Step(name, fn, capped)
        return step

    return declare


class _Cpu:
    """The CPU's side of a batched function written over `on`: numpy arrays, steps spread
    over cores. gocore.cuda's `GPU` answers the same calls on the GPU."""

    name = "cpu"

    @staticmethod
    def run(step: Step, games: int, *args, threads: int | None = None) -> None:
        over_games(step.over, games, *args, threads=threads)

    @staticmethod
    def array(x, dtype):
        """An argument for a step on this target (the same array where it already is one)."""
        return np.ascontiguousarray(x, dtype)

    @staticmethod
    def mask(which, games: int):
        """[games] bool for a step from a bool or a [games] host mask."""
        return np.ascontiguousarray(np.broadcast_to(which, (games,)), np.bool_)

    @staticmethod
    def output(shape, dtype):
        """An array a step writes (zeros here; the GPU's are left as they come)."""
        return np.zeros(shape, dtype)

    @staticmethod
    def buffer(x):
        """A buffer the caller gave for a step to write into: used as it is."""
        return x

    @staticmethod
    def host(x) -> np.ndarray:
        return np.asarray(x)

    # Threads of a warp do not run in lockstep here: no grouping of rows by their work.
    lockstep = False

    @staticmethod
    def select_scratch(leaves):
        """The select step's [B, A] arrays for these leaf boards: no dead stones (zeros, only
        read) and the owners a terminal leaf's scoring writes."""
        return np.zeros(leaves.color.shape, np.bool_), np.zeros(leaves.color.shape, np.int8)


CPU = _Cpu()

# Every batched function written once over `on` (see `Step`), by name: gocore.device gives
# each to both backends, bound to its target.
BATCHED: dict[str, object] = {}


def batched(fn):
    """Register a batched function `fn(..., *, on=CPU)` for both backends (gocore.device)."""
    if fn.__name__ in BATCHED:
        raise ValueError(f"a batched function named {fn.__name__!r} is registered twice")
    BATCHED[fn.__name__] = fn
    return fn
