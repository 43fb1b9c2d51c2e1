"""Run folders and the scheduled loop: presets on top of params.yaml, run.generations set in
place, and `tengen serve`'s deployment actually running a generation on its schedule."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
import yaml

from flows import runs
from flows.loop import deployment
from stages.params import ParamsError, load_params
from tests.conftest import REPO, make_run_repo, render_local, run_in


def test_a_preset_changes_only_what_it_names():
    base = load_params(REPO / "params.yaml")
    merged = runs.merge(base, {"train": {"net": "b6c96"}, "run": {"generations": 30}})
    assert merged["train"]["net"] == "b6c96" and merged["run"]["generations"] == 30
    assert merged["train"]["batch_size"] == base["train"]["batch_size"]
    assert merged["selfplay"] == base["selfplay"]
    with pytest.raises(ParamsError, match="train.nett is not a params.yaml key"):
        runs.merge(base, {"train": {"nett": "b6c96"}})
    # Weights and the evaluation's opponents are given whole: a preset's map replaces the base's.
    ladder = {"gnugo-10": "gnugo --mode gtp --level 10"}
    change = {"evaluate": {"opponents": ladder}, "selfplay": {"rules": {"aga": 1}}}
    merged = runs.merge(base, change)
    assert merged["evaluate"]["opponents"] == ladder and merged["selfplay"]["rules"] == {"aga": 1}
    assert merged["evaluate"]["games"] == base["evaluate"]["games"]
    # Every shipped preset applies to the shipped params.yaml.
    assert "long" in runs.presets()
    from stages.params import EvaluateParams, section

    for name in runs.presets():
        text = runs.preset_params(name, REPO / "params.yaml")
        assert yaml.safe_load(text)["selfplay"]["games"] >= 1
        # Its ladder validates: a handicap rung the board cannot hold would fail every run.
        ladder = section(yaml.safe_load(text), "evaluate", EvaluateParams, source=name).rungs()
        assert "gnugo-1" in ladder
    hour = yaml.safe_load(runs.preset_params("hour", REPO / "params.yaml"))
    rungs = section(hour, "evaluate", EvaluateParams, source="hour").rungs()
    assert [(r.handicap, r.komi) for r in rungs.values()] == [
        (0, 7.5), (3, 0.5), (5, 0.5), (7, 0.5), (4, 0.5), (0, 7.5)]  # fmt: skip
    assert rungs["katago-h4"].command.startswith("{katago} ")
    with pytest.raises(ParamsError, match="no preset 'huge'"):
        runs.preset_params("huge", REPO / "params.yaml")


def test_a_run_folder_from_a_preset(tmp_path):
    folder = runs.create_run(tmp_path / "long", "long")
    params = load_params(folder / "params.yaml")
    assert params["train"]["net"] == "b6c96" and params["run"]["generations"] == 30
    dvc = yaml.safe_load((folder / "dvc.yaml").read_text())
    assert "promote-29" in dvc["stages"] and "gocore" not in str(dvc["stages"]["selfplay-0"])
    assert (folder / ".dvc").is_dir()
    assert run_in(folder, "git", "status", "--porcelain").strip() == ""


def test_set_generations_keeps_the_file(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text((REPO / "params.yaml").read_text())
    runs.set_generations(path, 7)
    before = (REPO / "params.yaml").read_text().splitlines()
    after = path.read_text().splitlines()
    changed = [(a, b) for a, b in zip(before, after, strict=True) if a != b]
    assert len(changed) == 1 and changed[0][1].strip() == "generations: 7"
    assert load_params(path)["run"]["generations"] == 7
    with pytest.raises(ParamsError, match=">= 1"):
        runs.set_generations(path, 0)
    path.write_text("train: {net: b2c16}\n")
    with pytest.raises(ParamsError, match="no `run:` section"):
        runs.set_generations(path, 3)
    # Only run's own key, not a nested or another section's one.
    path.write_text("run:\n  serve:\n    generations: 5\n  generations: 3  # n\n"
                    "other:\n  generations: 9\n")  # fmt: skip
    runs.set_generations(path, 4)
    assert path.read_text() == (
        "run:\n  serve:\n    generations: 5\n  generations: 4  # n\nother:\n  generations: 9\n"
    )
    path.write_text("run:\n" + "    key: 1\n" * 200)
    with pytest.raises(ParamsError, match="no `run:` section"):
        runs.set_generations(path, 3)


def test_completed_generations_counts_promotions(tmp_path):
    assert runs.completed_generations(tmp_path) == 0
    for n in (0, 1, 3):
        (tmp_path / f"models/gen-{n}/champion").mkdir(parents=True)
        (tmp_path / f"models/gen-{n}/champion/promotion.json").write_text("{}")
    assert runs.completed_generations(tmp_path) == 2


def test_the_schedule_comes_from_the_command_line_or_params(tmp_path):
    (tmp_path / "params.yaml").write_text((REPO / "params.yaml").read_text())
    dep = deployment(tmp_path)  # params.yaml: every 60 minutes, one generation each
    assert dep.parameters == {"repo": str(tmp_path.resolve()), "more": 1}
    [schedule] = dep.schedules
    assert schedule.schedule.interval == timedelta(minutes=60)  # run.serve_interval_minutes
    assert dep.concurrency_limit == 1
    dep = deployment(tmp_path, cron="0 2 * * *", more=3)
    assert dep.schedules[0].schedule.cron == "0 2 * * *" and dep.parameters["more"] == 3
    with pytest.raises(ParamsError, match="not both or neither"):
        deployment(tmp_path, cron="0 2 * * *", interval=5)
    with pytest.raises(ParamsError, match="bad schedule"):
        deployment(tmp_path, cron="every night")
    with pytest.raises(ParamsError, match="> 0 minutes"):
        deployment(tmp_path, interval=0)


@pytest.mark.slow
def test_tengen_serve_serves_the_loop(tmp_path, prefect_api):
    """`tengen serve` registers the scheduled deployment and runs what comes due: a run of it
    (made due now, rather than waiting for Prefect's scheduler) trains generation 0."""
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL

    repo = make_run_repo(tmp_path / "run", code_deps=False)
    env = dict(os.environ, PREFECT_API_URL=PREFECT_API_URL.value())
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    log = open(tmp_path / "serve.log", "w")  # noqa: SIM115 - the server writes to it
    server = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "serve", "--repo", str(repo), "--cron", "0 2 * * *"],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        for _ in range(120):  # polls, a second apart, until the deployment is registered
            assert server.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            try:
                flow_run = run_deployment("tengen-loop/tengen-run", timeout=0)
                break
            except Exception:  # not registered yet
                time.sleep(1)
        else:
            pytest.fail("tengen serve did not register its deployment")
        assert flow_run.parameters == {"repo": str(repo.resolve()), "more": 1}
        promoted = repo / "models/gen-0/champion/promotion.json"
        for _ in range(600):  # polls, a second apart, until generation 0 is promoted
            if promoted.exists():
                break
            assert server.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            time.sleep(1)
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
        log.close()
    assert promoted.exists(), "the served loop did not train generation 0"
    # `more: 1` on a run with nothing promoted yet: one generation.
    assert load_params(repo / "params.yaml")["run"]["generations"] == 1


@pytest.mark.slow
def test_tengen_ui_serves_the_run_s_store_and_opens_on_its_training_runs(tmp_path, chromium_path):
    # The link `tengen ui` (and `tengen run`) prints shows the run's training runs in a
    # browser: the experiment's own page would open MLflow 3's GenAI overview (traces,
    # latency, token usage) whatever its kind tag says.
    import json
    import socket
    import urllib.request

    from mlflow import MlflowClient

    from stages.tracking import experiment

    (tmp_path / "params.yaml").write_text((REPO / "params.yaml").read_text())
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(store)
    exp = experiment(client, "tengen", store)
    for name in ("loop brave-otter", "selfplay-0", "train-0"):
        run = client.create_run(exp, run_name=name)
        client.log_metric(run.info.run_id, "loss.total", 2.5)
        client.set_terminated(run.info.run_id)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ui = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "ui", "--repo", str(tmp_path), "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True, text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}/api/2.0/mlflow/experiments/search?max_results=5"
    try:
        said = ui.stdout.readline()
        for _ in range(120):  # polls, a second apart, until the UI answers
            assert ui.poll() is None, "tengen ui exited"
            try:
                with urllib.request.urlopen(url, timeout=5) as reply:
                    experiments = json.loads(reply.read())["experiments"]
                break
            except OSError:
                time.sleep(1)
        else:
            pytest.fail("the MLflow UI did not come up")
        link = said.split(": ", 1)[1].strip()
        assert link == f"http://127.0.0.1:{port}/#/experiments/{exp}/runs", said
        dom = render_local(chromium_path, link)
    finally:
        os.killpg(ui.pid, signal.SIGKILL)
        ui.wait()
    assert experiments and (tmp_path / "mlflow.db").exists()  # the run's own store
    text = re.sub(r"<[^>]+>", " ", re.sub(r"<(script|style)[^>]*>.*?</\1>", "", dom, flags=re.S))
    for name in ("loop brave-otter", "selfplay-0", "train-0"):
        assert name in text, f"{name} not on the page {link}"
    assert "Token Usage" not in text and "Latency" not in text  # not the GenAI overview
    # Tracking off: nothing to show, said plainly.
    params = yaml.safe_load((tmp_path / "params.yaml").read_text())
    params["mlflow"]["enabled"] = False
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    off = subprocess.run([sys.executable, "-m", "flows.cli", "ui", "--repo", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert off.returncode == 2 and "tracking is off" in off.stderr


def _check(repo: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "flows.cli", "check", "--repo", str(repo)],
        capture_output=True, text=True, timeout=120, env={**os.environ, **env},
    )  # fmt: skip


def test_tengen_check_names_a_missing_program_and_what_the_run_leaves_out(tmp_path):
    (tmp_path / "params.yaml").write_text((REPO / "params.yaml").read_text())
    bare = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "TENGEN_PROGRAM_DIRS": ""}
    done = _check(tmp_path, **bare)
    assert done.returncode == 1, done.stderr
    assert done.stdout.startswith(
        "GNU Go (`gnugo`) is not installed: the evaluations leave out gnugo-1 and score without "
        "a referee"
    )
    assert "apt-get install -y gnugo" in done.stdout
    # A run with no evaluation plays no outside program.
    params = yaml.safe_load((tmp_path / "params.yaml").read_text())
    params["evaluate"].update(every=0, at=[])
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    done = _check(tmp_path, **bare)
    assert done.returncode == 0 and done.stdout.startswith("no evaluation in this run")
    params["evaluate"]["every"] = "often"
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    done = _check(tmp_path, **bare)
    assert done.returncode == 2 and "evaluate.every" in done.stderr


@pytest.mark.gnugo
def test_tengen_check_says_where_gnugo_is(tmp_path, gnugo_path):
    (tmp_path / "params.yaml").write_text((REPO / "params.yaml").read_text())
    done = _check(tmp_path)
    assert done.returncode == 0, done.stdout
    assert done.stdout == f"gnugo: {gnugo_path} (evaluate: gnugo-1, referee)\n"
