"""Batched inference: the feature buffer from gocore in, policy, value, score and ownership out.

`Evaluator(model)(planes, glob, legal=..., symmetry=...)` runs the net in eval mode without
gradients, optionally in fp16/bf16 on a GPU, each row under one of the 8 board symmetries
(given, or random): the inputs are transformed, the spatial outputs transformed back, so the
caller always sees its own orientation. Inputs may be numpy arrays or torch tensors (a CUDA
tensor, or anything with __cuda_array_interface__, stays on the GPU); outputs come back as the
same kind.
"""

from __future__ import annotations

import numpy as np
import torch

from nets.model import GoNet

SYMMETRIES = 8


def transform(x: torch.Tensor, sym: int) -> torch.Tensor:
    """Symmetry `sym` of the last two axes (H, W): bit 0 mirrors x, bit 1 mirrors y, bit 2
    then transposes (gocore.features.symmetric_xy on a board that fills the tensor)."""
    if sym & 1:
        x = x.flip(-1)
    if sym & 2:
        x = x.flip(-2)
    if sym & 4:
        x = x.transpose(-1, -2)
    return x


def untransform(x: torch.Tensor, sym: int) -> torch.Tensor:
    """The inverse of `transform`."""
    if sym & 4:
        x = x.transpose(-1, -2)
    if sym & 2:
        x = x.flip(-2)
    if sym & 1:
        x = x.flip(-1)
    return x


class Evaluator:
    def __init__(self, model: GoNet, *, device: str | None = None, dtype: str = "float32"):
        self.device = torch.device(device or next(model.parameters()).device)
        # channels_last: oneDNN's convolutions on the CPU ran b4c32 at self-play's batch of 96
        # 1.2-1.4x faster (2,750-3,058 evaluations/s, not 1,928-2,489); tensor cores want it.
        self.model = model.to(self.device, memory_format=torch.channels_last).eval()
        if dtype not in ("float32", "float16", "bfloat16"):
            raise ValueError(f"dtype must be float32, float16 or bfloat16 (got {dtype})")
        if dtype != "float32" and self.device.type != "cuda":
            raise ValueError(f"{dtype} inference needs a CUDA device (got {self.device})")
        self.autocast_dtype = None if dtype == "float32" else getattr(torch, dtype)

    @property
    def takes_cuda_arrays(self) -> bool:
        """Whether inputs on the GPU (__cuda_array_interface__) stay there: gocore's CUDA
        driver then hands over its device buffers as they are."""
        return self.device.type == "cuda"

    @torch.inference_mode()
    def __call__(
        self,
        planes,
        glob,
        *,
        legal=None,
        symmetry=None,
        rng: np.random.Generator | None = None,
    ) -> dict:
        """planes (B, 18, T, T), glob (B, 10); legal (B, T*T + 1) bool: moves allowed (pass
        last), default every on-board point and pass; symmetry: None (identity), an int, a
        (B,) array, or "random" (uses `rng`).

        Returns policy (B, T*T + 1) softmax over legal moves, value (B, 3) softmax of win,
        loss, no result, score_mean (B,), score_stdev (B,), ownership (B, T, T)."""
        as_numpy = isinstance(planes, np.ndarray)
        x = self._tensor(planes)
        g = self._tensor(glob)
        b, _, t, _ = x.shape
        syms = self._symmetries(symmetry, b, rng)
        x_in = x.clone(memory_format=torch.channels_last)
        for s in range(SYMMETRIES):
            rows = syms == s
            if s and rows.any():
                x_in[rows] = transform(x[rows], s)
        if self.autocast_dtype is not None:
            with torch.autocast("cuda", dtype=self.autocast_dtype):
                out = self.model(x_in, g, score_belief=False)
        else:
            out = self.model(x_in, g, score_belief=False)  # the search never reads it
        board_policy = out["policy"][:, :-1].float().reshape(b, t, t)
        ownership = out["ownership"].float()
        for s in range(1, SYMMETRIES):
            rows = syms == s
            if rows.any():
                board_policy[rows] = untransform(board_policy[rows], s)
                ownership[rows] = untransform(ownership[rows], s)
        logits = torch.cat([board_policy.reshape(b, t * t), out["policy"][:, -1:].float()], 1)
        if legal is None:
            legal_t = torch.cat(
                [x[:, 0].reshape(b, t * t) > 0, torch.ones_like(logits[:, :1], dtype=torch.bool)], 1
            )
        else:
            legal_t = self._tensor(legal).bool()
        logits = logits.masked_fill(~legal_t, float("-inf"))
        result = {
            "policy": torch.softmax(logits, dim=1),
            "value": torch.softmax(out["outcome"].float(), dim=1),
            "score_mean": out["score_mean"].float(),
            "score_stdev": out["score_stdev"].float(),
            "ownership": ownership,
        }
        if as_numpy:
            return {k: v.cpu().numpy() for k, v in result.items()}
        return result

    def _tensor(self, a) -> torch.Tensor:
        if isinstance(a, torch.Tensor):
            return a.to(self.device)
        if hasattr(a, "__cuda_array_interface__"):
            return torch.as_tensor(a, device="cuda").to(self.device)
        return torch.as_tensor(np.asarray(a)).to(self.device)

    def _symmetries(self, symmetry, b: int, rng) -> torch.Tensor:
        if symmetry is None:
            syms = np.zeros(b, np.int64)
        elif isinstance(symmetry, str):
            if symmetry != "random":
                raise ValueError(
                    f"symmetry must be an int, an array or 'random' (got {symmetry!r})"
                )
            syms = (rng or np.random.default_rng()).integers(0, SYMMETRIES, b)
        else:
            syms = np.broadcast_to(np.asarray(symmetry, dtype=np.int64), (b,))
        if syms.min() < 0 or syms.max() >= SYMMETRIES:
            raise ValueError(f"symmetries are 0..{SYMMETRIES - 1}")
        return torch.as_tensor(np.array(syms, dtype=np.int64), device=self.device)
