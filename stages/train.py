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
import json
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from pydantic import Field

from nets.checkpoint import save
from nets.config import SIZES, net_config
from nets.losses import LossWeights, loss_terms
from nets.model import GoNet
from stages import cli
from stages.atomic import output_dir, write_json
from stages.cli import InputError
from stages.lines import line_for
from stages.params import ParamsError, Section, device_of, load_params, section
from stages.rows import SCHEMA, training_arrays

STATE_FORMAT = "tengen-train-state-1"


class TrainParams(Section):
    """params.yaml `train:`."""

    net: str
    tensor: int = Field(ge=2, le=19)  # the input planes' size (the largest board trained on)
    batch_size: int = Field(ge=1)
    samples_per_generation: int = Field(ge=1)
    lr_per_sample: float = Field(gt=0)
    warmup_samples: int = Field(ge=0)
    warmup_factor: float = Field(gt=0, le=1)
    momentum: float = Field(ge=0, lt=1)
    snapshots: int = Field(ge=1)
    seed: int
    threads: int = Field(ge=0)  # torch CPU threads; 0: torch's default


@dataclasses.dataclass(frozen=True)
class TrainIO:
    generation: int
    window: Path  # data/windows/gen-N (manifest.json and part-K.parquet)
    out: Path  # models/gen-N/train
    metrics: Path  # reports/train/gen-N.json
    previous: Path | None = None  # models/gen-(N-1)/train, whose state.pt this resumes from
    device: str = "cpu"


def window_files(window: Path, stage: str = "train") -> tuple[list[Path], dict]:
    """The window's non-empty files and its manifest, checked; InputError naming `stage`."""
    manifest_path = window / "manifest.json"
    try:
        manifest = json.loads(manifest_path.read_text())
    except FileNotFoundError:
        raise InputError(
            f"{stage}: {manifest_path} does not exist; run the shuffle stage first"
        ) from None
    except json.JSONDecodeError as e:
        raise InputError(
            f"{stage}: {manifest_path} is not valid JSON ({e}); rerun shuffle"
        ) from None
    files = [window / f["name"] for f in manifest.get("files", []) if f.get("rows", 0) > 0]
    if not files:
        raise InputError(f"{stage}: the window {window} has no rows; rerun the shuffle stage")
    for path in files:
        try:
            schema = pq.read_schema(path)
        except (OSError, ValueError) as e:
            raise InputError(
                f"{stage}: window file {path} is unreadable ({e}); rerun shuffle"
            ) from None
        if not schema.equals(SCHEMA, check_metadata=False):
            raise InputError(f"{stage}: window file {path} does not have the rows schema")
    return files, manifest


def batches(
    files: list[Path], batch_size: int, tensor: int, rng: np.random.Generator, stage: str = "train"
):
    """Endless training batches: the files in a random order, each one's rows permuted, each
    row under a random symmetry; a file's last rows fill the next batch with the next file's.
    One file in memory at a time (plus less than a batch of the one before). The window must
    hold a batch (see `check_window`)."""
    leftover = None
    while True:
        for i in rng.permutation(len(files)):
            try:
                table = pq.read_table(files[i])
            except (OSError, ValueError) as e:
                raise InputError(
                    f"{stage}: window file {files[i]} is unreadable ({e}); rerun shuffle"
                ) from None
            table = table.take(rng.permutation(table.num_rows))
            if leftover is not None:
                table = pa.concat_tables([leftover, table])
            full = table.num_rows - table.num_rows % batch_size
            for start in range(0, full, batch_size):
                part = table.slice(start, batch_size)
                try:
                    arrays = training_arrays(part, tensor, rng.integers(0, 8, batch_size))
                except ValueError as e:
                    raise InputError(f"{stage}: {e} (params.yaml train.tensor)") from None
                yield arrays
            leftover = table.slice(full)


def check_window(manifest: dict, batch_size: int, stage: str, key: str) -> None:
    rows = int(manifest.get("window_rows") or 0)
    if rows < batch_size:
        raise InputError(
            f"{stage}: the window has {rows} rows, fewer than one batch ({key} = {batch_size}); "
            "play more self-play games or lower the batch size"
        )


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
        return GoNet(net_config(params.net)).to(device), None, 0
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
    model = GoNet(net_config(params.net)).to(device)
    model.load_state_dict(state["model"])
    return model, state["optimizer"], int(state["samples"])


def run(params: TrainParams, weights: LossWeights, io: TrainIO) -> dict:
    if params.net not in SIZES:
        raise ParamsError(f"train.net: unknown net {params.net!r}; known: {', '.join(SIZES)}")
    if params.threads:
        torch.set_num_threads(params.threads)
    files, manifest = window_files(io.window)
    check_window(manifest, params.batch_size, "train", "train.batch_size")
    if params.samples_per_generation < params.batch_size * params.snapshots:
        raise ParamsError(
            f"train: samples_per_generation ({params.samples_per_generation}) must give every "
            f"one of the {params.snapshots} snapshots at least one batch of {params.batch_size}"
        )
    model, optimizer_state, samples = _load_state(io.previous, params, io.device)
    optimizer = torch.optim.SGD(
        model.parameters(), lr=params.lr_per_sample, momentum=params.momentum
    )
    if optimizer_state is not None:
        optimizer.load_state_dict(optimizer_state)
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
        data = batches(files, params.batch_size, params.tensor, rng)
        for step in range(1, steps + 1):
            arrays = next(data)
            batch = {k: torch.as_tensor(v, device=io.device) for k, v in arrays.items()}
            planes, glob = batch.pop("planes"), batch.pop("glob")
            warm = samples < params.warmup_samples
            lr = params.lr_per_sample * params.batch_size * (params.warmup_factor if warm else 1.0)
            for group in optimizer.param_groups:
                group["lr"] = lr
            terms = loss_terms(model(planes, glob), batch, planes[:, 0], model, weights)
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
        torch.save(
            {
                "format": STATE_FORMAT,
                "net": params.net,
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "samples": samples,
                "generation": io.generation,
            },
            tmp / "state.pt",
        )
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
) -> tuple[TrainParams, LossWeights, TrainIO]:
    """The stage's parameters and paths: train.net's (models/gen-N/train, ...), or with
    `net`, a grown net's (models/gen-N/<net>/train, ...: stages.lines). The previous
    generation's state is resumed unless `fresh` (a net's first generation)."""
    raw = load_params(params_path)
    params = section(raw, "train", TrainParams, source=params_path)
    try:
        weights = LossWeights.from_params(raw.get("loss"), where=f"{params_path}: loss")
    except ValueError as e:
        raise ParamsError(str(e)) from None
    line = line_for(net)
    if net:
        params = params.model_copy(update={"net": net})
    if previous is None and generation > 0 and not fresh:
        previous = line.train_dir(generation - 1)
    io = TrainIO(
        generation=generation,
        window=Path(window or f"data/windows/gen-{generation}"),
        out=Path(out or line.train_dir(generation)),
        metrics=Path(metrics or line.report("train", generation)),
        previous=Path(previous) if previous is not None else None,
        device=device_of(raw, params_path),
    )
    return params, weights, io


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
        params, weights, io = prepare(
            args.params, args.generation, window=args.window, out=args.out,
            metrics=args.metrics, previous=args.previous, net=args.net, fresh=args.fresh,
        )  # fmt: skip
        metrics = run(params, weights, io)
        if tracked is not None:
            track(tracked, io, metrics)
        return {k: v for k, v in metrics.items() if k != "snapshots"}

    return cli.finish("train", work, params=args.params, generation=args.generation, net=args.net)


def window_lineage(tracker, manifest: dict) -> dict[str, str]:
    """The tags that tie a model to its window (its manifest): the window's digest, the
    shuffle run that made it and the self-play runs it draws from (looked up by digest)."""
    digest = manifest.get("digest", "")
    tags = {"tengen.window_sha256": digest}
    runs = tracker.runs(
        f"tags.`tengen.stage` = 'shuffle' and tags.`tengen.window_sha256` = '{digest}'"
        " and attributes.status = 'FINISHED'",
        max_results=1,
    )
    if runs:
        tags["tengen.shuffle_run"] = runs[0].info.run_id
        tags["tengen.selfplay_runs"] = runs[0].data.tags.get("tengen.selfplay_runs", "")
    return tags


def track(tracked, io: TrainIO, metrics: dict) -> None:
    """The window as the run's input dataset, its lineage as tags, each snapshot's losses
    as a step (samples seen)."""
    _, manifest = window_files(io.window)
    tracked.log_window(io.window, manifest, context="training")
    tracked.tag(window_lineage(tracked.tracker, manifest))
    for snap in metrics["snapshots"]:
        tracked.log_metrics(
            {f"snapshot.{k}": v for k, v in snap.items() if k not in ("snapshot", "samples")},
            step=snap["samples"],
        )


if __name__ == "__main__":
    sys.exit(main())
