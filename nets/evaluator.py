"""Batched inference: the feature buffer from gocore in, policy, value, score and ownership out.

`Evaluator(model)(planes, glob, legal=..., symmetry=...)` runs the net in eval mode without
gradients, optionally in fp16/bf16 on a GPU, each row under one of the 8 board symmetries
(given, or random): the inputs are transformed, the spatial outputs transformed back, so the
caller always sees its own orientation. Inputs may be numpy arrays or torch tensors (a CUDA
tensor, or anything with __cuda_array_interface__, stays on the GPU); outputs come back as the
same kind.

`compile` runs the net through torch.compile (COMPILE_MODES): one graph for every batch of 16
rows or more (fewer are padded), and with CUDA graphs (reduce-overhead, max-autotune on a GPU)
batches padded to a few sizes (`bucket`), a graph recorded for each. A compile that fails at
the first call (no C++ compiler for inductor on the CPU, no Triton on a GPU) logs a warning and
the net runs eager; one that fails later (a new board size's compile, a graph's capture)
raises.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from nets.model import GoNet

SYMMETRIES = 8

# torch.compile's modes for the net ("none": eager); the last two record CUDA graphs on a GPU.
COMPILE_MODES = ("none", "default", "reduce-overhead", "max-autotune")
GRAPH_MODES = ("reduce-overhead", "max-autotune")
# A compiled net's smallest batch: the graph compiled for a dynamic batch holds from 16 rows
# (torch 2.13 compiles one graph for 2-15 rows and one for 1 besides: seconds each, when a
# generation's last games end); fewer rows are padded to 16.
MIN_COMPILED_ROWS = 16

_log = logging.getLogger(__name__)


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


def bucket(rows: int) -> int:
    """`rows` rounded up to one of 8 sizes an octave (up to 8 as they are): at most 1/8 more."""
    if rows <= 8:
        return rows
    step = 1 << (rows.bit_length() - 4)
    return -(-rows // step) * step


class Evaluator:
    def __init__(
        self,
        model: GoNet,
        *,
        device: str | None = None,
        dtype: str = "float32",
        compile: str = "none",
    ):
        self.device = torch.device(device or next(model.parameters()).device)
        # channels_last: oneDNN's convolutions run faster so on the CPU at self-play's batch
        # sizes (docs/results.md, the net's speed-ups); tensor cores want it.
        self.model = model.to(self.device, memory_format=torch.channels_last).eval()
        if dtype not in ("float32", "float16", "bfloat16"):
            raise ValueError(f"dtype must be float32, float16 or bfloat16 (got {dtype})")
        if dtype != "float32" and self.device.type != "cuda":
            raise ValueError(f"{dtype} inference needs a CUDA device (got {self.device})")
        self.autocast_dtype = None if dtype == "float32" else getattr(torch, dtype)
        if compile not in COMPILE_MODES:
            raise ValueError(f"compile must be one of {', '.join(COMPILE_MODES)} (got {compile!r})")
        self.compile = compile
        self._compiled = None
        if compile != "none":
            # A mode's own options; with CUDA graphs, no warning past 8 batch sizes (a
            # generation's last games step down through a few sizes an octave).
            from torch._inductor import list_mode_options

            options = dict(list_mode_options(compile))
            if compile in GRAPH_MODES:
                options["triton.cudagraph_dynamic_shape_warn_limit"] = None
            self._compiled = torch.compile(self.model, options=options)
        self._calls = 0
        # CUDA graphs (reduce-overhead, max-autotune on a GPU) record a graph per batch size:
        # batches are padded to a few sizes (`bucket`), so that a search's varying number of
        # leaves records a few graphs, not one a step, and each call's outputs are copied (a
        # graph writes its next run's outputs over them).
        self.cuda_graphs = compile in GRAPH_MODES and self.device.type == "cuda"
        self._cells: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def compiled(self) -> bool:
        """Whether the net runs compiled: asked for, and not fallen back to eager (a compile
        that failed at the first call)."""
        return self._compiled is not None

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
        b, c, t, _ = x.shape
        syms, identity = self._symmetries(symmetry, b, rng)
        if identity:
            x_in = x.contiguous(memory_format=torch.channels_last)
        else:  # each row's symmetry: one gather of its cells
            forward, inverse = self._cell_maps(t)
            cells = forward[syms][:, None, :].expand(b, c, t * t)
            x_in = x.reshape(b, c, t * t).gather(2, cells).reshape(b, c, t, t)
            x_in = x_in.contiguous(memory_format=torch.channels_last)
        out = self._run(x_in, g)
        board_policy = out["policy"][:, :-1].float()
        ownership = out["ownership"].float().reshape(b, t * t)
        if not identity:
            back = inverse[syms]
            board_policy = board_policy.gather(1, back)
            ownership = ownership.gather(1, back)
        logits = torch.cat([board_policy, out["policy"][:, -1:].float()], 1)
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
            "ownership": ownership.reshape(b, t, t),
        }
        if as_numpy:
            return {k: v.cpu().numpy() for k, v in result.items()}
        return result

    def _run(self, x: torch.Tensor, g: torch.Tensor) -> dict[str, torch.Tensor]:
        """The net's outputs for the (transformed) rows: compiled where asked, in the autocast
        dtype where asked."""
        self._calls += 1
        if self._compiled is None:
            return self._model(self.model, x, g)
        b = x.shape[0]
        rows = max(b, MIN_COMPILED_ROWS)
        if self.cuda_graphs:
            rows = bucket(rows)
        if rows > b:  # copies of the first row, dropped below
            padded = torch.empty(
                (rows, *x.shape[1:]), dtype=x.dtype, device=x.device,
                memory_format=torch.channels_last,
            )  # fmt: skip
            padded[:b] = x
            padded[b:] = x[:1]
            x = padded
            g = torch.cat([g, g[:1].expand(rows - b, -1)])
        # The batch is dynamic from the first compile: one graph for every number of rows.
        torch._dynamo.maybe_mark_dynamic(x, 0)
        torch._dynamo.maybe_mark_dynamic(g, 0)
        if self.cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()
        try:
            out = self._model(self._compiled, x, g)
        except Exception as e:  # noqa: BLE001 - e.g. no C++ compiler for inductor
            if self._calls > 1:  # a later compile (another board size) or a capture fails
                raise
            cause = getattr(e, "inner_exception", None) or e  # dynamo wraps the backend's error
            lines = [line.strip() for line in str(cause).splitlines() if line.strip()]
            _log.warning(
                "torch.compile (%s) failed, so the net runs uncompiled: %s%s",
                self.compile, type(cause).__name__, f": {lines[0]}" if lines else "",
            )  # fmt: skip
            self._compiled = None
            return self._model(self.model, x[:b], g[:b])
        out = {k: v[:b] for k, v in out.items()}
        if self.cuda_graphs:
            out = {k: v.clone() for k, v in out.items()}
        return out

    def _model(self, model, x: torch.Tensor, g: torch.Tensor) -> dict[str, torch.Tensor]:
        if self.autocast_dtype is not None:
            with torch.autocast("cuda", dtype=self.autocast_dtype):
                return model(x, g, score_belief=False)
        return model(x, g, score_belief=False)  # the search never reads the score belief

    def _cell_maps(self, t: int) -> tuple[torch.Tensor, torch.Tensor]:
        """[8, t*t] cell indices: row s of the first is, for each cell of symmetry s of a
        board, the cell it comes from (`transform`); of the second, `untransform`'s."""
        if t not in self._cells:
            cells = torch.arange(t * t, device=self.device).reshape(t, t)
            self._cells[t] = tuple(
                torch.stack([f(cells, s).reshape(t * t) for s in range(SYMMETRIES)])
                for f in (transform, untransform)
            )
        return self._cells[t]

    def _tensor(self, a) -> torch.Tensor:
        if isinstance(a, torch.Tensor):
            return a.to(self.device)
        if hasattr(a, "__cuda_array_interface__"):
            return torch.as_tensor(a, device="cuda").to(self.device)
        return torch.as_tensor(np.asarray(a)).to(self.device)

    def _symmetries(self, symmetry, b: int, rng) -> tuple[torch.Tensor, bool]:
        """Each row's symmetry on the device, and whether they are all the identity (read on
        the host: no wait for the device)."""
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
        return (
            torch.as_tensor(np.array(syms, dtype=np.int64), device=self.device),
            not syms.any(),
        )
