"""The EMA stage: an exponential moving average of the training snapshots, carried from
generation to generation; the averaged net is generation N's candidate.

    python -m stages.ema --generation N [--snapshots models/gen-N/train/snapshots]
        [--previous models/gen-(N-1)] [--window data/windows/gen-N] [--out models/gen-N/ema]

Every snapshot moves the average towards it by 1 - decay: the older average keeps `decay` of
its weight (params.yaml: 0.75 per snapshot, as the paper, whose candidate every four snapshots
so averages about four snapshots of lookback). The averaged weights need their own batch-norm
statistics (an average of the snapshots' running means and variances is not the statistics of
the averaged net), so they are measured again: `bn_batches` batches of generation N's window
through the averaged net in training mode, without gradients, each batch weighing the same
(SWA's update_bn).

Writes models/gen-N/ema/candidate.pt (the candidate checkpoint) and
models/gen-N/ema/state.pt (the average, for generation N + 1), atomically.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import torch

from gocore.atomic import output_dir
from nets.checkpoint import load, save, save_file
from nets.model import GoNet, MaskedBatchNorm
from stages import cli, layout
from stages.cli import InputError
from stages.params import Device, EmaParams, Section, TrainParams, read
from stages.spec import DvcStage, Plan, sections
from stages.window import batches, check_window, window_files, window_lineage

STATE_FORMAT = "tengen-ema-state-1"


class Params(Section):
    """What the EMA stage reads of params.yaml (train.tensor: the window's planes' size)."""

    ema: EmaParams
    train: TrainParams
    device: Device


@dataclasses.dataclass(frozen=True)
class EmaIO:
    generation: int
    snapshots: Path  # models/gen-N/train/snapshots
    window: Path  # data/windows/gen-N (for the batch-norm statistics)
    out: Path  # models/gen-N/ema
    previous: Path | None = None  # models/gen-(N-1)/ema


def dvc(n: int, plan: Plan) -> list[DvcStage]:
    """One EMA stage per net training in generation n (stages.lines)."""
    return [
        DvcStage(
            line.stage("ema", n), "stages.ema", f"--generation {n}{flags}", sections(Params),
            deps=(str(layout.train_dir(n, line.grown)), str(layout.window_dir(n)),
                  *([str(layout.ema_dir(n - 1, line.grown))] if before else [])),
            outs=(str(layout.ema_dir(n, line.grown)),),
        )
        for line, flags, before in plan.carried(n)
    ]  # fmt: skip


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
    if state.get("config") != config.as_dict():
        return None  # another net size (a promotion): the average starts again
    average = state.get("average")
    if not isinstance(average, dict):
        raise InputError(f"ema: {path} holds no average; rerun its ema stage")
    return average


def average(previous: dict | None, snapshots: list[dict], decay: float) -> dict:
    """The moving average of float tensors after the snapshots, in order, each keeping `decay`
    of the older average; it starts at the first snapshot when there is no previous average.
    Integer buffers take the last one's."""
    step = 1.0 - decay
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
                torch.as_tensor(arrays["globals"], device=device),
            )
            used += 1
    finally:
        for m, momentum in zip(norms, saved, strict=True):
            m.momentum = momentum
        model.train(was_training)
    return used


def run(params: Params, io: EmaIO) -> dict:
    device, tensor, params = params.device, params.train.tensor, params.ema
    paths = _snapshots(io.snapshots)
    snapshots, meta, config = [], {}, None
    for path in paths:
        model, meta = load(path, device=device)
        if config is not None and model.config != config:
            raise InputError(f"ema: {path} is a {model.config.name}, the others {config.name}")
        config = model.config
        snapshots.append({k: v.detach() for k, v in model.state_dict().items()})
    avg = average(_previous_average(io.previous, config, device), snapshots, params.decay)
    model = GoNet(config).to(device)
    try:
        model.load_state_dict(avg)
    except (KeyError, RuntimeError) as e:
        first = str(e).strip().splitlines()[0]
        raise InputError(
            f"ema: {io.previous / 'state.pt'}'s average does not fit a {config.name} net "
            f"({first}); rerun the ema stage that wrote it"
        ) from None
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
            tmp / layout.CANDIDATE,
            {
                "generation": io.generation,
                "model_id": f"gen-{io.generation}-{config.name}",
                "samples": meta.get("samples"),
                "window_digest": meta.get("window_digest"),
                "snapshots": len(paths),
            },
        )
        state = {
            "format": STATE_FORMAT,
            "config": config.as_dict(),
            "average": {k: v for k, v in model.state_dict().items()},
        }
        save_file(state, tmp / "state.pt")
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
        params = read(args.params, Params)
        cli.set_threads(params.ema.threads)
        net = args.net
        previous = args.previous or (
            layout.ema_dir(n - 1, net) if n > 0 and not args.fresh else None
        )
        io = EmaIO(
            generation=n,
            snapshots=args.snapshots or layout.snapshots_dir(n, net),
            window=args.window or layout.window_dir(n),
            out=args.out or layout.ema_dir(n, net),
            previous=previous,
        )
        metrics = run(params, io)
        if tracked is not None:
            track(tracked, io)
        return metrics

    return cli.finish("ema", work, Params, params=args.params, generation=n, net=args.net)


def track(tracked, io: EmaIO) -> None:
    """The candidate as an MLflow model, registered, with alias `candidate`: the checkpoint
    itself (it loads with torch.load(weights_only=True): nothing is unpickled), its version's
    tags giving the checkpoint's digest and the window (and so the games) it learned from."""
    import mlflow

    from stages.tracking import model_digest

    path = io.out / layout.CANDIDATE
    model, meta = load(path)
    _, manifest = window_files(io.window, "ema")
    lineage = window_lineage(tracked.tracker, manifest)
    tracked.log_window(io.window, manifest, context="training")
    digest = model_digest(path)
    tags = {
        "tengen.sha256": digest,
        "tengen.model_id": meta.get("model_id", ""),
        "tengen.generation": str(io.generation),
        "tengen.net": model.config.name,
        "tengen.format": "tengen checkpoint (nets.checkpoint.load)",
        **lineage,
    }
    client, name = tracked.client, tracked.tracker.model_name
    logged = mlflow.initialize_logged_model(name="candidate", tags=tags)
    client.log_model_artifact(logged.model_id, str(path))
    mlflow.finalize_logged_model(logged.model_id, "READY")
    version = str(mlflow.register_model(f"models:/{logged.model_id}", name).version)
    for key, value in tags.items():
        client.set_model_version_tag(name, version, key, value)
    client.set_registered_model_alias(name, "candidate", version)
    tracked.tag({**lineage, "tengen.candidate_sha256": digest, "tengen.model_version": version})


if __name__ == "__main__":
    sys.exit(main())
