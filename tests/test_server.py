"""The stage server (stages.server): a stage command handed to it runs as its own process would
(the same output, files, exit status, and signals), and a command it cannot take runs on its own.

Whether a command ran in the server is seen from outside: `python -X importtime` prints every
module the command's own process imports, and a command the server ran imported none of its
stage's libraries; a stage that lasts seconds shows as a forked child of the server."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import yaml

from stages.handoff import ENV
from stages.server import PER_COMMAND, serving
from tests.conftest import make_run_repo, run_in


def _env(**extra: str) -> dict[str, str]:
    """The stages' environment as the loop makes it: this Python's bin first on PATH."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    return dict(os.environ, PATH=path, **extra)


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
        deadline = time.time() + 300
        while not Path(env[ENV]).exists():
            assert time.time() < deadline, "the stage server did not start"
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
    from stages.tracking import ENV_PARENT

    # The loop's MLflow run differs from one loop to the next, not between a loop's stages.
    assert ENV_PARENT in PER_COMMAND
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
    }  # fmt: skip
    for case, (cwd, case_env, says) in cases.items():
        result = subprocess.run(command, cwd=cwd, env=case_env, capture_output=True, text=True,
                                timeout=300)  # fmt: skip
        assert result.returncode == 2, case
        assert "bad.yaml (line 3, column 1): not valid YAML" in result.stderr, case
        assert " yaml\n" in result.stderr, f"{case}: not run here"
        note = "stages.selfplay: not run by the stage server"
        if says is None:
            assert note not in result.stderr, case
        else:
            assert f"{note} ({says}); running on its own" in result.stderr, case


@pytest.mark.slow
def test_a_stage_in_the_server_writes_what_it_writes_alone(tmp_path):
    """`dvc repro` of a real self-play stage, as the loop runs it: with the server (its forked
    copy seen running it), the same files byte for byte and the same lock as alone."""
    alone = make_run_repo(tmp_path / "alone", code_deps=False)
    there = make_run_repo(tmp_path / "there", code_deps=False)
    run_in(alone, "dvc", "repro", "--single-item", "selfplay-0")
    repro = ["dvc", "repro", "--single-item", "selfplay-0"]
    with _serving(there) as env, _copies(_server(env)) as seen:
        result = subprocess.run(repro, cwd=there, env=env, capture_output=True, text=True,
                                timeout=900)  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "not run by the stage server" not in result.stdout + result.stderr
    assert seen, "the server never forked a copy"
    files = sorted(
        p.relative_to(alone) for p in (alone / "data/selfplay").rglob("*") if p.is_file()
    )
    assert files and files == sorted(
        p.relative_to(there) for p in (there / "data/selfplay").rglob("*") if p.is_file()
    )
    for name in files:
        assert (alone / name).read_bytes() == (there / name).read_bytes(), name
    locks = [yaml.safe_load((r / "dvc.lock").read_text())["stages"]["selfplay-0"]
             for r in (alone, there)]  # fmt: skip
    data = [[o for o in lock["outs"] if o["path"].startswith("data/")] for lock in locks]
    assert data[0] and data[0] == data[1]  # (its metrics hold times: they differ)


@pytest.mark.slow
def test_signals_reach_the_stage_and_a_killed_command_takes_it_down(tmp_path):
    """SIGTERM to a command the server runs: the stage stops as it would alone (its message,
    exit status 130, no temporary folder); SIGKILL to the command: the server ends the stage."""
    repo = make_run_repo(tmp_path / "run", code_deps=False)
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["selfplay"]["games"] = 400  # long enough to be stopped mid-way
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    command = [sys.executable, "-m", "stages.selfplay", "--generation", "0", "--quiet"]
    with _serving(repo) as env:
        server = _server(env)
        for how in (signal.SIGTERM, signal.SIGKILL):
            child = subprocess.Popen(command, cwd=repo, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)  # fmt: skip
            deadline = time.time() + 300
            while not (list(repo.glob("data/selfplay/.gen-0.tmp-*")) and server.children()):
                assert child.poll() is None, child.communicate()
                assert time.time() < deadline, "the stage never started its games"
                time.sleep(0.05)
            (copy,) = server.children()
            child.send_signal(how)
            out, err = child.communicate(timeout=120)
            psutil.wait_procs([copy], timeout=60)
            assert not copy.is_running() or copy.status() == psutil.STATUS_ZOMBIE
            if how == signal.SIGTERM:
                assert child.returncode == 130, err[-3000:]
                assert "selfplay: stopped; nothing of this run was kept" in err
            else:
                assert child.returncode == -signal.SIGKILL
            assert not list(repo.glob("data/selfplay/.gen-0.tmp-*")), how
            assert not (repo / "data/selfplay/gen-0").exists(), how
    assert not server.is_running(), "the server outlived its block"
