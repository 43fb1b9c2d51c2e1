"""The EMA stage: an exponential moving average of the training snapshots, carried from
generation to generation; the averaged net is generation N's candidate.

    python -m stages.ema --generation N [--snapshots models/gen-N/train/snapshots]
        [--previous models/gen-(N-1)] [--window data/windows/gen-N] [--out models/gen-N/ema]

Every snapshot moves the average towards it by 1 - decay^(1/every): after `every` snapshots
the older average keeps `decay` of its weight (params.yaml: decay 0.75 every 4 snapshots, as
the paper). The averaged weights need their own batch-norm statistics (an average of the
snapshots' running means and variances is not the statistics of the averaged net), so they
are measured again: `bn_batches` batches of generation N's window through the averaged net in
training mode, without gradients, each batch weighing the same (SWA's update_bn).

Writes models/gen-N/ema/candidate.pt (the candidate checkpoint) and
models/gen-N/ema/state.pt (the average, for generation N + 1), atomically.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import torch
from pydantic import Field

from nets.checkpoint import load, save
from nets.model import GoNet, MaskedBatchNorm
from stages import cli
from stages.atomic import output_dir
from stages.cli import InputError
from stages.lines import line_for
from stages.params import Section, device_of, load_params, section
from stages.train import TrainParams, batches, check_window, window_files, window_lineage

STATE_FORMAT = "tengen-ema-state-1"


class EmaParams(Section):
    """params.yaml `ema:`."""

    decay: float = Field(gt=0, lt=1)
    every: int = Field(ge=1)
    bn_batches: int = Field(ge=0)
    bn_batch_size: int = Field(ge=1)
    seed: int


@dataclasses.dataclass(frozen=True)
class EmaIO:
    generation: int
    snapshots: Path  # models/gen-N/train/snapshots
    window: Path  # data/windows/gen-N (for the batch-norm statistics)
    out: Path  # models/gen-N/ema
    previous: Path | None = None  # models/gen-(N-1)/ema
    device: str = "cpu"


def _snapshots(folder: Path) -> list[Path]:
    found = sorted(folder.glob("snap-*.pt"), key=lambda p: int(p.stem.split("-")[1]))
    if not found:
        raise InputError(f"ema: no snapshots (snap-K.pt) in {folder}; run the train stage first")
    return found


def _previous_average(previous: Path | None, config, device: str):
    if previous is None:
        return None
    path = previous / "state.pt"
    if not path.exists():
        raise InputError(
            f"ema: {path} does not exist; run the ema stage of the previous generation first"
        )
    try:
        state = torch.load(path, map_location=device, weights_only=True)
    except Exception as e:  # noqa: BLE001 - torch raises many kinds on a corrupt file
        raise InputError(f"ema: {path} cannot be read ({e}); rerun its ema stage") from None
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise InputError(f"ema: {path} is not an EMA state")
    if state["config"] != config.as_dict():
        return None  # another net size (a promotion): the average starts again
    return state["average"]


def average(previous: dict | None, snapshots: list[dict], decay: float, every: int) -> dict:
    """The moving average of float tensors after the snapshots, in order; it starts at the
    first snapshot when there is no previous average. Integer buffers take the last one's."""
    step = 1.0 - decay ** (1.0 / every)
    avg = None if previous is None else {k: v.clone() for k, v in previous.items()}
    for snap in snapshots:
        if avg is None:
            avg = {k: v.clone() for k, v in snap.items()}
            continue
        for k, v in snap.items():
            if v.is_floating_point():
                avg[k].lerp_(v, step)
            else:
                avg[k] = v.clone()
    return avg


@torch.no_grad()
def update_batch_norm(model: GoNet, data, count: int) -> int:
    """Re-measure every batch norm's running statistics on `count` batches (equal weights).
    Returns the batches used."""
    norms = [m for m in model.modules() if isinstance(m, MaskedBatchNorm)]
    saved = [m.momentum for m in norms]
    for m in norms:
        m.running_mean.zero_()
        m.running_var.fill_(1.0)
    was_training = model.training
    device = next(model.parameters()).device
    model.train()
    used = 0
    try:
        for k in range(count):
            arrays = next(data)
            for m in norms:
                m.momentum = 1.0 / (k + 1)  # a running mean of the batches' statistics
            model(
                torch.as_tensor(arrays["planes"], device=device),
                torch.as_tensor(arrays["glob"], device=device),
            )
            used += 1
    finally:
        for m, momentum in zip(norms, saved, strict=True):
            m.momentum = momentum
        model.train(was_training)
    return used


def run(params: EmaParams, io: EmaIO, *, tensor: int) -> dict:
    paths = _snapshots(io.snapshots)
    snapshots, meta, config = [], {}, None
    for path in paths:
        model, meta = load(path, device=io.device)
        if config is not None and model.config != config:
            raise InputError(f"ema: {path} is a {model.config.name}, the others {config.name}")
        config = model.config
        snapshots.append({k: v.detach() for k, v in model.state_dict().items()})
    avg = average(
        _previous_average(io.previous, config, io.device), snapshots, params.decay, params.every
    )
    model = GoNet(config).to(io.device)
    model.load_state_dict(avg)
    used = 0
    if params.bn_batches:
        files, manifest = window_files(io.window, stage="ema")
        check_window(manifest, params.bn_batch_size, "ema", "ema.bn_batch_size")
        rng = np.random.default_rng([params.seed, io.generation])
        used = update_batch_norm(
            model, batches(files, params.bn_batch_size, tensor, rng, "ema"), params.bn_batches
        )
    model.eval()
    with output_dir(io.out) as tmp:
        save(
            model,
            tmp / "candidate.pt",
            {
                "generation": io.generation,
                "model_id": f"gen-{io.generation}-{config.name}",
                "samples": meta.get("samples"),
                "window_digest": meta.get("window_digest"),
                "snapshots": len(paths),
            },
        )
        torch.save(
            {
                "format": STATE_FORMAT,
                "config": config.as_dict(),
                "average": {k: v for k, v in model.state_dict().items()},
            },
            tmp / "state.pt",
        )
    return {
        "generation": io.generation,
        "net": config.name,
        "snapshots": len(paths),
        "continued": io.previous is not None,
        "bn_batches": used,
    }


def main(argv: list[str] | None = None) -> int:
    p = cli.parser("ema", __doc__)
    p.add_argument("--snapshots", type=Path, default=None)
    p.add_argument("--window", type=Path, default=None)
    p.add_argument("--previous", type=Path, default=None, help="models/gen-(N-1)/ema")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--net", default=None, help="a grown net of run.grow (default: train.net)")
    p.add_argument("--fresh", action="store_true", help="no previous average (a net's first)")
    args = p.parse_args(argv)
    n = args.generation

    def work(tracked):
        raw = load_params(args.params)
        params = section(raw, "ema", EmaParams, source=args.params)
        tensor = section(raw, "train", TrainParams, source=args.params).tensor
        line = line_for(args.net)
        previous = args.previous or (line.ema_dir(n - 1) if n > 0 and not args.fresh else None)
        io = EmaIO(
            generation=n,
            snapshots=args.snapshots or line.train_dir(n) / "snapshots",
            window=args.window or Path(f"data/windows/gen-{n}"),
            out=args.out or line.ema_dir(n),
            previous=previous,
            device=device_of(raw, args.params),
        )
        metrics = run(params, io, tensor=tensor)
        if tracked is not None:
            track(tracked, io)
        return metrics

    return cli.finish("ema", work, params=args.params, generation=n, net=args.net)


def track(tracked, io: EmaIO) -> None:
    """The candidate as an MLflow model, registered, with alias `candidate`; its version's
    tags give its checkpoint's digest and the window (and so the games) it learned from."""
    import mlflow

    from stages.tracking import model_digest

    path = io.out / "candidate.pt"
    model, meta = load(path)
    _, manifest = window_files(io.window, stage="ema")
    lineage = window_lineage(tracked.tracker, manifest)
    tracked.log_window(io.window, manifest, context="training")
    digest = model_digest(path)
    info = mlflow.pytorch.log_model(
        model,
        name="candidate",
        registered_model_name=tracked.tracker.model_name,
        serialization_format="pickle",  # GoNet from tengen's nets; the checkpoint rides along
        pip_requirements=[f"torch=={torch.__version__.split('+')[0]}", "numpy"],
        extra_files=[str(path)],
    )
    version = str(info.registered_model_version)
    tags = {
        "tengen.sha256": digest,
        "tengen.model_id": meta.get("model_id", ""),
        "tengen.generation": str(io.generation),
        "tengen.net": model.config.name,
        **lineage,
    }
    client, name = tracked.client, tracked.tracker.model_name
    for key, value in tags.items():
        client.set_model_version_tag(name, version, key, value)
    client.set_registered_model_alias(name, "candidate", version)
    tracked.tag({**lineage, "tengen.candidate_sha256": digest, "tengen.model_version": version})


if __name__ == "__main__":
    sys.exit(main())
