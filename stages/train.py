"""The train stage: the network trained on generation N's window, resuming from generation
N - 1's training state, with snapshots for the EMA stage.

    python -m stages.train --generation N [--window data/windows/gen-N]
        [--out models/gen-N/train] [--previous models/gen-(N-1)/train]

As in the KataGo paper: SGD with momentum, a per-sample learning rate (the step's rate is
lr_per_sample x batch size), lower by warmup_factor for the run's first warmup_samples
samples; `samples_per_generation` samples per generation, the window's rows streamed in
shuffled order (again and again if the window is smaller), each under a random one of the 8
board symmetries; the losses of nets.losses with params.yaml's `loss` weights.

Writes (atomically) models/gen-N/train/snapshots/snap-K.pt (K = 1..snapshots, evenly
spaced), models/gen-N/train/state.pt (weights, optimizer momentum, samples seen: what
generation N + 1 resumes from), and reports/train/gen-N.json (every loss term's mean, per
snapshot too).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

import numpy as np
import torch

from gocore.atomic import output_dir, write_json
from nets.checkpoint import save, save_file
from nets.losses import loss_terms
from nets.model import GoNet
from stages import cli, layout
from stages.cli import InputError
from stages.params import Device, LossParams, ParamsError, Section, TrainParams, read
from stages.spec import DvcStage, Plan, sections
from stages.window import batches, check_window, window_files, window_lineage

STATE_FORMAT = "tengen-train-state-1"


class Params(Section):
    """What the train stage reads of params.yaml."""

    train: TrainParams
    loss: LossParams
    device: Device


@dataclasses.dataclass(frozen=True)
class TrainIO:
    generation: int
    window: Path  # data/windows/gen-N (manifest.json and part-K.parquet)
    out: Path  # models/gen-N/train
    metrics: Path  # reports/train/gen-N.json
    previous: Path | None = None  # models/gen-(N-1)/train, whose state.pt this resumes from


def dvc(n: int, plan: Plan) -> list[DvcStage]:
    """One train stage per net training in generation n (stages.lines)."""
    return [
        DvcStage(
            line.stage("train", n), "stages.train", f"--generation {n}{flags}", sections(Params),
            deps=(str(layout.window_dir(n)),
                  *([str(layout.train_dir(n - 1, line.grown))] if before else [])),
            outs=(str(layout.train_dir(n, line.grown)),),
            metrics=(str(layout.train_report(n, line.grown)),),
        )
        for line, flags, before in plan.carried(n)
    ]  # fmt: skip


def _load_state(previous: Path | None, params: TrainParams, device: str):
    """(model, optimizer state or None, samples seen): generation N - 1's, or a fresh net."""
    state_path = previous / "state.pt" if previous is not None else None
    if state_path is None or not state_path.exists():
        if previous is not None:
            raise InputError(
                f"train: {state_path} does not exist; run the train stage of the previous "
                "generation first"
            )
        torch.manual_seed(params.seed)
        return GoNet(params.net_config()).to(device), None, 0
    try:
        state = torch.load(state_path, map_location=device, weights_only=True)
    except Exception as e:  # noqa: BLE001 - torch raises many kinds on a corrupt file
        raise InputError(
            f"train: {state_path} cannot be read ({e}); rerun its train stage"
        ) from None
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise InputError(f"train: {state_path} is not a training state")
    if state["net"] != params.net:
        raise InputError(
            f"train: {state_path} holds a {state['net']} net, params.yaml train.net is {params.net}"
        )
    model = GoNet(params.net_config()).to(device)
    try:
        model.load_state_dict(state["model"])
        samples = int(state["samples"])
    except (KeyError, RuntimeError, TypeError, ValueError) as e:
        first = str(e).strip().splitlines()[0]
        raise InputError(
            f"train: {state_path}'s weights do not fit a {params.net} net ({first}); rerun "
            "the train stage that wrote it"
        ) from None
    return model, state.get("optimizer"), samples


def run(params: Params, io: TrainIO) -> dict:
    device, weights, params = params.device, params.loss.weights(), params.train
    files, manifest = window_files(io.window, "train")
    check_window(manifest, params.batch_size, "train", "train.batch_size")
    if params.samples_per_generation < params.batch_size * params.snapshots:
        raise ParamsError(
            f"train: samples_per_generation ({params.samples_per_generation}) must give every "
            f"one of the {params.snapshots} snapshots at least one batch of {params.batch_size}"
        )
    model, optimizer_state, samples = _load_state(io.previous, params, device)
    # channels_last: a training step runs faster so on the CPU (oneDNN's convolutions), as on
    # a GPU (docs/results.md, the net's speed-ups).
    model = model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(
        model.parameters(), lr=params.lr_per_sample, momentum=params.momentum
    )
    if optimizer_state is not None:
        try:
            optimizer.load_state_dict(optimizer_state)
        except (KeyError, RuntimeError, TypeError, ValueError) as e:
            raise InputError(
                f"train: the optimizer state in {io.previous / 'state.pt'} does not fit "
                f"({str(e).strip().splitlines()[0]}); rerun the previous train stage"
            ) from None
    rng = np.random.default_rng([params.seed, io.generation])
    steps = params.samples_per_generation // params.batch_size
    snapshot_steps = {round(steps * (k + 1) / params.snapshots) for k in range(params.snapshots)}
    terms_sum: dict[str, float] = {}
    window_sum: dict[str, float] = {}
    history = []
    model.train()
    start = time.perf_counter()
    with output_dir(io.out) as tmp:
        snapshot = 0
        data = batches(files, params.batch_size, params.tensor, rng, "train")
        for step in range(1, steps + 1):
            arrays = next(data)
            batch = {k: torch.as_tensor(v, device=device) for k, v in arrays.items()}
            planes, glob = batch.pop("planes"), batch.pop("globals")
            planes = planes.contiguous(memory_format=torch.channels_last)
            warm = samples < params.warmup_samples
            lr = params.lr_per_sample * params.batch_size * (params.warmup_factor if warm else 1.0)
            for group in optimizer.param_groups:
                group["lr"] = lr
            terms = loss_terms(model(planes, glob), batch, planes[:, 0], model, weights=weights)
            optimizer.zero_grad(set_to_none=True)
            terms["total"].backward()
            optimizer.step()
            samples += params.batch_size
            for name, value in terms.items():
                v = float(value.detach())
                terms_sum[name] = terms_sum.get(name, 0.0) + v
                window_sum[name] = window_sum.get(name, 0.0) + v
            window_sum["steps"] = window_sum.get("steps", 0) + 1
            if step in snapshot_steps:
                snapshot += 1
                count = window_sum.pop("steps")
                history.append(
                    {"snapshot": snapshot, "samples": samples, "step": step}
                    | {k: round(v / count, 6) for k, v in window_sum.items()}
                )
                window_sum = {}
                meta = {
                    "generation": io.generation,
                    "snapshot": snapshot,
                    "samples": samples,
                    "window_digest": manifest.get("digest"),
                }
                save(model, tmp / "snapshots" / f"snap-{snapshot}.pt", meta)
        state = {
            "format": STATE_FORMAT,
            "net": params.net,
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "samples": samples,
            "generation": io.generation,
        }
        save_file(state, tmp / "state.pt")
    seconds = time.perf_counter() - start
    metrics = {
        "generation": io.generation,
        "net": params.net,
        "steps": steps,
        "samples": steps * params.batch_size,
        "samples_total": samples,
        "window_rows": manifest.get("window_rows"),
        "window_digest": manifest.get("digest"),
        "seconds": round(seconds, 2),
        "samples_per_s": round(steps * params.batch_size / seconds, 1),
        "loss": {k: round(v / steps, 6) for k, v in terms_sum.items()},
        "snapshots": history,
    }
    write_json(metrics, io.metrics)
    return metrics


def prepare(
    params_path: str | Path,
    generation: int,
    *,
    window: str | Path | None = None,
    out: str | Path | None = None,
    metrics: str | Path | None = None,
    previous: str | Path | None = None,
    net: str | None = None,
    fresh: bool = False,
) -> tuple[Params, TrainIO]:
    """The stage's parameters and paths: train.net's (stages.layout), or with `net`, a grown
    net's. The previous generation's state is resumed unless `fresh` (a net's first
    generation)."""
    params = read(params_path, Params)
    if net:
        try:
            train = TrainParams.model_validate({**params.train.model_dump(), "net": net})
        except ValueError as e:
            raise ParamsError(f"train: --net {net}: {e}") from None
        params = params.model_copy(update={"train": train})
    if previous is None and generation > 0 and not fresh:
        previous = layout.train_dir(generation - 1, net)
    io = TrainIO(
        generation=generation,
        window=Path(window or layout.window_dir(generation)),
        out=Path(out or layout.train_dir(generation, net)),
        metrics=Path(metrics or layout.train_report(generation, net)),
        previous=Path(previous) if previous is not None else None,
    )
    return params, io


def main(argv: list[str] | None = None) -> int:
    p = cli.parser("train", __doc__)
    p.add_argument("--window", type=Path, default=None)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--metrics", type=Path, default=None)
    p.add_argument("--previous", type=Path, default=None, help="models/gen-(N-1)/train")
    p.add_argument("--net", default=None, help="a grown net of run.grow (default: train.net)")
    p.add_argument("--fresh", action="store_true", help="start from new weights")
    args = p.parse_args(argv)

    def work(tracked):
        params, io = prepare(
            args.params, args.generation, window=args.window, out=args.out,
            metrics=args.metrics, previous=args.previous, net=args.net, fresh=args.fresh,
        )  # fmt: skip
        cli.set_threads(params.train.threads)
        metrics = run(params, io)
        if tracked is not None:
            track(tracked, io, metrics)
        return {k: v for k, v in metrics.items() if k != "snapshots"}

    return cli.finish(
        "train", work, Params, params=args.params, generation=args.generation, net=args.net
    )


def track(tracked, io: TrainIO, metrics: dict) -> None:
    """The window as the run's input dataset, its lineage as tags, each snapshot's losses
    as a step (samples seen)."""
    _, manifest = window_files(io.window, "train")
    tracked.log_window(io.window, manifest, context="training")
    tracked.tag(window_lineage(tracked.tracker, manifest))
    for snap in metrics["snapshots"]:
        tracked.log_metrics(
            {f"snapshot.{k}": v for k, v in snap.items() if k not in ("snapshot", "samples")},
            step=snap["samples"],
        )


if __name__ == "__main__":
    sys.exit(main())
