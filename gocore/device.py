"""Which target runs the Go core. `device: cpu|cuda` (params.yaml) picks a Backend; the code
above gocore calls its functions and never asks which one it got.

Each batched function is written once over `on` (gocore.jit.per_game, gocore.jit.batched):
the CPU backend takes it as it is, the CUDA backend bound to gocore.cuda.GPU; what is made
differently on each target (new arrays, moving them) is listed here by hand.

Arrays a backend returns live where it computes: numpy on the CPU, numba device arrays on the
GPU (they expose __cuda_array_interface__, so `torch.as_tensor(planes, device="cuda")` takes the
feature buffer without a copy). `to_numpy` brings any of them to the host.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import numpy as np

DEVICES = ("cpu", "cuda")


@dataclasses.dataclass(frozen=True)
class Backend:
    name: str
    new_boards: Callable  # (games, size, rules=None, *, layout=None, max_moves=None) -> Boards
    reset_all: Callable  # (b) -> None
    play_all: Callable  # (b, moves[G]) -> status[G]
    legal_all: Callable  # (b) -> [G, A] bool
    play_out_all: Callable  # (b, rng[G], avoid_own_eyes) -> None
    new_work: Callable  # (b, *, share=1) -> FeatureWork (rows in groups of `share` share a memo)
    encode_all: Callable  # (b, work, planes[G, 18, T, T], glob[G, 10], symmetry=None) -> None
    policy_all: Callable  # (b, policy[G, T*T + 1], symmetry=None) -> [G, A] float32
    legal_tensor_all: Callable  # (b, T, symmetry=None) -> [G, T*T + 1] bool policy mask
    zeros: Callable  # (shape, dtype) -> array on this device
    to_numpy: Callable  # (array) -> np.ndarray (the array itself where it is numpy already)
    # (b, work, which[G], planes, glob, symmetry=None, *, phase) -> None; `phase(name)` a
    # context entered around each part ("remember", "encode")
    encode_some: Callable
    take_rows: Callable  # (array, rows) -> array[rows], on this device
    put_rows: Callable  # (values, rows, out) -> None: out[rows] = values, out on this device
    upload: Callable  # (host array, array) -> None: the host values into the array
    # (host batch, batch=None, which=None) -> this device's copy (the host's on the CPU); with
    # `which` ([G] bool), only those games' rows change
    mirror: Callable
    # The search (gocore.search's batched API): trees stay on this device.
    new_tree: Callable  # (games, max_nodes, max_edges, leaves_per_game, area) -> Tree
    new_leaves: Callable  # (roots, leaves_per_game) -> Boards
    reset_some: Callable  # (t, which[G]) -> None
    select_all: Callable  # (t, roots, leaves, params, budget[G]) -> None
    expand_and_backup_all: Callable  # (t, leaves, policy, value, win, black_score) -> None
    add_noise_all: Callable  # (t, rng[G], which[G], *, alpha_total, epsilon) -> None
    add_gumbel_all: Callable  # (t, rng[G], which[G], considered) -> None
    policy_targets_all: Callable  # (t, params, area) -> ([G, area] targets, [G] kept)
    gumbel_targets_all: Callable  # (t, params, area) -> ([G, area] targets, [G] kept)
    gumbel_moves_all: Callable  # (t, params) -> [G] moves
    reroot_some: Callable  # (t, spare, moves[G], which[G]) -> None
    root_priors_all: Callable  # (t, area) -> [G, area] priors
    root_state: Callable  # (t) -> search.RootState, on the host
    new_rng: Callable  # (games, seed) -> [G] uint64 generator states on this device
    synchronize: Callable  # () -> None: wait for the work queued on this device (for timing)


def _upload_cpu(host: np.ndarray, array: np.ndarray) -> None:
    if array is not host:
        array[...] = host


def _mirror_cpu(host, array=None, which=None):
    return host


def _put_rows_cpu(values, rows, out: np.ndarray) -> None:
    out[rows] = np.asarray(values)


def _batched() -> dict[str, Callable]:
    """The batched functions written once over `on` (gocore.jit.batched), by name."""
    from gocore import board, features, jit, playout, search  # noqa: F401  (registers them)

    return dict(jit.BATCHED)


def _cpu() -> Backend:
    from gocore import board, features, playout, search

    return Backend(
        name="cpu",
        new_boards=board.new_boards,
        new_work=features.new_work,
        zeros=np.zeros,
        to_numpy=np.asarray,
        take_rows=lambda array, rows: array[rows],
        put_rows=_put_rows_cpu,
        upload=_upload_cpu,
        mirror=_mirror_cpu,
        new_tree=search.new_tree,
        new_leaves=search.new_leaves,
        new_rng=playout.new_rng,
        synchronize=lambda: None,
        **_batched(),
    )


def _cuda() -> Backend:
    from gocore import playout

    try:
        from gocore import cuda as gpu
    except ImportError as e:
        raise RuntimeError(
            f"device 'cuda' needs numba-cuda: pip install 'tengen[cuda]' ({e})"
        ) from None
    if not gpu.available():
        raise RuntimeError(
            "device 'cuda': no CUDA GPU or driver found (set device: cpu in params.yaml, or "
            "NUMBA_ENABLE_CUDASIM=1 to run the CUDA kernels in the simulator)"
        )

    def zeros(shape, dtype=np.float32):
        return gpu.cuda.to_device(np.zeros(shape, dtype))

    def to_numpy(x):
        if hasattr(x, "copy_to_host"):
            return x.copy_to_host()
        if hasattr(x, "__cuda_array_interface__"):  # a CUDA tensor, say
            return gpu.cuda.as_cuda_array(x).copy_to_host()
        return np.asarray(x)

    def new_rng(games, seed):
        return gpu.cuda.to_device(playout.new_rng(games, seed))

    return Backend(
        name="cuda",
        new_boards=gpu.new_boards,
        new_work=gpu.new_work,
        zeros=zeros,
        to_numpy=to_numpy,
        take_rows=gpu.take_rows,
        put_rows=gpu.put_rows,
        upload=gpu.upload,
        mirror=gpu.mirror,
        new_tree=gpu.new_tree,
        new_leaves=gpu.new_leaves,
        new_rng=new_rng,
        synchronize=gpu.cuda.synchronize,
        **{name: functools.partial(fn, on=gpu.GPU) for name, fn in _batched().items()},
    )


def backend(device: str) -> Backend:
    """The Backend for `device` ("cpu" or "cuda"), with a clear error if it cannot run here."""
    if device == "cpu":
        return _cpu()
    if device == "cuda":
        return _cuda()
    raise ValueError(f"device must be one of {', '.join(DEVICES)} (got {device!r})")
