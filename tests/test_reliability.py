"""The stages under bad input and real kills: every bad params.yaml value gives exit status 2
naming its key (a property test), a stage killed with SIGKILL anywhere leaves nothing behind and
its rerun gives the outputs of an unkilled run, broken inputs are named with the stage to rerun,
and every project module a stage's command imports is among its dvc.yaml code deps."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gocore import atomic
from stages import layout
from tests.conftest import REPO

# Generation 0's stages, in order, with their outputs (folders and files; timing-free).
STAGES = {
    "selfplay": [layout.selfplay_dir(0)],
    "shuffle": [layout.window_dir(0)],
    "train": [layout.train_dir(0)],
    "ema": [layout.ema_dir(0)],
    "gate": [layout.gate_games(0)],
    "promote": [layout.champion_dir(0)],
    "evaluate": [],
}


def tiny_params() -> dict:
    """params.yaml for a run of seconds: 5x5, a b2c16 net, tracking off, the evaluation
    against the random player only."""
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["selfplay"].update(games=4, slots=4, full_visits=8, cheap_visits=2, decided_visits=2,
                              board_sizes={5: 1.0})  # fmt: skip
    params["shuffle"].update(window_c=100, rows_per_file=30)
    params["train"].update(net="b2c16", tensor=5, batch_size=16, samples_per_generation=128,
                           warmup_samples=0, threads=1)  # fmt: skip
    params["ema"].update(bn_batches=1, bn_batch_size=16, threads=1)
    params["gate"].update(games=4, slots=2, visits=4, board_size=5, komi=0.5, win_fraction=0.0)
    params["evaluate"].update(
        every=1, games=2, board_size=5, komi=0.5, visits=2, past_champions=0, workers=1,
        opponents={"random": "{tengen} gtp --player random --seed 1"}, anchor="random",
        referee=None,
    )  # fmt: skip
    params["mlflow"]["enabled"] = False
    params["run"]["generations"] = 1
    return params


def stage_command(stage: str, params: str = "params.yaml") -> list[str]:
    extra = ["--quiet"] if stage == "selfplay" else []
    return [sys.executable, "-m", f"stages.{stage}", "--generation", "0", "--params", params,
            *extra]  # fmt: skip


def run_stage(folder: Path, stage: str, env: dict | None = None, params: str = "params.yaml"):
    return subprocess.run(stage_command(stage, params), cwd=folder, capture_output=True,
                          text=True, timeout=600, env=env)  # fmt: skip


def _content(value, h) -> None:
    """A checkpoint's content into a hash: torch.save writes a random serialization id into
    every file, so two saves of the same tensors differ in their bytes, not their content."""
    import torch

    if isinstance(value, torch.Tensor):
        h.update(f"{value.dtype}{tuple(value.shape)}".encode())
        h.update(value.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    elif isinstance(value, dict):
        for k in sorted(value, key=str):
            h.update(repr(k).encode())
            _content(value[k], h)
    elif isinstance(value, list | tuple):
        for v in value:
            _content(v, h)
    else:
        h.update(repr(value).encode())


def digests(folder: Path, paths) -> dict[str, str]:
    """Every file under the outputs and its SHA-256 (a checkpoint's: of its content)."""
    import torch

    out = {}
    for path in paths:
        for f in sorted((folder / path).rglob("*")) if (folder / path).is_dir() else []:
            if f.is_file():
                h = hashlib.sha256()
                if f.suffix == ".pt":
                    _content(torch.load(f, weights_only=True), h)
                else:
                    h.update(f.read_bytes())
                out[str(f.relative_to(folder))] = h.hexdigest()
    return out


def imported_modules(log: str) -> set[str]:
    """The project modules in a `python -X importtime` log (PYTHONPROFILEIMPORTTIME)."""
    pattern = r"\|\s+((?:gocore|nets|play|stages|flows)(?:\.\w+)*)\s*$"
    return set(re.findall(pattern, log, re.M))


def leftovers(folder: Path) -> list[Path]:
    return [p for p in folder.rglob(".*") if ".tmp" in p.name or ".old-" in p.name]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> dict:
    """Generation 0 of a tiny run, every stage its own process (with Python's import log, for
    the code-deps check): the folder, each stage's outputs' digests, time and imports."""
    folder = tmp_path_factory.mktemp("tiny")
    (folder / "params.yaml").write_text(yaml.safe_dump(tiny_params()))
    env = dict(os.environ, PYTHONPROFILEIMPORTTIME="1")
    result = {"folder": folder, "digests": {}, "seconds": {}, "imports": {}}
    for stage, outs in STAGES.items():
        start = time.perf_counter()
        done = run_stage(folder, stage, env)
        assert done.returncode == 0, f"{stage}: {done.stderr[-3000:]}"
        result["seconds"][stage] = time.perf_counter() - start
        result["digests"][stage] = digests(folder, outs)
        result["imports"][stage] = imported_modules(done.stderr)
    return result


def _files(modules: set[str]) -> set[str]:
    from stages.imports import module_file

    return {str(module_file(m).relative_to(REPO)) for m in modules if module_file(m)}


@pytest.mark.slow
def test_every_module_a_stage_imports_is_among_its_code_deps(tiny_run, tmp_path):
    """Python's own import log of each stage's real run (and of the GTP engine the evaluate
    stage starts) against the code deps dvc.yaml lists for it."""
    from flows import pipeline

    committed = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    # The tiny run's own stages with the source tree's code deps (it has a gate; params.yaml
    # as committed has none).
    generated = pipeline.pipeline(pipeline.plan_of(tiny_params(), "params.yaml"))["stages"]
    for stage in STAGES:
        # `python -m` runs the stage's own module as __main__, which the log leaves out.
        imported = _files(tiny_run["imports"][stage]) | {f"stages/{stage}.py"}
        assert {"stages/cli.py", "stages/params.py", "stages/layout.py"} <= imported
        name = next(k for k in generated if k.rsplit("-", 1)[0] == stage)
        listed = {d for d in generated[name]["deps"] if d.endswith(".py")}
        assert imported <= listed, (stage, sorted(imported - listed))
    # The champion's engine, as the evaluate stage starts it.
    champion = tiny_run["folder"] / layout.champion(0)
    engine = subprocess.run(
        [sys.executable, "-m", "flows.cli", "gtp", "--model", str(champion), "--visits", "2",
         "--params", str(tiny_run["folder"] / "params.yaml"), "--section", "evaluate"],
        input="boardsize 5\ngenmove b\nfinal_score\nquit\n", capture_output=True, text=True,
        timeout=300, env=dict(os.environ, PYTHONPROFILEIMPORTTIME="1"),
    )  # fmt: skip
    assert engine.returncode == 0 and "= " in engine.stdout, engine.stderr[-2000:]
    modules = imported_modules(engine.stderr)
    listed = {d for d in generated["evaluate-0"]["deps"] if d.endswith(".py")}
    assert _files(modules) <= listed, sorted(_files(modules) - listed)
    assert {"play/gtp.py", "play/netplayer.py"} <= _files(modules)
    # And the generator agrees with itself: what it lists is what the committed file has.
    plan = pipeline.plan_of(yaml.safe_load((REPO / "params.yaml").read_text()), "params.yaml")
    assert pipeline.stages_of(0, plan)["train-0"] == committed["train-0"]


# ---------------------------------------------------------------------------------------------
# Bad params.yaml values: exit status 2, the key named, never a traceback
# ---------------------------------------------------------------------------------------------

BASE = tiny_params()
KEYS = [
    (section, key) for section, values in BASE.items() if isinstance(values, dict) for key in values
]
VALUES = st.one_of(
    st.integers(-3, 3), st.floats(-1.5, 1.5), st.sampled_from([float("nan"), float("inf"), 1e300,
    -(10**30), "", "x", "klingon", True, False, None, [], [1, "a"], {}, {25: 1}, {"a": 1}]),
    st.text(max_size=6),
)  # fmt: skip


@st.composite
def mutations(draw):
    """(stage, params, the key that changed): one change to the tiny run's params.yaml."""
    params = yaml.safe_load(yaml.safe_dump(BASE))  # a deep copy
    kind = draw(st.sampled_from(["value", "value", "value", "missing", "extra", "section"]))
    section, key = draw(st.sampled_from(KEYS))
    if kind == "value":
        params[section][key] = draw(VALUES)
        changed = f"{section}.{key}"
    elif kind == "missing":
        del params[section][key]
        changed = f"{section}.{key}"
    elif kind == "extra":
        params[section][f"{key}_typo"] = 1
        changed = f"{section}.{key}_typo"
    else:
        params[section] = draw(VALUES)
        changed = section
    stage = draw(st.sampled_from(list(STAGES)))
    return stage, params, changed


@pytest.fixture(scope="module")
def scratch_run(tiny_run, tmp_path_factory) -> Path:
    """A copy of the tiny run for stages to overwrite."""
    folder = tmp_path_factory.mktemp("scratch") / "run"
    shutil.copytree(tiny_run["folder"], folder)
    return folder


@given(mutation=mutations())
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@pytest.mark.slow
def test_a_bad_params_value_exits_2_naming_its_key(scratch_run, mutation):
    """Each stage's command line (its main, in this process: the same code, without the
    start-up time) on a params.yaml with one change: it runs (exit 0) or refuses with exit
    status 2 and the key in the message; it never raises."""
    import importlib

    stage, params, changed = mutation
    folder = scratch_run
    mutated = folder / "mutated.yaml"
    mutated.write_text(yaml.safe_dump(params))
    main = importlib.import_module(f"stages.{stage}").main
    err = io.StringIO()
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(["--generation", "0", "--params", str(mutated)])
    finally:
        os.chdir(cwd)
    assert code in (0, 2), (stage, changed, err.getvalue())
    if code == 2:
        top = changed.split(".")[0]
        assert changed in err.getvalue() or f"`{top}:`" in err.getvalue(), (changed, err.getvalue())


@pytest.mark.slow
def test_the_issue_s_bad_values_exit_2(scratch_run):
    """The values found as tracebacks before: exit 2, the key named."""
    folder = scratch_run
    for stage, change, key in (
        ("selfplay", ("selfplay", "rules", {"klingon": 1}), "selfplay.rules"),
        ("selfplay", ("selfplay", "board_sizes", {25: 1}), "selfplay.board_sizes"),
        ("train", ("loss", None, 5), "loss"),
        ("selfplay", ("selfplay", "komi_stdev", float("inf")), "selfplay.komi_stdev"),
        ("gate", ("gate", "rules", "klingon"), "gate.rules"),
    ):
        params = tiny_params()
        section, name, value = change
        if name is None:
            params[section] = value
        else:
            params[section][name] = value
        (folder / "bad.yaml").write_text(yaml.safe_dump(params))
        done = run_stage(folder, stage, params="bad.yaml")
        assert done.returncode == 2, done.stderr[-2000:]
        assert key in done.stderr and "Traceback" not in done.stderr, done.stderr


# ---------------------------------------------------------------------------------------------
# Kills
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["selfplay", "shuffle", "train", "ema", "gate", "promote"])
def test_a_stage_killed_anywhere_reruns_to_the_same_outputs(tiny_run, stage, tmp_path):
    """SIGKILL at random points of the stage's real process (three seeds): no temporary
    folder or file outlives the rerun, the output is never missing while it is replaced, and
    the rerun's files are byte for byte those of the unkilled run."""
    import random

    folder = tmp_path / "run"
    shutil.copytree(tiny_run["folder"], folder)
    took = tiny_run["seconds"][stage]
    for seed in range(3):
        delay = random.Random(seed).uniform(0.3, took)
        child = subprocess.Popen(stage_command(stage), cwd=folder, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)  # fmt: skip
        time.sleep(delay)
        child.send_signal(signal.SIGKILL)
        child.wait()
        for out in STAGES[stage]:
            assert (folder / out).is_dir(), f"{out} missing after a kill at {delay:.1f} s"
        done = run_stage(folder, stage)
        assert done.returncode == 0, done.stderr[-2000:]
        assert leftovers(folder) == [], (seed, leftovers(folder))
        assert digests(folder, STAGES[stage]) == tiny_run["digests"][stage], (stage, seed)


def test_an_output_swap_never_leaves_it_missing(tmp_path):
    """A reader polling the output while it is replaced again and again always finds it."""
    out = tmp_path / "gen-0"
    with atomic.output_dir(out) as tmp:
        (tmp / "a").write_text("0")
    missing = []
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            if not (out / "a").exists():
                missing.append(time.perf_counter())

    watcher = threading.Thread(target=watch)
    watcher.start()
    for k in range(300):
        with atomic.output_dir(out) as tmp:
            (tmp / "a").write_text(str(k))
    stop.set()
    watcher.join()
    assert missing == [] and (out / "a").read_text() == "299"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gen-0"]


def test_a_swap_cut_between_its_renames_is_undone_by_the_next_writer(tmp_path, monkeypatch):
    """Where the system cannot exchange two folders, the old output is renamed aside first; a
    process killed right then leaves it aside, and the next write of that output puts it back
    and removes the dead process's temporary folder."""
    out = tmp_path / "gen-0"
    with atomic.output_dir(out) as tmp:
        (tmp / "a").write_text("old")
    script = (
        "import os, sys\n"
        "from gocore import atomic\n"
        "atomic._exchange = lambda a, b: False\n"
        "real = os.replace\n"
        "def replace(a, b):\n"
        "    real(a, b)\n"
        "    if '.old-' in str(b): os._exit(9)  # killed between the two renames\n"
        "os.replace = replace\n"
        f"with atomic.output_dir({str(out)!r}) as tmp:\n"
        "    (tmp / 'a').write_text('new')\n"
    )
    subprocess.run([sys.executable, "-c", script], cwd=REPO, check=False, timeout=60)
    assert not out.exists() and len(list(tmp_path.iterdir())) == 2  # aside, and the new one
    atomic.remove_leftovers(out)
    assert (out / "a").read_text() == "old" and sorted(os.listdir(tmp_path)) == ["gen-0"]


# ---------------------------------------------------------------------------------------------
# Broken inputs, named with the stage to rerun
# ---------------------------------------------------------------------------------------------


def _broken(tiny_run, tmp_path, stage: str, path, damage) -> str:
    folder = tmp_path / "run"
    shutil.copytree(tiny_run["folder"], folder)
    target = folder / path
    damage(target)
    done = run_stage(folder, stage)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    return done.stderr


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0x10  # inside the data pages, the footer intact
    path.write_bytes(bytes(data))


@pytest.mark.slow
@pytest.mark.parametrize("damage", [_truncate, _flip], ids=["truncated", "bit-flipped"])
def test_a_broken_shard_names_the_selfplay_stage(tiny_run, tmp_path, damage):
    shard = layout.selfplay_dir(0) / "part-0.parquet"
    err = _broken(tiny_run, tmp_path, "shuffle", shard, damage)
    assert str(shard) in err and "rerun the selfplay stage for generation 0" in err


@pytest.mark.slow
def test_a_window_file_missing_or_broken_names_the_shuffle_stage(tiny_run, tmp_path):
    part = layout.window_dir(0) / "part-0.parquet"
    err = _broken(tiny_run, tmp_path, "train", part, lambda p: p.unlink())
    assert str(part) in err and "does not exist" in err and "rerun the shuffle stage" in err
    err = _broken(tiny_run, tmp_path / "b", "train", part, _flip)
    assert str(part) in err and "rerun the shuffle stage" in err


@pytest.mark.slow
def test_a_checkpoint_cut_short_names_the_stage_that_wrote_it(tiny_run, tmp_path):
    err = _broken(tiny_run, tmp_path, "gate", layout.candidate(0), _truncate)
    assert str(layout.candidate(0)) in err and "rerun ema-0" in err
    # Generation 1's train resuming from generation 0's state, cut to nothing.
    folder = tmp_path / "b"
    shutil.copytree(tiny_run["folder"], folder)
    (folder / layout.train_dir(0) / "state.pt").write_bytes(b"")
    done = subprocess.run(
        [sys.executable, "-m", "stages.train", "--generation", "1", "--window",
         str(layout.window_dir(0))], cwd=folder, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "state.pt cannot be read" in done.stderr and "rerun its train stage" in done.stderr


@pytest.mark.slow
def test_a_training_state_of_another_net_is_refused(tiny_run, tmp_path):
    """Generation 1 resuming from a state.pt whose weights do not fit: named, exit 2."""
    import torch

    folder = tmp_path / "run"
    shutil.copytree(tiny_run["folder"], folder)
    state_path = folder / layout.train_dir(0) / "state.pt"
    state = torch.load(state_path, weights_only=True)
    first = next(iter(state["model"]))
    state["model"][first] = torch.zeros(3, 3)
    torch.save(state, state_path)
    # Generation 1's train resumes from generation 0's state (the window is gen 0's too).
    done = subprocess.run(
        [sys.executable, "-m", "stages.train", "--generation", "1", "--window",
         str(layout.window_dir(0))], cwd=folder, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "weights do not fit a b2c16 net" in done.stderr and str(state_path.name) in done.stderr
