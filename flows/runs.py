"""Run folders: where a training run lives, how one is made from a preset, how many
generations it asks for, and where its results are.

A run folder is a git repository with DVC: params.yaml (the source tree's, with a preset's
changes on top), the dvc.yaml generated from it, and, once it has run, data/, models/,
reports/, dvc.lock, mlflow.db. The source tree is itself the default run folder (`make run`).
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

from gocore.atomic import write_text
from play.defaults import DEFAULTS
from stages import layout
from stages.params import ParamsError, load_params

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


def _run(folder: Path, *cmd: str, doing: str | None = None) -> None:
    try:
        subprocess.run(cmd, cwd=folder, check=True, capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError) as e:
        output = getattr(e, "stderr", "") or getattr(e, "stdout", "") or str(e)
        doing = doing or f"making the run folder {folder}"
        raise ParamsError(f"{doing}: {' '.join(cmd)} failed: {output}") from None


def create_run(
    folder: Path,
    preset: str | None,
    base: Path = DEFAULTS,
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
        write_text(text, tmp / layout.PARAMS)
        write_dvc_yaml(tmp / layout.PARAMS, tmp / "dvc.yaml", code_deps=False)
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
    """Set `run.generations` in params.yaml, keeping the file's comments."""
    if isinstance(generations, bool) or not isinstance(generations, int) or generations < 1:
        raise ParamsError(
            f"{params_path}: run.generations must be a whole number >= 1 (got {generations!r})"
        )
    set_run_key(params_path, "generations", str(generations))


def set_run_key(params_path: Path, name: str, value: str) -> None:
    """Set `run.<name>` to the YAML `value` in params.yaml, keeping the file's comments."""
    write_text(_with_run_key(params_path, name, value), params_path)


def _with_run_key(params_path: Path, name: str, value: str) -> str:
    """params.yaml's text with `run.<name>: value`: on the line of the key directly inside
    the top-level `run:` block, or a new line after `generations:` where a file from before
    the key has none."""
    lines = params_path.read_text().splitlines(keepends=True)
    inside, indent, after = False, None, None
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
        if width == indent and key and key.group(2) == name:
            lines[i] = f"{key.group(1)}{name}: {value}{key.group(3) or ''}\n"
            return "".join(lines)
        if width == indent and key and key.group(2) == "generations":
            after = (i, key.group(1))
    if after is None:
        raise ParamsError(f"{params_path}: no `run:` section with a `generations:` key")
    i, lead = after
    if not lines[i].endswith("\n"):  # the file's last line
        lines[i] += "\n"
    lines.insert(i + 1, f"{lead}{name}: {value}\n")
    return "".join(lines)


def add_remote(folder: Path, url: str, name: str = "storage") -> str:
    """Make `url` (a path, s3://, gs://, ssh://... as DVC takes them) the run's default DVC
    remote and turn run.push on; returns the URL as configured (a path made absolute)."""
    if not (folder / ".dvc").is_dir() or not (folder / layout.PARAMS).is_file():
        raise ParamsError(f"{folder}: not a run folder (no .dvc/ or params.yaml); make one "
                          "with `tengen run --preset NAME`")  # fmt: skip
    if is_source_tree(folder):
        raise ParamsError(f"{folder}: the source tree is no run folder to push; make one with "
                          "`tengen run --preset NAME`")  # fmt: skip
    if not url.strip():
        raise ParamsError("tengen remote add: the remote's URL is empty")
    if "://" not in url:
        path = Path(url).expanduser().resolve()
        if path == folder.resolve() or folder.resolve() in path.parents:
            raise ParamsError(f"remote {url}: inside the run folder {folder}, whose git would "
                              "take it in; put the remote outside it")  # fmt: skip
        url = str(path)
    params = folder / layout.PARAMS
    text = _with_run_key(params, "push", "true")  # checked before anything changes
    _run(folder, sys.executable, "-m", "dvc", "remote", "add", "--default", "--force", name, url,
         doing=f"adding the DVC remote {url} to {folder}")  # fmt: skip
    write_text(text, params)
    return url


def is_source_tree(folder: Path) -> bool:
    """Whether `folder` is a checkout of tengen's source (its dvc.yaml has code deps, and
    it is no run folder to commit and push), not a run folder."""
    return (Path(folder) / "gocore").is_dir()


def check_push(repo: Path) -> None:
    """ParamsError unless run.push can work in `repo`: a run folder with a default remote."""
    if is_source_tree(repo):
        raise ParamsError(f"{repo / layout.PARAMS}: run.push is true in the source tree, which "
                          "is no run folder to commit and push; make one with "
                          "`tengen run --preset NAME`")  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "dvc", "remote", "default"], cwd=repo,
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0 or not done.stdout.strip():
        raise ParamsError(f"{repo / layout.PARAMS}: run.push is true but the run has no default "
                          "DVC remote; add one with `tengen remote add PATH|s3://...`")  # fmt: skip


class PushError(RuntimeError):
    """A push that failed: the generation is done here, and the next run pushes it again."""


# What a push commits: the files DVC leaves to git (its outputs with `cache: false`, the
# metrics, are all under reports/; the .gitignore files DVC writes for its cached outputs), and
# nothing else a run folder may hold.
COMMITTED = (layout.PARAMS, "dvc.yaml", "dvc.lock", ".dvc", ".dvcignore", ".gitignore", "reports")
PUSH_TIMEOUT = 6 * 3600  # seconds for one command of a push: a big generation on a slow link


def push_generation(repo: Path, generation: int, message: str | None = None) -> list[str]:
    """Generation `generation` off the machine: a git commit (`message`, default "generation
    N") of what DVC does not cache (COMMITTED: dvc.lock, params.yaml, dvc.yaml, the metrics,
    the run's page), `dvc push` to the default remote, and `git push` where the branch has an
    upstream. Nothing prompts (a remote that asks for credentials fails instead of waiting on
    a terminal nobody watches). Returns what was done, line by line."""
    done = []
    env = dict(os.environ, GIT_TERMINAL_PROMPT="0")
    env.setdefault("GIT_SSH_COMMAND", "ssh -o BatchMode=yes")

    def run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
        what = " ".join(cmd).replace(f"{sys.executable} -m ", "")
        try:
            out = subprocess.run(cmd, cwd=repo, capture_output=True, text=True, env=env,
                                 timeout=PUSH_TIMEOUT, stdin=subprocess.DEVNULL)  # fmt: skip
        except subprocess.TimeoutExpired:
            out = subprocess.CompletedProcess(cmd, 1, "", f"no answer in {PUSH_TIMEOUT} s")
        if check and out.returncode != 0:
            output = (out.stderr or out.stdout).strip()[-2000:]
            raise PushError(
                f"generation {generation}: {what} failed: {output}; the generation is done "
                "here: `tengen run` again pushes it and goes on"
            )
        return out

    paths = [p for p in COMMITTED if (repo / p).exists()]
    if (repo / ".gitignore").exists():
        paths.append(":(glob)**/.gitignore")
    run("git", "add", "-A", "--", *paths)
    if run("git", "diff", "--cached", "--quiet", check=False).returncode != 0:
        message = message or f"generation {generation}"
        run("git", "-c", "user.name=tengen", "-c", "user.email=tengen@localhost",
            "-c", "commit.gpgsign=false", "commit", "-qm", message)  # fmt: skip
        done.append(f"git: committed {message}")
    pushed = run(sys.executable, "-m", "dvc", "push").stdout.strip().splitlines()
    done.append(f"dvc push: {pushed[-1] if pushed else 'done'}")
    upstream = run("git", "rev-parse", "--abbrev-ref", "@{upstream}", check=False)
    if upstream.returncode == 0:
        run("git", "push", "-q")
        done.append(f"git push to {upstream.stdout.strip()}")
    return done


_KEY = re.compile(r"^(\s*)([A-Za-z_]+):[^#\n]*?(\s*#.*)?$")


def completed_generations(repo: Path) -> int:
    """How many generations, from 0 on, have been promoted (their promote stage has run)."""
    n = 0
    while (repo / layout.promotion(n)).is_file():
        n += 1
    return n


def _runs_link(repo: Path) -> str:
    """The MLflow UI's page of the run's training runs (the UI itself without a store yet)."""
    from stages import tracking

    try:
        params = tracking.settings(load_params(repo / layout.PARAMS), repo / layout.PARAMS)
    except ParamsError:
        params = None
    if params is None:
        return tracking.LOCAL_UI
    ui = tracking.ui_of(tracking.store_uri(params, repo))
    found = tracking.experiment_id_of(params, repo)
    return tracking.runs_url(ui, found) if found is not None else ui


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
    lines.append(f"MLflow UI: tengen ui --repo {repo}   (then {_runs_link(repo)})")
    lines.append(f"reports:   {repo / layout.REPORTS} (selfplay/, train/, gate/, eval/)")
    page = repo / layout.REPORTS / "report" / "index.html"
    if page.is_file():
        lines.append(f"report:    {page}   (tengen report --help)")
    lines.append(f"plots:     cd {repo} && dvc plots show   (then open dvc_plots/index.html)")
    return "\n".join(lines)


class RunLocked(RuntimeError):
    """Another `tengen run` holds the run folder."""


_held: dict[Path, object] = {}  # this process's locks: folder -> its open lock file


@contextlib.contextmanager
def run_lock(repo: Path, command: str | None = None):
    """Hold the run folder for this process: a second `tengen run` on it (another terminal)
    gets RunLocked at once, naming the process that holds it and since when, before it
    touches anything. The operating system's lock (flock) ends with the process that took it,
    so a killed run leaves no lock behind, only the file that said who held it. Re-entrant in
    one process (the CLI takes it, then the loop flow it calls)."""
    import fcntl
    import json
    import socket
    from datetime import datetime

    key = repo.resolve()
    if key in _held:  # taken further up this process: held until that one lets go
        yield
        return
    if not (key / ".dvc").is_dir():
        raise ParamsError(f"{key} is no run folder (no .dvc/): make one with `tengen run "
                          "--preset NAME`, or run in the source tree")  # fmt: skip
    path = key / layout.RUN_LOCK
    try:
        path.parent.mkdir(exist_ok=True)
        handle = open(path, "a+")  # noqa: SIM115 - held open while the run goes on
    except OSError as e:
        raise ParamsError(f"{path}: cannot write the run's lock ({e.strerror})") from None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        try:
            holder = json.loads(handle.read() or "{}")
        except json.JSONDecodeError:
            holder = {}
        handle.close()
        who = f"process {holder.get('pid', '?')} on {holder.get('host', '?')}"
        raise RunLocked(
            f"{key} is in use by another tengen run ({who}, started "
            f"{holder.get('started', '?')}: {holder.get('command', '?')}); wait for it to end "
            f"or stop it (kill {holder.get('pid', 'PID')}), then run again. This run changed "
            "nothing."
        ) from None
    except OSError as e:  # a file system without locks (NFS without its lock daemon)
        print(f"tengen run: warning: {path} cannot be locked ({e.strerror}): a second run on "
              "this folder would not be stopped", file=sys.stderr)  # fmt: skip
    handle.seek(0)
    handle.truncate()
    handle.write(json.dumps({
        "pid": os.getpid(), "host": socket.gethostname(),
        "started": datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": command or " ".join(["tengen", *sys.argv[1:]]),
    }))  # fmt: skip
    handle.flush()
    _held[key] = handle
    try:
        yield
    finally:
        del _held[key]
        handle.close()  # the flock goes with it; the file stays, unlocked
