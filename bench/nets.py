"""`tengen bench nets`: forward evaluations and training samples per second for each net size,
board size and batch, beside the raw FLOP count of one evaluation (its named baseline: what the
arithmetic alone would allow at the machine's measured matmul rate, printed as "% of peak").

Training is a full step: forward, the paper's loss, backward, SGD with momentum. Convolutions
run channels_last, as in the stages; on a GPU (when one is present) with bf16 autocast too.
"""

from __future__ import annotations

import dataclasses
import os
import time

import torch
from torch import nn

from bench.table import Column, Table
from nets.config import SIZES, NetConfig
from nets.losses import LossWeights, loss_terms
from nets.model import GoNet


def flops_per_eval(model: GoNet, board: int) -> float:
    """FLOPs (2 x multiply-adds) of convolutions and linear layers for one position."""
    total = 0

    def conv_hook(module: nn.Conv2d, inputs, output):
        nonlocal total
        k = module.kernel_size[0] * module.kernel_size[1]
        total += output.numel() * (module.in_channels // module.groups) * k

    def linear_hook(module: nn.Linear, inputs, output):
        nonlocal total
        total += output.numel() * module.in_features

    handles = []
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            handles.append(m.register_forward_hook(conv_hook))
        elif isinstance(m, nn.Linear):
            handles.append(m.register_forward_hook(linear_hook))
    planes, glob = _inputs(model.config, board, 1, "cpu")
    was_training = model.training
    model.eval()
    with torch.inference_mode():
        model(planes, glob)
    model.train(was_training)
    for h in handles:
        h.remove()
    return 2.0 * total


def _inputs(config: NetConfig, board: int, batch: int, device: str):
    g = torch.Generator().manual_seed(0)
    planes = (torch.rand(batch, config.planes, board, board, generator=g) < 0.3).float()
    planes[:, 0] = 1.0
    glob = torch.rand(batch, config.globals, generator=g)
    return planes.to(device), glob.to(device)


def _targets(batch: int, board: int, device: str) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    moves = board * board + 1
    policy = torch.rand(batch, moves, generator=g)
    return {
        k: v.to(device)
        for k, v in {
            "policy_target": policy / policy.sum(dim=1, keepdim=True),
            "policy_weight": torch.ones(batch),
            "opponent_move": torch.randint(0, moves, (batch,), generator=g),
            "outcome": torch.eye(3)[torch.randint(0, 3, (batch,), generator=g)],
            "final_score": torch.randint(-40, 40, (batch,), generator=g).float() + 0.5,
            "ownership": torch.randint(-1, 2, (batch, board, board), generator=g).float(),
            "value_weight": torch.ones(batch),
        }.items()
    }


def _rate(fn, seconds: float, device: str) -> float:
    """Calls per second; one untimed warm-up unless a call alone takes longer than `seconds`."""

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    start = time.perf_counter()
    fn()
    sync()
    first = time.perf_counter() - start
    if first >= seconds:
        return 1.0 / first
    calls = 0
    start = time.perf_counter()
    while True:
        fn()
        calls += 1
        sync()
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return calls / elapsed


# Training keeps about this many float32 values per block, channel, point and sample for the
# backward pass (measured: b6c96 on 19x19 at batch 64 peaks at 0.75 GB over the baseline).
TRAIN_FLOATS_PER_ACTIVATION = 16


def train_bytes(config: NetConfig, board: int, batch: int) -> int:
    """A generous estimate of the memory one training step needs."""
    width = config.channels * (config.expansion if config.kind == "mobile" else 1)
    return 4 * TRAIN_FLOATS_PER_ACTIVATION * batch * config.blocks * width * board * board


def available_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


# The terms' weights scale them and do not change the work: all ones.
UNIT = LossWeights(**{f.name: 1.0 for f in dataclasses.fields(LossWeights)})


def bench_one(name: str, board: int, batch: int, device: str, seconds: float) -> dict:
    config = SIZES[name]
    # channels_last, as the evaluator and the train stage run it (on the CPU too).
    model = GoNet(config).to(device, memory_format=torch.channels_last)
    cuda = device == "cuda"
    planes, glob = _inputs(config, board, batch, device)
    planes = planes.to(memory_format=torch.channels_last)
    target = _targets(batch, board, device)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda)

    model.eval()

    def forward():
        with torch.inference_mode(), autocast:
            model(planes, glob)

    evals = _rate(forward, seconds, device) * batch
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)

    def train_step():
        with autocast:
            out = model(planes, glob)
            loss = loss_terms(out, target, planes[:, 0], model, weights=UNIT)["total"]
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    needed = train_bytes(config, board, batch)
    limit = (
        torch.cuda.mem_get_info()[0] if cuda else available_bytes()
    ) // 2  # leave room for everything else
    skipped = needed > limit
    samples = None if skipped else round(_rate(train_step, seconds, device) * batch, 1)
    row = {
        "net": name,
        "board": f"{board}x{board}",
        "batch": batch,
        "device": device + ("-bf16" if cuda else ""),
        "evals_per_s": round(evals, 1),
        "train_samples_per_s": samples,
        "gflop_per_eval": round(flops_per_eval(GoNet(config), board) / 1e9, 4),
    }
    if skipped:
        row["train_skipped"] = f"needs ~{needed / 1e9:.0f} GB, {limit / 1e9:.0f} GB allowed"
    return row


def matmul_gflops(seconds: float = 0.5) -> float:
    """The machine's own baseline: float32 GFLOP/s of a large matrix product on these cores."""
    a = torch.rand(1024, 1024)
    b = torch.rand(1024, 1024)
    rate = _rate(lambda: a @ b, seconds, "cpu")
    return rate * 2 * 1024**3 / 1e9


def bench_nets(nets, boards=(9, 19), batches=(64, 256), seconds: float = 1.0):
    """Yields one row per (device, net, board, batch), as each is measured."""
    peak = matmul_gflops()
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for device in devices:
        for name in nets:
            for board in boards:
                for batch in batches:
                    row = bench_one(name, board, batch, device, seconds)
                    if device == "cpu":
                        achieved = row["evals_per_s"] * row["gflop_per_eval"]
                        row["matmul_gflop_per_s"] = round(peak, 1)
                        row["forward_fraction_of_matmul"] = round(achieved / peak, 3)
                    yield row


TABLE = Table(
    title="network speed: forward evaluations and training samples per second",
    columns=(
        Column("net", 15, "net"),
        Column("board", 6, "board"),
        Column("batch", 5, "batch"),
        Column("device", 9, "device"),
        Column("evals/s", 10, "evals_per_s", ",.1f"),
        Column("train/s", 9, "train_samples_per_s", ",.1f"),
        Column("GFLOP/eval", 10, "gflop_per_eval", ".3f"),
        Column("of matmul", 10, "forward_fraction_of_matmul", ".0%", missing=""),
    ),
)


def format_row(r: dict) -> str:
    skipped = f"  (training skipped: {r['train_skipped']})" if "train_skipped" in r else ""
    return TABLE.row(r) + skipped


def format_footer(rows: list[dict]) -> str:
    if rows and "matmul_gflop_per_s" in rows[0]:
        return (
            f"'of matmul': forward GFLOP/s as a share of a 1024x1024 float32 matrix product "
            f"on the same cores ({rows[0]['matmul_gflop_per_s']:.1f} GFLOP/s)"
        )
    return ""
