"""Checkpoints: the config and the weights in one file, loaded without running code.

The file is a torch.save of plain data ({"format", "config", "state_dict", "meta"}), read back
with `torch.load(weights_only=True)`, so a model file from elsewhere cannot execute anything.
Saving is atomic (a temporary file renamed into place). Export: TorchScript, and ONNX when the
`onnx` package is installed.
"""

from __future__ import annotations

from pathlib import Path

import torch

from gocore.atomic import atomic_path
from nets.config import NetConfig
from nets.errors import CheckpointError
from nets.model import GoNet

FORMAT = "tengen-net-1"


def save(model: GoNet, path: str | Path, meta: dict | None = None) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "format": FORMAT,
        "config": model.config.as_dict(),
        "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "meta": dict(meta or {}),
    }
    save_file(payload, path)
    return path


def save_file(data, path: str | Path) -> None:
    """torch.save of `data` into `path`, atomically, the same bytes for the same data: saved
    through a file object, so the zip's inner folder is torch's "archive", not the name of
    the temporary file (which made every save differ and every DVC hash with it)."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        torch.save(data, f)


def load(
    path: str | Path, *, expect: NetConfig | None = None, device: str = "cpu"
) -> tuple[GoNet, dict]:
    """(model in eval mode, meta). Refuses files that are not tengen checkpoints, and with
    `expect`, a checkpoint of another net."""
    path = Path(path)
    try:
        payload = torch.load(path, map_location=device, weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path} does not exist", path=path) from None
    except Exception as e:  # noqa: BLE001 - torch raises many kinds on a corrupt file
        raise CheckpointError(
            f"checkpoint {path} cannot be read: not a torch checkpoint ({type(e).__name__}: {e})",
            path=path,
        ) from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path} is not a {FORMAT} file", path=path)
    try:
        config = NetConfig.from_dict(payload["config"])
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"checkpoint {path} has a bad net config: {e}", path=path) from None
    if expect is not None and config != expect:
        diff = {
            k: (v, expect.as_dict()[k])
            for k, v in config.as_dict().items()
            if v != expect.as_dict()[k]
        }
        raise CheckpointError(
            f"checkpoint {path} holds net {config.name}, not {expect.name}; "
            f"differs in (found, expected): {diff}",
            path=path,
        )
    model = GoNet(config)
    try:
        model.load_state_dict(payload["state_dict"], strict=True)
    except (KeyError, RuntimeError) as e:
        raise CheckpointError(
            f"checkpoint {path}: weights do not fit {config.name}: {e}", path=path
        ) from None
    return model.to(device).eval(), payload.get("meta", {})


class _Exported(torch.nn.Module):
    """Tuple outputs (policy, opponent_policy, outcome, score_mean, score_stdev, ownership,
    score_belief) for engines that cannot take a dict."""

    OUTPUTS = (
        "policy",
        "opponent_policy",
        "outcome",
        "score_mean",
        "score_stdev",
        "ownership",
        "score_belief",
    )

    def __init__(self, model: GoNet):
        super().__init__()
        self.model = model

    def forward(self, planes: torch.Tensor, glob: torch.Tensor):
        out = self.model(planes, glob)
        return tuple(out[name] for name in self.OUTPUTS)


def export_torchscript(model: GoNet, path: str | Path, board: int = 19) -> Path:
    path = Path(path)
    planes, glob = example_inputs(model.config, board)
    traced = torch.jit.trace(_Exported(model.eval()), (planes, glob), check_trace=False)
    traced.save(str(path))
    return path


def export_onnx(model: GoNet, path: str | Path, board: int = 19) -> Path:
    try:
        import onnx  # noqa: F401
    except ImportError:
        raise RuntimeError("ONNX export needs the onnx package: pip install onnx") from None
    path = Path(path)
    planes, glob = example_inputs(model.config, board)
    torch.onnx.export(
        _Exported(model.eval()),
        (planes, glob),
        str(path),
        input_names=["planes", "globals"],
        output_names=list(_Exported.OUTPUTS),
        dynamic_axes={"planes": {0: "batch"}, "globals": {0: "batch"}},
        dynamo=False,
    )
    return path


def example_inputs(config: NetConfig, board: int, batch: int = 2):
    planes = torch.zeros(batch, config.planes, board, board)
    planes[:, 0] = 1.0
    return planes, torch.zeros(batch, config.globals)
