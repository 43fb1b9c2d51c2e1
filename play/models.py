"""Which net to play: a checkpoint path, a champion folder, an MLflow model
URI (`models:/tengen@champion`, `runs:/<id>/candidate`), or `uniform` (generation 0's uniform
priors and even value: the search alone), loaded as the search's evaluator.

Every path ends at a tengen checkpoint read with `torch.load(weights_only=True)`: an MLflow
model is the checkpoint itself (stages.ema logs it so), fetched and never unpickled. (A run
folder's newest champion is found by the CLI, which knows the run's layout.)
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from play.mlflow_store import said, shown, tracking_uri_for
from play.names import CHAMPION


class ModelError(ValueError):
    """A model that cannot be found or read; the message says what and where."""


UNIFORM = "uniform"
MLFLOW_SCHEMES = ("models:/", "runs:/")


def resolve(spec: str, *, tracking_uri: str | None = None) -> Path | None:
    """The checkpoint file that `spec` names (None for `uniform`)."""
    if spec == UNIFORM:
        return None
    if spec.startswith(MLFLOW_SCHEMES):
        return _from_mlflow(spec, tracking_uri)
    path = Path(spec).expanduser()
    if path.is_dir() and (path / CHAMPION).is_file():
        return path / CHAMPION
    if path.is_file():
        return path
    raise ModelError(f"--model {spec}: no such file or folder (a checkpoint, a run folder, or an "
                     "MLflow URI such as models:/tengen@champion)")  # fmt: skip


def _from_mlflow(uri: str, tracking_uri: str | None) -> Path:
    import mlflow
    from mlflow.exceptions import MlflowException

    # MLflow resolves a models:/ URI in the global registry whatever store the call is
    # given, so the store is set for the call and put back (tracking_uri_for).
    target = Path(tempfile.mkdtemp(prefix="tengen-model-"))
    # No progress bar on stderr: a GUI shows an engine's stderr as its log.
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    try:
        with tracking_uri_for(tracking_uri):
            local = Path(
                mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(target))
            )
    except MlflowException as e:
        where = shown(tracking_uri or mlflow.get_tracking_uri())
        raise ModelError(f"--model {uri}: not fetched from the MLflow store {where}: "
                         f"{said(e)}") from None  # fmt: skip
    checkpoints = sorted(local.rglob("*.pt")) if local.is_dir() else [local]
    if not checkpoints:
        raise ModelError(f"--model {uri}: the MLflow model carries no tengen checkpoint (*.pt)")
    return checkpoints[0]


def load_evaluator(path: Path | None, *, device: str = "cpu", seed: int = 0, compile: str = "none"):
    """(the net as the search's evaluator, its model id) for a checkpoint, or the uniform
    priors for None; CheckpointError for a file that is not a checkpoint. `compile`:
    torch.compile's mode for the net (nets.evaluator.COMPILE_MODES)."""
    if path is None:
        from gocore.selfplay import UniformNet

        return UniformNet(seed), UNIFORM
    from nets.checkpoint import load
    from nets.evaluator import Evaluator

    net, meta = load(path, device=device)
    model_id = meta.get("model_id") or (
        f"{net.config.name}-{hashlib.sha256(Path(path).read_bytes()).hexdigest()[:12]}"
    )
    return Evaluator(net, device=device, compile=compile), str(model_id)


def evaluator_from_bytes(
    model: bytes | None,
    *,
    source: str | Path,
    device: str = "cpu",
    seed: int = 0,
    compile: str = "none",
):
    """load_evaluator on a checkpoint's bytes (None: the uniform priors): what a shard on a
    cluster's worker plays with, where the stage's files may not be seen. A bad checkpoint's
    error names `source`, the file the bytes were read from."""
    from nets.checkpoint import CheckpointError

    if model is None:
        return load_evaluator(None, device=device, seed=seed)
    with tempfile.TemporaryDirectory(prefix="tengen-model-") as folder:
        path = Path(folder) / CHAMPION
        path.write_bytes(model)
        try:
            return load_evaluator(path, device=device, seed=seed, compile=compile)
        except CheckpointError as e:
            raise CheckpointError(
                str(e).replace(str(path), str(source)), path=Path(source)
            ) from None
