"""Data and tracking off the machine: a run (its self-play on a LocalCluster) pushed
generation by generation to a DVC remote (a local-path remote here) and logged to a real
`mlflow server`; a fresh clone gets the run with `dvc pull`, and `dvc repro` there has nothing
to do. And what `tengen remote add` and run.push refuse."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from flows.runs import add_remote, check_push, set_run_key
from stages.params import ParamsError
from tests.conftest import REPO, make_run_repo, run_in


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tengen(*args: str, env: dict | None = None, cwd: Path = REPO, timeout: float = 1200):
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=timeout)  # fmt: skip


@pytest.fixture
def mlflow_server(tmp_path):
    """`mlflow server` on a free local port, its runs in SQLite and its artifacts in a folder
    of its own (proxied: clients upload through the server)."""
    port = free_port()
    store = tmp_path / "server"
    store.mkdir()
    process = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
         "--backend-store-uri", f"sqlite:///{store}/mlflow.db",
         "--artifacts-destination", str(store / "artifacts"), "--workers", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 180
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        assert process.poll() is None, "mlflow server exited"
        assert time.time() < deadline, "mlflow server did not answer in 180 s"
        time.sleep(0.5)
    yield url, store
    os.killpg(process.pid, 15)
    process.wait(timeout=60)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_a_run_pushed_each_generation_is_whole_in_a_fresh_clone_and_on_the_server(
    tmp_path, mlflow_server
):
    url, store = mlflow_server
    repo = make_run_repo(tmp_path / "run", code_deps=False, win_fraction=0.0)
    # And its self-play in 2 shards on a LocalCluster of 2 workers: the whole loop fans out.
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["selfplay"]["shards"] = 2
    params["cluster"]["address"] = "local:2"
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    # Its git pushes to an upstream (a bare repository: the head's, or a forge's).
    upstream = tmp_path / "upstream.git"
    run_in(tmp_path, "git", "init", "-q", "--bare", str(upstream))
    run_in(repo, "git", "remote", "add", "origin", str(upstream))
    run_in(repo, "git", "push", "-q", "-u", "origin", "HEAD")
    remote = tmp_path / "remote"
    added = tengen("remote", "add", str(remote), "--repo", str(repo))
    assert added.returncode == 0, added.stderr
    assert "run.push: true" in added.stdout
    assert yaml.safe_load((repo / "params.yaml").read_text())["run"]["push"] is True
    assert run_in(repo, "dvc", "remote", "default").strip() == "storage"

    env = dict(os.environ, MLFLOW_TRACKING_URI=url)
    env.pop("PREFECT_API_URL", None)
    done = tengen("run", "--repo", str(repo), env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    # Each generation committed and pushed as it ended.
    log = run_in(repo, "git", "log", "--format=%s").split("\n")
    assert log[:3] == ["the run's page", "generation 1", "generation 0"]
    assert run_in(repo, "git", "status", "--porcelain").strip() == ""
    assert any(remote.rglob("*")), "nothing was pushed"
    assert not (repo / "mlflow.db").exists() and not (repo / "mlartifacts").exists()
    for n in (0, 1):
        metrics = json.loads((repo / f"reports/selfplay/gen-{n}.json").read_text())
        assert metrics["cluster"] == "local:2" and metrics["shards"] == 2

    assert "git push to origin/" in done.stderr
    # Another machine: git clone (from the upstream) and dvc pull; DVC has nothing to redo.
    clone = tmp_path / "clone"
    run_in(tmp_path, "git", "clone", "-q", str(upstream), str(clone))
    run_in(clone, "dvc", "pull", "-q")
    for path in ("models/gen-1/champion/champion.pt", "data/selfplay/gen-1/part-0.parquet",
                 "reports/train/gen-1.json", "dvc.lock"):  # fmt: skip
        assert digest(clone / path) == digest(repo / path), path
    assert "up to date" in run_in(clone, "dvc", "status")
    repro = run_in(clone, "dvc", "repro")
    assert "Running stage" not in repro, repro[-3000:]
    # The same run again: no stage runs, no generation is committed twice (the page, written
    # anew, may be), and the pushes still succeed.
    again = tengen("run", "--repo", str(repo), env=env)
    assert again.returncode == 0, again.stderr[-4000:]
    relog = run_in(repo, "git", "log", "--format=%s").split("\n")
    assert relog.count("generation 0") == relog.count("generation 1") == 1
    assert "Everything is up to date." in again.stderr
    assert run_in(repo, "git", "status", "--porcelain").strip() == ""

    # The tracking server has the loop, every stage run and the champion's model.
    from mlflow import MlflowClient

    client = MlflowClient(url)
    exp = client.get_experiment_by_name("tengen")
    runs = client.search_runs([exp.experiment_id], max_results=500)
    loops = [r for r in runs if r.data.tags.get("tengen.launcher") == "tengen run"]
    assert [r.info.status for r in loops] == ["FINISHED", "FINISHED"]  # the run, and again
    names = {r.info.run_name for r in runs}
    assert {"selfplay-0", "train-0", "promote-0", "selfplay-1", "train-1", "promote-1"} <= names
    # The champion as a player gets it from the server (`tengen gtp --model models:/...`).
    from play.models import resolve

    fetched = resolve("models:/tengen@champion", tracking_uri=url)
    assert digest(fetched) == digest(repo / "models/gen-1/champion/champion.pt")
    assert any((store / "artifacts").rglob("*.pt"))  # uploaded through the server


def test_remote_add_and_run_push_refuse_what_cannot_work(tmp_path):
    with pytest.raises(ParamsError, match="not a run folder"):
        add_remote(tmp_path, str(tmp_path / "remote"))
    with pytest.raises(ParamsError, match="the source tree is no run folder"):
        add_remote(REPO, str(tmp_path / "remote"))
    with pytest.raises(ParamsError, match="run.push is true in the source tree"):
        check_push(REPO)
    folder = tmp_path / "run"
    folder.mkdir()
    run_in(folder, "git", "init", "-q")
    run_in(folder, "dvc", "init", "-q")
    with pytest.raises(ParamsError, match="no default DVC remote; add one with `tengen remote add"):
        check_push(folder)
    (folder / "params.yaml").write_text("run:\n  generations: 2\n  grow: []\n")
    with pytest.raises(ParamsError, match="inside the run folder"):
        add_remote(folder, str(folder / "cache"))
    with pytest.raises(ParamsError, match="URL is empty"):
        add_remote(folder, " ")
    (folder / "params.yaml").write_text("selfplay:\n  games: 2\n")
    with pytest.raises(ParamsError, match="no `run:` section"):
        add_remote(folder, str(tmp_path / "remote"))
    assert run_in(folder, "dvc", "remote", "list").strip() == ""  # nothing added
    # The command line: exit status 2 and the reason.
    bad = tengen("remote", "add", str(tmp_path / "remote"), "--repo", str(tmp_path))
    assert bad.returncode == 2 and "not a run folder" in bad.stderr


def test_run_push_is_set_keeping_comments_and_added_to_older_files(tmp_path):
    path = tmp_path / "params.yaml"
    text = (REPO / "params.yaml").read_text()
    path.write_text(text)
    set_run_key(path, "push", "true")
    changed = path.read_text()
    assert yaml.safe_load(changed)["run"]["push"] is True
    assert changed.count("\n") == text.count("\n") and "# After each generation" in changed
    older = "run:\n  generations: 3  # how many\n  grow: []\nselfplay:\n  games: 4\n"
    path.write_text(older)
    set_run_key(path, "push", "true")
    assert path.read_text() == (
        "run:\n  generations: 3  # how many\n  push: true\n  grow: []\nselfplay:\n  games: 4\n"
    )
    path.write_text("selfplay:\n  games: 4\nrun:\n  generations: 3")  # no newline at the end
    set_run_key(path, "push", "true")
    assert yaml.safe_load(path.read_text())["run"] == {"generations": 3, "push": True}
