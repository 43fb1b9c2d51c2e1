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

from gocore.atomic import write_text
from stages import layout
from stages.params import ParamsError, load_params

SOURCE = Path(__file__).resolve().parent.parent
PRESETS = Path(__file__).resolve().parent / "presets"


def presets() -> list[str]:
    return sorted(p.stem for p in PRESETS.glob("*.yaml"))


# Mappings a preset gives whole (weights of board sizes and rules, komi per size, the
# evaluation's opponents): a preset's replaces the base's map rather than adding to it.
WHOLE = {"board_sizes", "rules", "komi", "opponents"}


def merge(base: dict, change: dict, where: str = "") -> dict:
    """`base` with `change` on top, section by section; a key `base` lacks is an error (a
    preset cannot invent a setting)."""
    out = dict(base)
    for key, value in change.items():
        name = f"{where}{key}"
        if key not in base:
            raise ParamsError(f"preset: {name} is not a params.yaml key")
        if isinstance(value, dict) and isinstance(base[key], dict) and key not in WHOLE:
            out[key] = merge(base[key], value, name + ".")
        else:
            out[key] = value
    return out


def preset_change(name: str) -> tuple[dict, str]:
    """A preset's changes and its comment lines."""
    path = PRESETS / f"{name}.yaml"
    if not path.is_file():
        raise ParamsError(f"no preset {name!r}; presets: {', '.join(presets())}")
    try:
        change = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ParamsError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(change, dict):
        raise ParamsError(f"{path}: expected a mapping of params.yaml sections")
    header = "".join(
        line for line in path.read_text().splitlines(keepends=True) if line.startswith("#")
    ).rstrip()
    return change, header


def preset_params(
    name: str | None, base: Path, change: dict | None = None, note: str | None = None
) -> str:
    """params.yaml's text for a preset (None: none) with `change` on top of it: the base
    file's values with the preset's and then `change`'s on top, written as YAML after a header
    naming them and carrying the preset's comment lines and `note` (the keys' own comments are
    in the source tree's params.yaml)."""
    merged = load_params(base)
    lines = [f"# params.yaml of a tengen run: {base}"
             + (f" with preset {name!r} on top." if name else ".")]  # fmt: skip
    if name is not None:
        preset, header = preset_change(name)
        try:
            merged = merge(merged, preset)
        except ParamsError as e:
            raise ParamsError(f"{PRESETS / f'{name}.yaml'}: {e}") from None
        lines += ["# The preset's notes:", header] if header else []
    if change:
        merged = merge(merged, change)
    if note:
        lines += [f"# {line}" for line in note.splitlines()]
    return "\n".join(lines) + "\n\n" + yaml.safe_dump(merged, sort_keys=False, width=100)


def _run(folder: Path, *cmd: str) -> None:
    try:
        subprocess.run(cmd, cwd=folder, check=True, capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError) as e:
        output = getattr(e, "stderr", "") or getattr(e, "stdout", "") or str(e)
        message = f"making the run folder {folder}: {' '.join(cmd)} failed: {output}"
        raise ParamsError(message) from None


def create_run(
    folder: Path,
    preset: str | None,
    base: Path = SOURCE / "params.yaml",
    *,
    change: dict | None = None,
    note: str | None = None,
) -> Path:
    """A new run folder with the preset's params.yaml (and `change` on top), as a git
    repository with DVC, made beside `folder` and renamed into place when whole. The stages
    are the installed tengen's (dvc.yaml without code deps)."""
    from flows.pipeline import write_dvc_yaml
    from gocore.atomic import output_dir

    if folder.exists():
        raise ParamsError(f"{folder} exists but has no params.yaml; remove it or pick another")
    text = preset_params(preset, base, change, note)
    with output_dir(folder) as tmp:
        write_text(text, tmp / "params.yaml")
        write_dvc_yaml(tmp / "params.yaml", tmp / "dvc.yaml", code_deps=False)
        write_text("mlflow.db\nmlartifacts/\n", tmp / ".gitignore")
        _run(tmp, "git", "init", "-q")
        _run(tmp, sys.executable, "-m", "dvc", "init", "-q")
        write_text("mlflow.db\nmlartifacts/\n", tmp / ".dvcignore")
        _run(tmp, "git", "add", "-A")
        message = f"tengen run, preset {preset}" if preset else "tengen run"
        _run(tmp, "git", "-c", "user.name=tengen", "-c", "user.email=tengen@localhost",
             "commit", "-qm", message)  # fmt: skip
    return folder


def set_generations(params_path: Path, generations: int) -> None:
    """Set `run.generations` in params.yaml, keeping the file's comments: the line of the
    `generations:` key directly inside the top-level `run:` block."""
    if isinstance(generations, bool) or not isinstance(generations, int) or generations < 1:
        raise ParamsError(
            f"{params_path}: run.generations must be a whole number >= 1 (got {generations!r})"
        )
    lines = params_path.read_text().splitlines(keepends=True)
    inside, indent = False, None
    for i, text in enumerate(lines):
        if not text.strip() or text.lstrip().startswith("#"):
            continue
        if not text[0].isspace():  # a top-level key
            inside = text.startswith("run:")
            indent = None
            continue
        if not inside:
            continue
        width = len(text) - len(text.lstrip())
        indent = width if indent is None else indent
        key = _KEY.match(text)
        if width == indent and key and key.group(2) == "generations":
            lines[i] = f"{key.group(1)}generations: {generations}{key.group(3) or ''}\n"
            write_text("".join(lines), params_path)
            return
    raise ParamsError(f"{params_path}: no `run:` section with a `generations:` key")


_KEY = re.compile(r"^(\s*)([A-Za-z_]+):[^#\n]*?(\s*#.*)?$")


def completed_generations(repo: Path) -> int:
    """How many generations, from 0 on, have been promoted (their promote stage has run)."""
    n = 0
    while (repo / layout.promotion(n)).is_file():
        n += 1
    return n


def where(repo: Path) -> str:
    """Where a run's results are: the champion, the MLflow UI, the reports."""
    import json

    repo = repo.resolve()
    done = completed_generations(repo)
    lines = []
    if done:
        promotion = json.loads((repo / layout.promotion(done - 1)).read_text())
        champion = promotion.get("champion")
        if champion:
            path = repo / layout.champion(done - 1)
            lines.append(
                f"champion:  {path} ({champion['id']}, a {champion.get('net', '?')}, "
                f"promoted at generation {champion['generation']})"
            )
        else:
            lines.append("champion:  none yet (no candidate has passed its gate)")
    lines.append(f"MLflow UI: tengen ui --repo {repo}   (then http://127.0.0.1:5000)")
    lines.append(f"reports:   {repo / layout.REPORTS} (selfplay/, train/, gate/, eval/)")
    page = repo / layout.REPORTS / "report" / "index.html"
    if page.is_file():
        lines.append(f"report:    {page}   (tengen report --help)")
    lines.append(f"plots:     cd {repo} && dvc plots show   (then open dvc_plots/index.html)")
    return "\n".join(lines)
