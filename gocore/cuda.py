"""The Go core on a CUDA GPU: the kernels of gocore.board, playout, features and search,
compiled a second time from the same Python functions as numba-cuda device functions, and
launched one game per thread.

How one source becomes two targets: every function decorated with `gocore.jit.kernel` or
`routine` is recorded. Here each one's Python function is rebuilt over a copy of its module's
globals in which every recorded kernel is replaced by its CUDA twin, and compiled with
`numba.cuda.jit(device=True)`. A kernel calling `legality` thus calls the CPU `legality` on the
CPU and the CUDA `legality` on the GPU, with no change to its source. The entry points
(`ENTRIES`: `_play_entry`, ...), one for each per-game step that gocore.jit.per_game declares,
are written the same way: plain functions over the CPU names, rebuilt with the CUDA namespace
and compiled with `cuda.jit`. The batched functions over them (gocore.search's
`select_all`, ...) are written once over `on`; `GPU` here is what they run on for the GPU.

Needs the optional numba-cuda package (`pip install 'tengen[cuda]'`). Under the CUDA simulator
(`NUMBA_ENABLE_CUDASIM=1`) the same code runs as Python on the CPU, which is how the tests
check it on machines without a GPU. `python -m gocore.cuda --ptx` compiles every entry point
to PTX without a GPU (needs NVVM from the CUDA toolkit wheels).
"""

from __future__ import annotations

import functools
import logging
import os
import re
import sys
import time
import types
import warnings
import weakref
from typing import NamedTuple

import numpy as np

from gocore import board, features, jit, playout, search  # noqa: F401  (registers kernels)
from gocore.board import Boards
from gocore.features import FeatureWork

try:
    from numba import cuda
except ImportError as e:  # pragma: no cover - numba always ships numba.cuda or numba-cuda
    raise ImportError("the CUDA backend needs numba-cuda: pip install 'tengen[cuda]'") from e

THREADS_PER_BLOCK = 64
_log = logging.getLogger(__name__)
# At most this many registers a thread for the encoder's kernel (`encode`), None for
# the compiler's choice. The encoder takes 245 of the 255 a thread may have (`python -m
# gocore.cuda --resources`): at 64 threads a block that leaves 8 warps of an SM's 64 resident,
# few to hide the latency of its serial, divergent reads of global memory. A cap runs more warps
# at once and spills the rest to local memory; which wins is for a GPU to say (`bench selfplay
# --encoder-registers`). TENGEN_CUDA_ENCODER_REGISTERS sets it for a process. (`remember`, a
# thread a game before the encoder, mostly finds its positions in the memo: not capped.)
ENCODER_REGISTERS_ENV = "TENGEN_CUDA_ENCODER_REGISTERS"
MIN_REGISTERS, MAX_REGISTERS = 32, 255
# Seconds the first launch of each entry point took in this process: its compile (or its load
# from the disk cache) and one launch. `bench selfplay` prints them: on a GPU the first step of
# a fresh process is mostly compiling.
FIRST_LAUNCH: dict[str, float] = {}


def simulated() -> bool:
    """Whether numba.cuda is the CPU simulator (NUMBA_ENABLE_CUDASIM=1)."""
    from numba import config

    return bool(config.ENABLE_CUDASIM)


def available() -> bool:
    """Whether kernels can run: a GPU with a driver, or the simulator."""
    try:
        return bool(cuda.is_available())
    except Exception:  # noqa: BLE001 - a missing driver library raises various errors
        return False


@functools.cache
def _twins() -> tuple[dict, dict[str, dict]]:
    """(CPU dispatcher -> CUDA device function, module name -> the CUDA namespace)."""
    namespaces: dict[str, dict] = {}
    twins: dict = {}
    for dispatcher in jit.KERNELS:
        fn = dispatcher.py_func
        namespace = namespaces.get(fn.__module__)
        if namespace is None:
            namespace = dict(sys.modules[fn.__module__].__dict__)
            namespaces[fn.__module__] = namespace
        rebuilt = types.FunctionType(
            fn.__code__, namespace, fn.__name__, fn.__defaults__, fn.__closure__
        )
        inline = dispatcher.targetoptions.get("inline") == "always"
        # forceinline is LLVM's alwaysinline: small kernels inline as on the CPU, without
        # numba's IR inlining (which multiplies compile work on deep call trees).
        twins[dispatcher] = (
            cuda.jit(device=True, forceinline=True, opt=True)(rebuilt)
            if inline and not simulated()
            else cuda.jit(device=True, opt=not simulated())(rebuilt)
        )
    for namespace in namespaces.values():
        for name, value in list(namespace.items()):
            if _is_twinned(value, twins):
                namespace[name] = twins[value]
    return twins, namespaces


def _is_twinned(value, twins: dict) -> bool:
    try:
        return value in twins
    except TypeError:  # unhashable module globals
        return False


def _rebuilt_entry(fn):
    """An entry point's function over its globals (the CPU kernels' names) with the CUDA twins
    swapped in."""
    twins, _ = _twins()
    namespace = dict(fn.__globals__)
    for name, value in list(namespace.items()):
        if _is_twinned(value, twins):
            namespace[name] = twins[value]
    return types.FunctionType(fn.__code__, namespace, fn.__name__)


def disk_cache(py_func, registers: int | None = None):
    """numba-cuda's on-disk cache for the kernel of `py_func`, or None (with a warning) where it
    would not live in gocore.jit's cache folder, or TENGEN_CUDA_CACHE=0. A kernel compiled under
    a register cap is cached under a key of its own (numba's key does not hold the cap).

    The folder's name is a digest of every gocore kernel source, this file included; numba's
    own key covers only this file (its date and size) and the entry's bytecode, so an edit to
    a device function elsewhere would load a stale kernel from any other folder (numba falls
    back to __pycache__ or a user-wide folder when the first is not writable). A cache that
    fails to read or write warns and compiles instead of failing the stage: every stage is its
    own process, and the biggest kernels take NVVM tens of seconds each."""
    if simulated() or os.environ.get("TENGEN_CUDA_CACHE", "1") == "0":
        return None
    try:
        cache = _safe_cache_class()(py_func)
        cache.registers = registers
    except Exception as e:  # noqa: BLE001 - no writable folder, or another numba-cuda
        warnings.warn(f"CUDA kernels not cached on disk: {e}", stacklevel=2)
        return None
    folder = os.path.realpath(jit.CACHE_DIR)
    if os.path.commonpath([os.path.realpath(cache.cache_path), folder]) != folder:
        warnings.warn(
            f"CUDA kernels not cached on disk: {jit.CACHE_DIR} is not writable "
            f"(numba chose {cache.cache_path})",
            stacklevel=2,
        )
        return None
    return cache


@functools.cache
def _safe_cache_class():
    from numba.cuda.dispatcher import CUDACache

    class SafeCache(CUDACache):
        """CUDACache whose read and write failures warn and fall back to compiling, keyed by
        the kernel's register cap too."""

        registers: int | None = None

        def _index_key(self, sig, codegen):
            key = super()._index_key(sig, codegen)
            return key if self.registers is None else (*key, ("max_registers", self.registers))

        def load_overload(self, sig, target_context):
            try:
                return super().load_overload(sig, target_context)
            except Exception as e:  # noqa: BLE001 - a corrupt or foreign file
                warnings.warn(
                    f"a cached CUDA kernel could not be read ({e}); compiling", stacklevel=2
                )
                return None

        def save_overload(self, sig, data):
            try:
                super().save_overload(sig, data)
            except Exception as e:  # noqa: BLE001 - disk full, permissions, pickling
                warnings.warn(f"a CUDA kernel could not be cached ({e})", stacklevel=2)

    return SafeCache


def _entry(fn, *, capped: bool = False):
    """Compile an entry point written over CPU kernel names as a CUDA kernel (lazily), cached
    on disk on a GPU (`disk_cache`). A `capped` entry (the encoder's) is compiled once for each
    register cap it is launched with (`encoder_registers`)."""

    @functools.cache
    def compiled(registers: int | None = None):
        options = {} if registers is None or simulated() else {"max_registers": registers}
        kernel = cuda.jit(_rebuilt_entry(fn), **options)
        cache = disk_cache(kernel.py_func, registers)
        if cache is not None:
            kernel._cache = cache  # what numba-cuda's own cache=True sets (enable_caching)
        return kernel

    compiled.py_func = fn
    compiled.capped = capped
    return compiled


def parse_registers(text: str | None, where: str = "") -> int | None:
    """A register cap from text: none (or empty) for the compiler's choice, else an integer in
    MIN_REGISTERS..MAX_REGISTERS. `where`, if given, names the text's source in the error."""
    text = (text or "").strip().lower()
    if text in ("", "none"):
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not MIN_REGISTERS <= value <= MAX_REGISTERS:
        prefix = f"{where}: " if where else ""
        raise ValueError(
            f"{prefix}{text!r} is not a register cap (none, or {MIN_REGISTERS} to {MAX_REGISTERS})"
        )
    return value


_encoder_registers: int | None = None
_encoder_registers_read = False


def encoder_registers() -> int | None:
    """The encoder kernel's register cap: set_encoder_registers's, else the environment's."""
    global _encoder_registers, _encoder_registers_read
    if not _encoder_registers_read:
        _encoder_registers = parse_registers(
            os.environ.get(ENCODER_REGISTERS_ENV), ENCODER_REGISTERS_ENV
        )
        _encoder_registers_read = True
    return _encoder_registers


def set_encoder_registers(registers: int | None) -> None:
    """Cap the encoder kernel's registers a thread (None: the compiler's choice) from its next
    launch on; each cap compiles (or loads from the disk cache) a kernel of its own."""
    global _encoder_registers, _encoder_registers_read
    if registers is not None:
        registers = parse_registers(str(registers), "set_encoder_registers")
    _encoder_registers, _encoder_registers_read = registers, True


# Data movement on the device, a thread an element of the flattened rows (`games` of them is
# rows x width): steps like the Go core's, run on the GPU only.


@jit.per_game("take_rows")
def _take_rows_step(i, src, rows, dst):
    width = src.shape[1]
    r = i // width
    dst[r, i - r * width] = src[rows[r], i - r * width]


@jit.per_game("put_rows")
def _put_rows_step(i, src, rows, dst):
    # take_rows' inverse: src's first rows.shape[0] rows to dst's rows `rows`.
    width = src.shape[1]
    r = i // width
    dst[rows[r], i - r * width] = src[r, i - r * width]


# The entry point of every per-game step (gocore.jit.per_game), a thread a game, by the step's
# name: `_<name>_entry(*args, games)`, made from source text over the CPU names and compiled
# (lazily) with the CUDA twins swapped in.
ENTRIES = {
    name: _entry(
        step.source("cuda", __file__, {"cuda": cuda, "step": step.kernel}), capped=step.capped
    )  # fmt: skip
    for name, step in jit.STEPS.items()
}


def _launch(entry, games: int, *args) -> None:
    """Run a step's entry over `games` threads (the entry's last argument)."""
    args = (*args, games)
    if games == 0:
        return  # a grid of no blocks is an error to numba-cuda
    blocks = (games + THREADS_PER_BLOCK - 1) // THREADS_PER_BLOCK
    # The simulator runs Python: no registers to cap.
    registers = encoder_registers() if entry.capped and not simulated() else None
    kernel = entry(registers)
    name = entry.py_func.__name__
    if registers is not None:
        name = f"{name} (at most {registers} registers)"
    overloads = getattr(kernel, "overloads", {})  # the simulator's kernels have none
    known = len(overloads)
    if name in FIRST_LAUNCH:
        start = time.perf_counter()
        kernel[blocks, THREADS_PER_BLOCK](*args)
        if len(overloads) > known:  # new argument types: compiled (or loaded) for them
            _log.info("CUDA kernel %s: compiled or loaded for new argument types in %.1f s", name,
                      time.perf_counter() - start)  # fmt: skip
        return
    # The first launch compiles the kernel or loads it from the disk cache: say which and how
    # long it took, as it happens (logged before, so that a compile that never ends is named).
    _log.info("CUDA kernel %s: first launch", name)
    start = time.perf_counter()
    kernel[blocks, THREADS_PER_BLOCK](*args)
    cuda.synchronize()
    FIRST_LAUNCH[name] = seconds = time.perf_counter() - start
    stats = getattr(kernel, "stats", None)
    how = "ran"
    if stats is not None:
        how = "loaded from the disk cache" if sum(stats.cache_hits.values()) else "compiled"
    _log.info("CUDA kernel %s: %s and launched in %.1f s%s", name, how, seconds,
              _machine_code(kernel))  # fmt: skip


def _machine_code(kernel) -> str:
    """What a compiled kernel's machine code takes of the GPU (", N registers a thread, L
    bytes of local memory"), or "" (the simulator's kernels, or numba-cuda cannot say)."""
    try:
        regs, local = kernel.get_regs_per_thread(), kernel.get_local_mem_per_thread()
    except Exception:  # noqa: BLE001 - the simulator's kernels have no machine code
        return ""
    if isinstance(regs, dict):  # one value a signature compiled (the first launch: one)
        regs, local = max(regs.values()), max(local.values())
    return f", {regs} registers a thread, {local} bytes of local memory"


# ---------------------------------------------------------------------------------------------
# Moving batches between host and device
# ---------------------------------------------------------------------------------------------


def to_device(batch):
    """A Boards or FeatureWork (or any named tuple of arrays, nested) with its arrays copied to
    the GPU; ints stay as they are."""
    fields = []
    for value in batch:
        if isinstance(value, np.ndarray):
            fields.append(cuda.to_device(value))
        elif isinstance(value, tuple):
            fields.append(to_device(value))
        else:
            fields.append(value)
    return type(batch)(*fields)


def to_host(batch):
    """The inverse of `to_device`: numpy copies of every device array."""
    fields = []
    for value in batch:
        if isinstance(value, tuple):
            fields.append(to_host(value))
        elif hasattr(value, "copy_to_host"):
            fields.append(value.copy_to_host())
        else:
            fields.append(value)
    return type(batch)(*fields)


# ---------------------------------------------------------------------------------------------
# The batched API, as in gocore.board and gocore.features; arrays stay on the device
# ---------------------------------------------------------------------------------------------


def new_boards(games: int, size, rules=None, *, layout=None, max_moves=None) -> Boards:
    return to_device(board.new_boards(games, size, rules, layout=layout, max_moves=max_moves))


def new_work(
    b: Boards, *, ladder_nodes: int = features.LADDER_MAX_NODES, share: int = 1
) -> FeatureWork:
    return to_device(features.new_work(_host_shell(b), ladder_nodes=ladder_nodes, share=share))


def _host_shell(b: Boards, max_moves: int = 1) -> Boards:
    """A host Boards with b's sizes and rules (what allocating work space needs), small."""
    sizes = b.size.copy_to_host() if hasattr(b.size, "copy_to_host") else b.size
    rules = b.rules.copy_to_host() if hasattr(b.rules, "copy_to_host") else b.rules
    return board.new_boards(len(sizes), sizes, rules, layout=b.layout, max_moves=max_moves)


def ladders_all(b: Boards, work: FeatureWork):
    """As features.ladders_all, on the device: (work.laddered, [G, A] int8 catches), device
    arrays, the first the work space's own (valid until its next use). The encoder's read of
    the current position alone, a thread a game (`bench features` times it apart from the
    encoder)."""
    features.check_work(b.color.shape, b.stride, work)
    catches = cuda.device_array(b.color.shape, np.int8)  # ladders_now clears each row
    GPU.run(features.ladders_step, b.games, b, work, catches)
    return work.laddered, catches


def pass_alive_all(b: Boards, work: FeatureWork):
    """As features.pass_alive_all, on the device: work.area, the work space's own device array
    (valid until its next use). The encoder's Benson part alone, a thread a game (`bench
    features` times it apart from the encoder)."""
    features.check_work(b.color.shape, b.stride, work)
    GPU.run(features.pass_alive_step, b.games, b, work)
    return work.area


# The search's batched API, as in gocore.search; trees stay on the device.


def new_tree(games, max_nodes, max_edges, leaves_per_game=1, area=board.MAX_AREA):
    return to_device(search.new_tree(games, max_nodes, max_edges, leaves_per_game, area))


def new_leaves(roots: Boards, leaves_per_game: int) -> Boards:
    return to_device(search.new_leaves(_host_shell(roots, roots.max_moves), leaves_per_game))


# Per leaf boards (by id, dropped when they go): the select kernel's [B, A] arrays, made once,
# not uploaded each step: no dead stones (zeros, only read) and the owners a terminal leaf's
# scoring writes.
_select_arrays: dict[int, tuple] = {}


class _Gpu:
    """The GPU's side of a batched function written over `on` (gocore.jit.CPU's twin): the
    arrays stay on the device, a step runs a thread a game."""

    name = "cuda"
    # A warp's 32 threads run in lockstep: the encoder groups rows of like work.
    lockstep = True

    @staticmethod
    def run(step: jit.Step, games: int, *args, threads: int | None = None) -> None:
        _launch(ENTRIES[step.name], games, *args)

    @staticmethod
    def array(x, dtype):
        """On the device: a device array as it is, numpy copied over (as `dtype`), anything
        else with __cuda_array_interface__ (a torch CUDA tensor) without a copy."""
        if hasattr(x, "copy_to_host"):
            return x
        if hasattr(x, "__cuda_array_interface__"):
            return cuda.as_cuda_array(x)
        return cuda.to_device(np.ascontiguousarray(x, dtype=dtype))

    @staticmethod
    def mask(which, games: int):
        return GPU.array(np.broadcast_to(_host(which), (games,)), np.bool_)

    @staticmethod
    def output(shape, dtype):
        return cuda.device_array(shape, dtype)  # each step writes its rows whole

    @staticmethod
    def buffer(x):
        return _as_device(x)

    @staticmethod
    def host(x) -> np.ndarray:
        return _host(x)

    @staticmethod
    def select_scratch(leaves):
        arrays = _select_arrays.get(id(leaves.color))
        if arrays is None:
            arrays = _select_arrays[id(leaves.color)] = (
                cuda.to_device(np.zeros(leaves.color.shape, np.bool_)),
                cuda.device_array(leaves.color.shape, np.int8),
            )
            weakref.finalize(leaves.color, _select_arrays.pop, id(leaves.color), None)
        return arrays


GPU = _Gpu()


def take_rows(x, rows):
    """x[rows] as a new device array (rows: host int indices into x's first axis)."""
    x = _as_device(x)
    if not x.is_c_contiguous():
        raise ValueError("take_rows: the array must be C-contiguous")
    shape = x.shape
    flat = x.reshape(shape[0], -1)
    out = cuda.device_array((len(rows), flat.shape[1]), x.dtype)
    rows = cuda.to_device(np.ascontiguousarray(rows, np.int64))
    GPU.run(_take_rows_step, len(rows) * flat.shape[1], flat, rows, out)
    return out.reshape((len(rows), *shape[1:]))


def upload(host: np.ndarray, device) -> None:
    """Copy a host array into a device array of the same shape (one transfer)."""
    device.copy_to_device(np.ascontiguousarray(host, dtype=device.dtype))


def mirror(host, device=None, which=None):
    """A device copy of a host batch (a Boards, Tree or FeatureWork): into `device`'s arrays
    when given (same shapes), else new ones. With `which` ([G] bool over the arrays' first
    axis), only the rows it marks cross (gathered into pinned memory, one transfer an array,
    scattered by the put_rows kernel), unless they are more than half of them: then, as
    without it, one transfer per array."""
    if device is None:
        return to_device(host)
    rows = None
    if which is not None:
        games = next(h for h in host if isinstance(h, np.ndarray)).shape[0]
        marked = np.broadcast_to(_host(which), (games,))
        if not marked.any():
            return device
        if 2 * np.count_nonzero(marked) <= games:
            rows = np.flatnonzero(marked)
            rows = (rows, cuda.to_device(rows))
    _mirror_rows(host, device, rows)
    return device


def _mirror_rows(host, device, rows) -> None:
    for h, d in zip(host, device, strict=True):
        if isinstance(h, np.ndarray):
            if h.shape != d.shape:
                raise ValueError(f"cannot mirror a {h.shape} array into a {d.shape} one")
            if rows is None:
                upload(h, d)
            else:
                _mirror_array_rows(h, d, *rows)
        elif isinstance(h, tuple):
            _mirror_rows(h, d, rows)


# Per device array that `mirror` writes rows into (by id, dropped when the array goes): its
# staging pair, pinned host memory and device memory for half its rows (at most half cross row
# by row), made at its first partial upload and kept (pinning memory costs more than the copy).
_staging: dict[int, tuple] = {}


def _mirror_array_rows(host: np.ndarray, device, rows: np.ndarray, device_rows) -> None:
    """host[rows] into device[rows] (`rows` on the host, at most half of them; `device_rows`
    the same on the device): gathered into pinned memory, one transfer of those rows, scattered
    on the device. The copy is synchronous and on the legacy default stream, as the kernels are:
    the staging buffers are free again once it returns and the last scatter is queued."""
    games = host.shape[0]
    flat = host.reshape(games, -1)
    staged = _staging.get(id(device))
    if staged is None:
        shape = (max(1, games // 2), flat.shape[1])
        staged = _staging[id(device)] = (
            cuda.pinned_array(shape, flat.dtype),
            cuda.device_array(shape, flat.dtype),
        )
        weakref.finalize(device, _staging.pop, id(device), None)
    pinned, stage = staged
    k = len(rows)
    np.take(flat, rows, axis=0, out=pinned[:k], mode="clip")  # rows: flatnonzero's, in range
    stage[:k].copy_to_device(pinned[:k])
    _scatter(stage, device_rows, k, device)


def _scatter(src, device_rows, k: int, out) -> None:
    """out[rows[i]] = src[i] for i < k, on the device (the put_rows kernel), src and out
    C-contiguous with rows of the same size."""
    flat = out.reshape(out.shape[0], -1)
    GPU.run(_put_rows_step, k * flat.shape[1], src.reshape(src.shape[0], -1), device_rows, flat)


def put_rows(values, rows, out) -> None:
    """out[rows] = values on the device: `values` [len(rows), *out.shape[1:]] on the device (a
    numba device array or anything with __cuda_array_interface__, such as the net's CUDA
    tensor: no copy to the host; C-contiguous) or numpy (copied over); `rows` host int indices
    into out's first axis. A tensor torch made is read on the legacy default stream, after
    the work torch queued there: torch's own default, which self-play's net runs on."""
    rows = np.ascontiguousarray(rows, np.int64)
    k = len(rows)
    if isinstance(values, np.ndarray):
        values = np.ascontiguousarray(values, out.dtype)
    elif not hasattr(values, "copy_to_host"):
        values = cuda.as_cuda_array(values)
    if tuple(values.shape) != (k, *out.shape[1:]):
        raise ValueError(f"put_rows: {tuple(values.shape)} values for {k} rows of {out.shape}")
    if k and (rows.min() < 0 or rows.max() >= out.shape[0]):
        raise ValueError(f"put_rows: rows outside 0..{out.shape[0] - 1}")
    if not isinstance(values, np.ndarray) and not values.is_c_contiguous():
        raise ValueError("put_rows: the values on the device must be C-contiguous")
    if k == 0:
        return
    if isinstance(values, np.ndarray):
        values = cuda.to_device(values)
    _scatter(values, cuda.to_device(rows), k, out)


def _host(x):
    return x.copy_to_host() if hasattr(x, "copy_to_host") else np.asarray(x)


def _as_device(x):
    if isinstance(x, np.ndarray):
        raise TypeError("pass a device array (cuda.device_array or a CUDA tensor), not numpy")
    return cuda.as_cuda_array(x) if not hasattr(x, "copy_to_host") else x


# A kernel's constant data (`.const` arrays: module-level numpy arrays its code reads) must fit
# the GPU's constant bank: ptxas refuses more when it links the kernel, at its first launch.
CONST_LIMIT = 64 * 1024
_CONST_DECL = re.compile(
    r"^\s*(?:\.(?:visible|weak|extern)\s+)?\.const\s+(?:\.align\s+\d+\s+)?"
    r"\.[busf](\d+)\s+[^\s\[;=]+(?:\[(\d+)\])?",
    re.M,
)


def const_bytes(ptx: str) -> int:
    """Bytes of constant data a PTX module declares (arrays and scalars)."""
    return sum(int(bits) // 8 * int(n or 1) for bits, n in _CONST_DECL.findall(ptx))


def entry_code(cc: tuple[int, int] = (9, 0), names=None, output: str = "ptx"):
    """(name, code) of each entry point (or those in `names`), compiled by NVVM for compute
    capability `cc` over sample arguments of the types the pipeline launches them with, without
    a GPU: PTX text, or with output="ltoir" the LTO-IR bytes that numba-cuda hands nvJitLink on
    a GPU where nvJitLink is installed (link-time optimization). Checks that the kernels are
    valid CUDA code, which the simulator cannot; `main` also checks that each fits the constant
    bank (`CONST_LIMIT`)."""
    import numba

    b = board.new_boards(2, 9)
    w = features.new_work(b)
    i64 = np.zeros(2, np.int64)
    planes = np.zeros((2, features.N_PLANES, 9, 9), np.float32)
    glob = np.zeros((2, features.N_GLOBALS), np.float32)
    policy = np.zeros((2, 82), np.float32)
    t = search.new_tree(2, 8, 8 * 82, 2, b.color.shape[1])
    leaves = search.new_leaves(b, 2)
    f32 = np.zeros(4, np.float32)
    marks = np.zeros(leaves.color.shape, np.bool_)
    params = search.SearchParams(*[0.5] * len(search.SearchParams._fields))  # types only
    which = np.ones(2, np.bool_)
    samples = {
        "reset": (b,),
        "play": (b, i64, np.zeros(2, np.int32)),
        "play_some": (b, i64, which),
        "score": (b, marks[:2], marks[:2], np.zeros(b.color.shape, np.int8), np.zeros(2)),
        "legal": (b, np.zeros(b.color.shape, np.bool_)),
        "remember": (b, w, which),
        "encode": (b, w, np.zeros(2, np.int32), i64, planes, glob),
        "ladders": (b, w, np.zeros(b.color.shape, np.int8)),
        "pass_alive": (b, w),
        "policy": (b, i64, policy, 9, np.zeros(b.color.shape, np.float32)),
        "play_out": (b, playout.new_rng(2, 0), True),
        "legal_tensor": (b, i64, 9, np.zeros((2, 82), np.bool_)),
        "reset_tree": (t, which),
        "select": (t, b, leaves, params, i64, marks, np.zeros(marks.shape, np.int8)),
        "expand_backup": (t, leaves, np.zeros(leaves.color.shape, np.float32), f32, f32, f32),
        "noise": (t, playout.new_rng(2, 0), 10.83, 0.25, which),
        "targets": (t, params, np.zeros(b.color.shape, np.float32), np.zeros(2)),
        "gumbel": (t, playout.new_rng(2, 0), 16, True, which),
        "gumbel_targets": (t, params, np.zeros(b.color.shape, np.float32), np.zeros(2)),
        "gumbel_moves": (t, params, i64),
        "reroot": (t, i64, t, which),
        "copy_tree": (t, t, which),
        "priors": (t, np.zeros(b.color.shape, np.float32)),
        "gather": (t, np.zeros((2, 6), np.int32), np.zeros((2, 3), np.float32)),
        "take_rows": (np.zeros((2, 4), np.float32), i64, np.zeros((2, 4), np.float32)),
        "put_rows": (np.zeros((2, 4), np.int16), i64, np.zeros((2, 4), np.int16)),
    }
    # numba-cuda asks the current GPU for its compute capability when it compiles a device
    # function; with no GPU, answer with the target's.
    from numba.cuda import dispatcher as cuda_dispatcher

    cuda_dispatcher.get_current_device = lambda: types.SimpleNamespace(compute_capability=cc)
    for name, entry in ENTRIES.items():
        if names is not None and name not in names:
            continue
        signature = tuple(numba.typeof(arg) for arg in (*samples[name], 2))  # 2 games
        fn = _rebuilt_entry(entry.py_func)
        if output == "ptx":
            code, _ = cuda.compile_ptx(fn, signature, cc=cc)
        else:
            code, _ = cuda.compile(fn, signature, device=False, output="ltoir", cc=cc, abi="numba")
        yield name, code


# What an SM holds (CUDA's occupancy rules, as cuda_occupancy.h has them, per compute
# capability, from Turing on: CUDA 13 compiles for no older GPU): registers, in 4 sub-partitions
# that each hold whole warps, handed to a warp in units of 256; resident warps and blocks.
SM_REGISTERS = 65536
SM_PARTITIONS = 4
SM_WARPS = {(7, 5): 32, (8, 0): 64, (8, 6): 48, (8, 9): 48, (9, 0): 64}
SM_BLOCKS = {(7, 5): 16, (8, 0): 32, (8, 6): 16, (8, 9): 24, (9, 0): 32}
REGISTER_UNIT = 256


class KernelResources(NamedTuple):
    """What the linker gave one kernel (sm_XY machine code), and the warps of THREADS_PER_BLOCK
    blocks an SM can hold with it."""

    registers: int  # a thread
    stack: int  # bytes a thread (its frame, spills included)
    spill_stores: int  # bytes of spill stores in the code (static, not a count of executions)
    spill_loads: int
    warps: int  # resident on one SM
    occupancy: float  # warps / the SM's most


def resident_warps(registers: int, cc: tuple[int, int] = (9, 0), threads: int = THREADS_PER_BLOCK
                   ) -> int:  # fmt: skip
    """Warps of `threads`-thread blocks one SM of compute capability `cc` holds when each thread
    uses `registers` registers (no shared memory): whole blocks, within the SM's registers (a
    sub-partition's, times 4), warps and blocks."""
    if cc not in SM_WARPS:
        raise ValueError(f"no occupancy figures for compute capability {cc[0]}.{cc[1]}")
    warps_per_block = -(-threads // 32)
    per_warp = -(-registers * 32 // REGISTER_UNIT) * REGISTER_UNIT
    by_registers = SM_REGISTERS // SM_PARTITIONS // per_warp * SM_PARTITIONS
    blocks = min(
        by_registers // warps_per_block,
        SM_WARPS[cc] // warps_per_block,
        SM_BLOCKS[cc],
    )
    return blocks * warps_per_block


_USED = re.compile(r"used (\d+) registers", re.IGNORECASE)
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_STACK = re.compile(r"used \d+ registers,.*?(\d+) stack,")


def parse_link_log(log: str, cc: tuple[int, int] = (9, 0)) -> KernelResources:
    """A kernel's resources from nvJitLink's verbose log (ptxas's lines for each function of the
    module: the spills summed over them; the entry's registers and stack)."""
    used = _USED.findall(log)
    if not used:
        raise ValueError(f"no register count in the linker's log: {log[:300]!r}")
    registers = max(int(r) for r in used)
    frames = [tuple(map(int, f)) for f in _FRAME.findall(log)]
    stacks = [int(x) for x in _STACK.findall(log)]
    stack = max(stacks) if stacks else max((f[0] for f in frames), default=0)
    warps = resident_warps(registers, cc)
    return KernelResources(
        registers,
        stack,
        sum(f[1] for f in frames),
        sum(f[2] for f in frames),
        warps,
        warps / SM_WARPS[cc],
    )


def link_resources(code: str | bytes, cc: tuple[int, int] = (9, 0), registers: int | None = None
                   ) -> KernelResources:  # fmt: skip
    """Link a kernel's PTX (text) or LTO-IR (bytes, optimized again at link time, as numba-cuda
    links on a GPU with nvJitLink) to machine code for `cc` with nvJitLink (no GPU needed),
    under a register cap if given, and read what it used."""
    from cuda.bindings import nvjitlink

    lto = isinstance(code, bytes)
    options = [f"-arch=sm_{cc[0]}{cc[1]}", "-verbose"] + (["-lto"] if lto else [])
    if registers is not None:
        options.append(f"-maxrregcount={registers}")
    kind = nvjitlink.InputType.LTOIR if lto else nvjitlink.InputType.PTX
    data = code if lto else code.encode()
    handle = nvjitlink.create(len(options), options)
    try:
        nvjitlink.add_data(handle, kind, data, len(data), "kernel")
        try:
            nvjitlink.complete(handle)
        except nvjitlink.nvJitLinkError as e:
            error = bytearray(nvjitlink.get_error_log_size(handle))
            nvjitlink.get_error_log(handle, error)
            raise RuntimeError(f"nvJitLink: {e}: {error.decode(errors='replace')}") from None
        log = bytearray(nvjitlink.get_info_log_size(handle))
        nvjitlink.get_info_log(handle, log)
    finally:
        nvjitlink.destroy(handle)
    return parse_link_log(log.decode(errors="replace"), cc)


def resources(cc: tuple[int, int] = (9, 0), encoder_registers: int | None = None, names=None):
    """(name, KernelResources) of each entry point on `cc`, one at a time as each is compiled
    and linked the way numba-cuda does on a GPU (LTO-IR through nvJitLink), the encoder's under
    `encoder_registers`."""
    for name, code in entry_code(cc, names, output="ltoir"):
        yield name, link_resources(code, cc, encoder_registers if ENTRIES[name].capped else None)


def main(argv: list[str] | None = None) -> int:
    """python -m gocore.cuda --ptx | --resources [--encoder-registers N] [--kernels A,B] [--cc X.Y]:
    every CUDA kernel compiled to PTX (its constant data checked), or its resources (registers,
    stack, spills and the warps an SM holds), without a GPU."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m gocore.cuda", description=main.__doc__)
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--ptx", action="store_true", help="compile every kernel to PTX")
    what.add_argument(
        "--resources",
        action="store_true",
        help="registers, spills and resident warps of every kernel, linked for --cc",
    )
    parser.add_argument(
        "--encoder-registers", default="none", help="with --resources: the encoder's cap"
    )
    parser.add_argument("--kernels", default=None, help="only these, comma separated")
    parser.add_argument("--cc", default="9.0", help="compute capability (9.0: H100, H200)")
    try:
        args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as e:
        return int(e.code or 0)
    try:
        cc = tuple(int(x) for x in args.cc.split("."))
        if len(cc) != 2 or cc not in SM_WARPS:
            raise ValueError
    except ValueError:
        known = ", ".join(f"{a}.{b}" for a, b in SM_WARPS)
        print(
            f"--cc {args.cc}: not one of the known compute capabilities ({known})", file=sys.stderr
        )
        return 2
    try:
        registers = parse_registers(args.encoder_registers, "--encoder-registers")
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    if registers is not None and not args.resources:
        print("--encoder-registers: a cap is applied at link time: with --resources",
              file=sys.stderr)  # fmt: skip
        return 2
    names = None if args.kernels is None else [n.strip() for n in args.kernels.split(",")]
    unknown = sorted(set(names or ()) - set(ENTRIES))
    if unknown:
        print(f"--kernels: no kernel {', '.join(unknown)} (kernels: {', '.join(ENTRIES)})",
              file=sys.stderr)  # fmt: skip
        return 2
    if args.resources:
        print(
            f"sm_{cc[0]}{cc[1]}: {THREADS_PER_BLOCK} threads a block, an SM holds "
            f"{SM_WARPS[cc]} warps; the encoder's register cap: {registers or 'none'}"
        )
        print(
            f"{'kernel':>15} {'registers':>9} {'stack B':>7} {'spill st B':>10} "
            f"{'spill ld B':>10} {'warps':>5} {'occupancy':>9}"
        )
        try:
            for name, r in resources(cc, registers, names):
                print(
                    f"{name:>15} {r.registers:>9} {r.stack:>7} {r.spill_stores:>10} "
                    f"{r.spill_loads:>10} {r.warps:>5} {r.occupancy:>9.1%}",
                    flush=True,
                )
        except (ImportError, OSError, RuntimeError) as e:  # no NVVM or nvJitLink, a failed link
            print(f"cannot count the kernels' resources here: {e}", file=sys.stderr)
            return 1
        return 0
    over = []
    for name, ptx in entry_code(cc, names):
        size, const = len(ptx), const_bytes(ptx)
        print(f"{name}: {size} bytes of PTX, {const} bytes of constant data")
        if const > CONST_LIMIT:
            over.append(name)
    if over:
        print(
            f"over the {CONST_LIMIT} bytes of constant memory: {', '.join(over)}", file=sys.stderr
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
