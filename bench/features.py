"""`tengen bench features`: input positions encoded per second (planes, globals, ladders and
Benson included) beside one forward pass of KataGo's b6c96 net (nets.model) on the same batch,
measured in the same run on the same cores. The encoder should cost well under 10% of the
forward pass. Beside them, the encoder's two costliest parts alone, positions per second: the
ladder read of the current position and Benson's pass-alive area (on a GPU each is a kernel of
its own, a thread a position, as the encoder is).

Positions come from uniform random play stopped at 20%..65% of n^2 moves: many small groups
in atari or with two liberties, so more ladder reading than in real games.
"""

from __future__ import annotations

import functools
import os
import time

import numpy as np

from bench.table import Column, Table
from gocore import board as gb
from gocore import features as F
from gocore.rules import PRESETS

STOP_FRACTIONS = (0.2, 0.35, 0.5, 0.65)


def random_positions(size: int, games: int, seed: int = 0) -> list[gb.Boards]:
    """Batches of random mid-game positions, one batch per stopping point."""
    pick = np.random.default_rng(seed)
    batches = []
    per = max(1, games // len(STOP_FRACTIONS))
    for fraction in STOP_FRACTIONS:
        b = gb.new_boards(per, size, PRESETS["chinese"])
        for _ in range(int(fraction * size * size)):
            legal = gb.legal_all(b)
            legal[:, gb.PASS] = False
            scores = pick.random(legal.shape) * legal
            moves = scores.argmax(axis=1)
            moves[~legal.any(axis=1)] = gb.PASS
            gb.play_all(b, moves)
        batches.append(b)
    return batches


def _timed(fn, seconds: float) -> float:
    """Calls per second of fn over at least `seconds` (after one warm-up call)."""
    fn()
    calls = 0
    start = time.perf_counter()
    while True:
        fn()
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return calls / elapsed


def _each(part, batches, works, finish=lambda: None):
    """A function that calls part(b, w) on every batch with its work space, then finish()."""

    def run():
        for b, w in zip(batches, works, strict=True):
            part(b, w)
        finish()

    return run


def bench_features(
    sizes=(9, 19), batch: int = 256, seconds: float = 2.0, net: str = "b6c96"
) -> list[dict]:

    from nets.config import net_config
    from nets.model import GoNet

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    rows = []
    net = GoNet(net_config(net)).eval()
    for size in sizes:
        batches = random_positions(size, batch)
        rows += _bench_cpu(size, batches, net, seconds, cores)
        gpu_row = _bench_gpu(size, batches, net, seconds)
        if gpu_row:
            rows.append(gpu_row)
    return rows


def _bench_cpu(size, batches, net, seconds, cores) -> list[dict]:
    import torch

    positions = sum(b.games for b in batches)
    works = [F.new_work(b) for b in batches]
    planes = [np.zeros(F.tensor_shapes(b.games, size)[0], np.float32) for b in batches]
    globs = [np.zeros((b.games, F.N_GLOBALS), np.float32) for b in batches]

    def encode(threads):
        for b, w, p, g in zip(batches, works, planes, globs, strict=True):
            F.encode_all(b, w, p, g, threads=threads)

    encode(cores)
    all_planes = torch.from_numpy(np.concatenate(planes))
    all_globs = torch.from_numpy(np.concatenate(globs))
    rows = []
    for threads in sorted({1, cores}):
        encode_rate = _timed(lambda t=threads: encode(t), seconds) * positions
        part_rates = {
            name: _timed(_each(functools.partial(part, threads=threads), batches, works),
                         seconds) * positions
            for name, part in (("ladders", F.ladders_all), ("benson", F.pass_alive_all))
        }  # fmt: skip
        torch.set_num_threads(threads)
        with torch.inference_mode():
            forward_rate = _timed(lambda: net(all_planes, all_globs), seconds) * positions
        rows.append(_row(size, "cpu", threads, positions, encode_rate, forward_rate, part_rates))
    torch.set_num_threads(cores)
    return rows


def _row(size, device, threads, batch, encode_rate, forward_rate, part_rates) -> dict:
    return {
        "board": f"{size}x{size}",
        "device": device,
        "threads": threads,
        "batch": batch,
        "positions_per_s": round(encode_rate, 1),
        "ladders_positions_per_s": round(part_rates["ladders"], 1),
        "benson_positions_per_s": round(part_rates["benson"], 1),
        "forward_positions_per_s": round(forward_rate, 1),
        "encode_fraction": float(f"{forward_rate / encode_rate:.4g}"),  # 4 significant digits
        "net": "b6c96",
    }


def _bench_gpu(size, batches, net, seconds) -> dict | None:
    """The same on a GPU: encode with the CUDA kernels into torch CUDA tensors, forward there."""
    import torch

    try:
        from gocore import cuda as gpu
    except ImportError:
        return None
    if gpu.simulated() or not gpu.available() or not torch.cuda.is_available():
        return None
    positions = sum(b.games for b in batches)
    device_batches = [gpu.to_device(b) for b in batches]
    works = [gpu.new_work(b) for b in device_batches]
    planes = [torch.zeros(F.tensor_shapes(b.games, size)[0], device="cuda") for b in batches]
    globs = [torch.zeros((b.games, F.N_GLOBALS), device="cuda") for b in batches]

    def encode():
        for b, w, p, g in zip(device_batches, works, planes, globs, strict=True):
            gpu.encode_all(b, w, p, g)
        gpu.cuda.synchronize()

    cuda_net = net.to("cuda")
    all_planes, all_globs = torch.cat(planes), torch.cat(globs)

    def forward():
        cuda_net(all_planes, all_globs)
        torch.cuda.synchronize()

    encode_rate = _timed(encode, seconds) * positions
    part_rates = {
        name: _timed(_each(part, device_batches, works, gpu.cuda.synchronize), seconds) * positions
        for name, part in (("ladders", gpu.ladders_all), ("benson", gpu.pass_alive_all))
    }
    with torch.inference_mode():
        forward_rate = _timed(forward, seconds) * positions
    net.to("cpu")
    return _row(size, "cuda", 0, positions, encode_rate, forward_rate, part_rates)


TABLE = Table(
    title="input encoding (18 planes + 10 globals, ladders, Benson) beside one b6c96 forward "
    "pass; its ladder read and Benson's area alone",
    columns=(
        Column("board", 6, "board"),
        Column("device", 6, "device"),
        Column("threads", 7, lambda r: r["threads"] or None),
        Column("batch", 5, "batch"),
        Column("encode pos/s", 13, "positions_per_s", ",.0f"),
        Column("forward pos/s", 14, "forward_positions_per_s", ",.0f"),
        Column("encode/forward", 15, "encode_fraction", ".1%"),
        Column("ladders pos/s", 14, "ladders_positions_per_s", ",.0f"),
        Column("Benson pos/s", 13, "benson_positions_per_s", ",.0f"),
    ),
)
