"""The stage server (stages.server): a stage command handed to it runs as its own process would
(the same output, files, exit status, and signals), and a command it cannot take runs on its own.

Whether a command ran in the server is seen from outside: `python -X importtime` prints every
module the command's own process imports, and a command the server ran imported none of its
stage's libraries; a stage that lasts seconds shows as a forked child of the server."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import yaml

import stages.cli
from stages.handoff import ENV
from stages.server import serving
from tests.conftest import make_run_repo, run_in


def _env() -> dict[str, str]:
    """The stages' environment as the loop makes it: this Python's bin first on PATH."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    return dict(os.environ, PATH=path)


def _server(env: dict[str, str]) -> psutil.Process:
    """The server process serving `env`'s socket (a child of this process)."""
    for p in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            if env[ENV] in p.cmdline():
                return p
    raise AssertionError("no stage server runs")


@contextlib.contextmanager
def _copies(server: psutil.Process):
    """The pids of the server's forked copies seen while the block runs (polled)."""
    seen: set[int] = set()
    done = threading.Event()

    def poll():
        while not done.is_set():
            with contextlib.suppress(psutil.Error):
                seen.update(p.pid for p in server.children())
            time.sleep(0.01)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        done.set()
        thread.join()


def _without_import_lines(text: str) -> str:
    return "".join(line for line in text.splitlines(True) if not line.startswith("import time:"))


@contextlib.contextmanager
def _serving(repo: Path):
    """serving(), once the server listens (the loop does not wait for it)."""
    with serving(repo, _env()) as env:
        deadline = time.monotonic() + 300
        while not Path(env[ENV]).exists():
            assert time.monotonic() < deadline, "the stage server did not start"
            time.sleep(0.05)
        yield env


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A stage server for commands run in a folder of their own: (folder, their environment)."""
    folder = tmp_path_factory.mktemp("served")
    with _serving(folder) as env:
        yield folder, env


def test_a_failing_stage_fails_the_same_in_the_server(served):
    folder, env = served
    (folder / "bad.yaml").write_text("selfplay:\n  games: [1\n")
    command = [sys.executable, "-X", "importtime", "-m", "stages.selfplay", "--generation", "0",
               "--params", "bad.yaml"]  # fmt: skip
    alone = subprocess.run(command, cwd=folder, env=_env(), capture_output=True, text=True,
                           timeout=300)  # fmt: skip
    there = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True,
                           timeout=300)  # fmt: skip
    # The command's own process never imported the stage's libraries: the server ran it.
    assert " yaml\n" in alone.stderr and " yaml\n" not in there.stderr
    assert " stages.handoff\n" in there.stderr
    assert alone.returncode == there.returncode == 2
    assert (
        "bad.yaml (line 3, column 1): not valid YAML" in there.stderr
        and "Traceback" not in there.stderr
    )
    assert _without_import_lines(there.stderr) == _without_import_lines(alone.stderr)
    assert there.stdout == alone.stdout


def test_a_command_the_server_cannot_take_runs_on_its_own(served, tmp_path):
    folder, env = served
    (folder / "bad.yaml").write_text("selfplay:\n  games: [1\n")
    (tmp_path / "bad.yaml").write_text("selfplay:\n  games: [1\n")
    command = [sys.executable, "-X", "importtime", "-m", "stages.selfplay", "--generation", "0",
               "--params", "bad.yaml"]  # fmt: skip
    cases = {  # where it runs, its environment, what it says of the server
        "another environment": (folder, env | {"NUMBA_OPT": "1"},
                                "its environment differs from the server's in NUMBA_OPT"),
        "another folder": (tmp_path, env, f"it runs in {tmp_path}, the server in {folder}"),
        "no server": (folder, env | {ENV: str(tmp_path / "none")}, None),
        "code changed": (folder, env, "the code changed since the server started: "
                                      f"{stages.cli.__file__}"),
    }  # fmt: skip
    source = Path(stages.cli.__file__)  # no numba kernel in it: its cache is not touched
    stat = source.stat()
    for case, (cwd, case_env, says) in cases.items():
        if case == "code changed":
            os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
        try:
            result = subprocess.run(command, cwd=cwd, env=case_env, capture_output=True,
                                    text=True, timeout=300)  # fmt: skip
        finally:
            os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        assert result.returncode == 2, case
        assert "bad.yaml (line 3, column 1): not valid YAML" in result.stderr, case
        assert " yaml\n" in result.stderr, f"{case}: not run here"
        note = "stages.selfplay: not run by the stage server"
        if says is None:
            assert note not in result.stderr, case
        else:
            assert f"{note} ({says}); running on its own" in result.stderr, case


@pytest.mark.slow
def test_stages_in_the_server_write_what_they_write_alone(tmp_path):
    """`dvc repro` of real stages as the loop runs them (self-play, the window's shuffle,
    training): with the server (its forked copies seen running them), the same data byte for
    byte and the same trained weights as alone."""
    import torch

    stages = ("selfplay-0", "shuffle-0", "train-0")
    alone = make_run_repo(tmp_path / "alone", code_deps=False)
    there = make_run_repo(tmp_path / "there", code_deps=False)
    for name in stages:
        run_in(alone, "dvc", "repro", "--single-item", name)
    with _serving(there) as env, _copies(_server(env)) as seen:
        for name in stages:
            result = subprocess.run(["dvc", "repro", "--single-item", name], cwd=there, env=env,
                                    capture_output=True, text=True, timeout=900)  # fmt: skip
            assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
            assert "not run by the stage server" not in result.stdout + result.stderr
    assert len(seen) == len(stages), "the server did not run every stage"

    def files(repo: Path, folder: str) -> list[Path]:
        return sorted(p.relative_to(repo) for p in (repo / folder).rglob("*") if p.is_file())

    data = files(alone, "data")
    assert any("selfplay" in str(p) for p in data) and any("window" in str(p) for p in data)
    assert data == files(there, "data")
    for name in data:
        assert (alone / name).read_bytes() == (there / name).read_bytes(), name
    models = files(alone, "models")
    assert models and models == files(there, "models")
    assert any(name.suffix == ".pt" for name in models)
    for name in models:  # a checkpoint's zip names its temporary file: compare what it holds
        if name.suffix != ".pt":
            assert (alone / name).read_bytes() == (there / name).read_bytes(), name
            continue
        a, b = (torch.load(r / name, map_location="cpu", weights_only=True)
                for r in (alone, there))  # fmt: skip
        assert _same(a, b), name


def _same(a, b) -> bool:
    """Equal contents: tensors element for element, containers item for item."""
    import torch

    if torch.is_tensor(a):
        return torch.is_tensor(b) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    return a == b


@pytest.mark.slow
def test_signals_and_ends_of_a_stage_in_the_server(tmp_path):
    """A stage the server runs, stopped every way it can be: SIGTERM to its command stops it as
    it would alone (its message, exit status 130, no temporary folder); SIGKILL to the command
    makes the server end the stage; SIGKILL to the stage ends the command the same way; a
    command gone mid-request leaves the server serving; the server killed mid-stage takes the
    stage with it and ends the command as SIGTERM would (a stage the loop retries)."""
    repo = make_run_repo(tmp_path / "run", code_deps=False)
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["selfplay"]["games"] = 400  # long enough to be stopped mid-way
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    command = [sys.executable, "-m", "stages.selfplay", "--generation", "0", "--quiet"]
    tmp = "data/selfplay/.gen-0.tmp-*"

    def start(server: psutil.Process, env: dict) -> tuple[subprocess.Popen, psutil.Process]:
        child = subprocess.Popen(command, cwd=repo, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)  # fmt: skip
        deadline = time.monotonic() + 300
        while not (list(repo.glob(tmp)) and server.children()):
            assert child.poll() is None, child.communicate()
            assert time.monotonic() < deadline, "the stage never started its games"
            time.sleep(0.05)
        (copy,) = server.children()
        return child, copy

    def ended(child: subprocess.Popen, copy: psutil.Process, cleaned: bool = True) -> str:
        _, err = child.communicate(timeout=120)
        psutil.wait_procs([copy], timeout=60)
        assert not psutil.pid_exists(copy.pid), "the stage's copy was not reaped"
        assert not (repo / "data/selfplay/gen-0").exists()
        if cleaned:  # the stage's own SIGTERM handler removed its temporary folder
            assert not list(repo.glob(tmp))
        for left in repo.glob(tmp):  # SIGKILL leaves it, as it does a stage alone
            shutil.rmtree(left)
        return err

    with _serving(repo) as env:
        server = _server(env)
        child, copy = start(server, env)
        child.send_signal(signal.SIGTERM)
        err = ended(child, copy)
        assert child.returncode == 130, err[-3000:]
        assert "selfplay: stopped; nothing of this run was kept" in err
        child, copy = start(server, env)
        child.kill()
        ended(child, copy)
        assert child.returncode == -signal.SIGKILL
        child, copy = start(server, env)
        copy.kill()
        ended(child, copy, cleaned=False)
        assert child.returncode == -signal.SIGKILL
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as half:  # a request cut short
            half.connect(env[ENV])
            half.send(b"\0\0\1\0{")
        child, copy = start(server, env)
        server.kill()
        err = ended(child, copy)
        assert child.returncode == -signal.SIGTERM, err[-3000:]
        assert "the stage server ended before the stage did" in err
