"""Run folders: where a training run lives, how one is made from a preset, how many
generations it asks for, and where its results are.

A run folder is a git repository with DVC: params.yaml (the source tree's, with a preset's
changes on top), the dvc.yaml generated from it, and, once it has run, data/, models/,
reports/, dvc.lock, mlflow.db. The source tree is itself the default run folder (`make run`).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

from stages.atomic import write_text
from stages.params import ParamsError, load_params

SOURCE = Path(__file__).resolve().parent.parent
PRESETS = Path(__file__).resolve().parent / "presets"


def presets() -> list[str]:
    return sorted(p.stem for p in PRESETS.glob("*.yaml"))


def merge(base: dict, change: dict, where: str = "") -> dict:
    """`base` with `change` on top, section by section; a key `base` lacks is an error (a
    preset cannot invent a setting)."""
    out = dict(base)
    for key, value in change.items():
        name = f"{where}{key}"
        if key not in base:
            raise ParamsError(f"preset: {name} is not a params.yaml key")
        if isinstance(value, dict) and isinstance(base[key], dict) and key != "board_sizes":
            out[key] = merge(base[key], value, name + ".")
        else:
            out[key] = value
    return out


def preset_params(name: str, base: Path) -> str:
    """params.yaml's text for a preset: the base file's text with the preset's values put in
    (written as YAML after a header naming the preset; the base's comments are in the
    source tree's params.yaml)."""
    path = PRESETS / f"{name}.yaml"
    if not path.is_file():
        raise ParamsError(f"no preset {name!r}; presets: {', '.join(presets())}")
    change = yaml.safe_load(path.read_text()) or {}
    merged = merge(load_params(base), change)
    header = path.read_text().split("\n\n", 1)[0]
    return (
        f"# params.yaml of a tengen run: {base} with preset {name!r} on top.\n"
        f"# The preset's notes:\n{header}\n\n" + yaml.safe_dump(merged, sort_keys=False, width=100)
    )


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True)


def create_run(folder: Path, preset: str, base: Path = SOURCE / "params.yaml") -> Path:
    """A new run folder with the preset's params.yaml, as a git repository with DVC. The
    stages are the installed tengen's (dvc.yaml without code deps)."""
    from flows.pipeline import write_dvc_yaml

    folder.mkdir(parents=True, exist_ok=True)
    write_text(preset_params(preset, base), folder / "params.yaml")
    write_dvc_yaml(folder / "params.yaml", folder / "dvc.yaml", code_deps=False)
    write_text("mlflow.db\nmlartifacts/\n", folder / ".gitignore")
    _git(folder, "init", "-q")
    subprocess.run(
        [sys.executable, "-m", "dvc", "init", "-q"],
        cwd=folder, check=True, capture_output=True, text=True,
    )  # fmt: skip
    write_text("mlflow.db\nmlartifacts/\n", folder / ".dvcignore")
    _git(folder, "add", "-A")
    _git(
        folder,
        "-c",
        "user.name=tengen",
        "-c",
        "user.email=tengen@localhost",
        "commit",
        "-qm",
        f"tengen run, preset {preset}",
    )
    return folder


_RUN_GENERATIONS = re.compile(
    r"^(run:\s*\n(?:[ \t]+.*\n|\s*\n)*?[ \t]+generations:[ \t]*)(\d+)", re.M
)


def set_generations(params_path: Path, generations: int) -> None:
    """Set `run.generations` in params.yaml, keeping the file's comments."""
    if isinstance(generations, bool) or not isinstance(generations, int) or generations < 1:
        raise ParamsError(f"run.generations must be a whole number >= 1 (got {generations!r})")
    text = params_path.read_text()
    new, count = _RUN_GENERATIONS.subn(lambda m: f"{m.group(1)}{generations}", text, count=1)
    if count != 1:
        raise ParamsError(f"{params_path}: no `run:` section with a `generations:` key")
    write_text(new, params_path)


def completed_generations(repo: Path) -> int:
    """How many generations, from 0 on, have been promoted (their promote stage has run)."""
    n = 0
    while (repo / f"models/gen-{n}/champion/promotion.json").is_file():
        n += 1
    return n


def where(repo: Path) -> str:
    """Where a run's results are: the champion, the MLflow UI, the reports."""
    import json

    repo = repo.resolve()
    done = completed_generations(repo)
    lines = []
    if done:
        folder = repo / f"models/gen-{done - 1}/champion"
        promotion = json.loads((folder / "promotion.json").read_text())
        champion = promotion.get("champion")
        if champion:
            path = folder / "champion.pt"
            lines.append(
                f"champion:  {path} ({champion['id']}, promoted at generation "
                f"{champion['generation']})"
            )
        else:
            lines.append("champion:  none yet (no candidate has passed its gate)")
    lines.append(f"MLflow UI: tengen ui --repo {repo}   (then http://127.0.0.1:5000)")
    lines.append(f"reports:   {repo / 'reports'} (selfplay/, train/, gate/)")
    lines.append(f"plots:     cd {repo} && dvc plots show")
    return "\n".join(lines)
