"""Which target runs the Go core. `device: cpu|cuda` (params.yaml) picks a Backend; the code
above gocore calls its functions and never asks which one it got.

Arrays a backend returns live where it computes: numpy on the CPU, numba device arrays on the
GPU (they expose __cuda_array_interface__, so `torch.as_tensor(planes, device="cuda")` takes the
feature buffer without a copy). `to_numpy` brings any of them to the host.
"""

from __future__ import annotations

import dataclasses
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
    new_work: Callable  # (b) -> FeatureWork
    encode_all: Callable  # (b, work, planes[G, 18, T, T], glob[G, 10], symmetry=None) -> None
    policy_all: Callable  # (b, policy[G, T*T + 1], symmetry=None) -> [G, A] float32
    legal_tensor_all: Callable  # (b, T, symmetry=None) -> [G, T*T + 1] bool policy mask
    zeros: Callable  # (shape, dtype) -> array on this device
    to_numpy: Callable  # (array) -> np.ndarray


def _cpu() -> Backend:
    from gocore import board, features, playout

    return Backend(
        name="cpu",
        new_boards=board.new_boards,
        reset_all=board.reset_all,
        play_all=board.play_all,
        legal_all=board.legal_all,
        play_out_all=playout.play_out_all,
        new_work=features.new_work,
        encode_all=features.encode_all,
        policy_all=features.policy_all,
        legal_tensor_all=features.legal_tensor_all,
        zeros=np.zeros,
        to_numpy=np.asarray,
    )


def _cuda() -> Backend:
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
        return x.copy_to_host() if hasattr(x, "copy_to_host") else np.asarray(x)

    return Backend(
        name="cuda",
        new_boards=gpu.new_boards,
        reset_all=gpu.reset_all,
        play_all=gpu.play_all,
        legal_all=gpu.legal_all,
        play_out_all=gpu.play_out_all,
        new_work=gpu.new_work,
        encode_all=gpu.encode_all,
        policy_all=gpu.policy_all,
        legal_tensor_all=gpu.legal_tensor_all,
        zeros=zeros,
        to_numpy=to_numpy,
    )


def backend(device: str) -> Backend:
    """The Backend for `device` ("cpu" or "cuda"), with a clear error if it cannot run here."""
    if device == "cpu":
        return _cpu()
    if device == "cuda":
        return _cuda()
    raise ValueError(f"device must be one of {', '.join(DEVICES)} (got {device!r})")
