"""The loop flow under Prefect: it runs every stage of every generation through DVC, a
second run skips them all, and a loop killed mid-run resumes where it stopped."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from flows.loop import (
    STAGES,
    StageFailed,
    StageInterrupted,
    clear_stale_locks,
    failure,
    generation_summary,
    loop,
    stage_error,
    wait_for_lock_holders,
)
from flows.runs import RunLocked
from play.mlflow_store import tracking_uri_for
from tests.conftest import make_run_repo, run_in


def test_a_resumed_loop_drops_dead_lock_holders_and_waits_for_live_ones(tmp_path):
    # A loop killed with SIGKILL leaves its stage's dvc running (in a session of its own),
    # holding DVC's lock; the next loop must wait for it rather than fail on "is busy".
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.5)", "dvc"])
    lock = tmp_path / ".dvc" / "tmp" / "rwlock"
    lock.parent.mkdir(parents=True)
    lock.write_text(json.dumps({
        "write": {"data/windows/gen-0": {"pid": dead.pid, "cmd": "dvc repro"}},
        "read": {"reports/selfplay/gen-0.json": [{"pid": live.pid, "cmd": "dvc repro"}]},
    }))  # fmt: skip
    assert clear_stale_locks(tmp_path) == 1
    assert list(json.loads(lock.read_text())["read"]) == ["reports/selfplay/gen-0.json"]
    assert wait_for_lock_holders(tmp_path, timeout=0.2) == {live.pid}  # still running
    said = []
    start = time.monotonic()
    assert wait_for_lock_holders(tmp_path, timeout=60, log=said.append) == set()
    assert time.monotonic() - start < 30 and str(live.pid) in said[0]
    live.wait()
    # A live process that is no dvc (a dead dvc's pid, reused) is not waited for.
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    lock.write_text(json.dumps({"read": {"x": [{"pid": other.pid, "cmd": "dvc repro"}]}}))
    try:
        assert wait_for_lock_holders(tmp_path, timeout=60) == set()
    finally:
        other.kill()
        other.wait()


@pytest.mark.slow
def test_the_loop_runs_through_dvc_and_resumes(tmp_path, prefect_api):
    # Gating off, and a bigger net joining at generation 1: it takes over at once.
    repo = make_run_repo(tmp_path / "run", code_deps=False, win_fraction=0.0,
                         grow=[{"net": "b4c32", "from": 1}])  # fmt: skip
    # Killed while generation 0 shuffles (its window written, DVC not yet told): the stages
    # before it are done and stay done.
    from prefect.settings import PREFECT_API_URL

    env = dict(os.environ, PREFECT_API_URL=PREFECT_API_URL.value())
    child = subprocess.Popen(
        [sys.executable, "-c", f"from flows.loop import loop; loop({str(repo)!r})"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    deadline = time.time() + 600
    while not (repo / "data/windows/gen-0").exists() and time.time() < deadline:
        assert child.poll() is None, "the loop ended before it could be killed"
        time.sleep(0.2)
    os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    shard = repo / "data/selfplay/gen-0/part-0.parquet"
    before = shard.stat().st_mtime_ns
    results = loop(str(repo))
    grown = ["train-b4c32-1", "ema-b4c32-1", "gate-b4c32-1"]
    # Each stage in turn, for every net that trains in the generation.
    assert [r["stage"] for r in results] == [f"{s}-0" for s in STAGES] + [
        "selfplay-1", "shuffle-1", "train-1", "train-b4c32-1", "ema-1", "ema-b4c32-1",
        "gate-1", "gate-b4c32-1", "promote-1"]  # fmt: skip
    ran = {r["stage"] for r in results if r["ran"]}
    # Self-play finished (and DVC recorded it) before the kill: it is not redone. The stage
    # running when the kill came (shuffle, or the next if DVC had just recorded it) runs again
    # from scratch, past the lock entries its killed dvc left.
    assert "selfplay-0" not in ran
    assert {"gate-1", "promote-1", "selfplay-1", *grown} <= ran
    assert shard.stat().st_mtime_ns == before  # not redone
    assert results[-1]["metrics"]["generation"] == 1
    assert json.loads((repo / "reports/gate/gen-1.json").read_text())["games"] >= 1
    promotion = json.loads((repo / "models/gen-1/champion/promotion.json").read_text())
    assert promotion["champion"]["net"] == "b4c32"
    assert promotion["line"][0]["net"] == "b2c16"
    # Everything is in DVC's cache and up to date; a second loop runs nothing.
    assert "up to date" in run_in(repo, "dvc", "status")
    assert not any(r["ran"] for r in loop(str(repo)))
    check_mlflow(repo, ran)


def check_mlflow(repo, ran: set[str]) -> None:
    """The MLflow record of the killed and resumed loops: one parent run per loop (the
    killed one marked KILLED), a nested run per stage that ran, and a champion whose
    lineage leads, through the API alone, back to generation 0's uniform self-play."""
    import mlflow
    import torch
    from mlflow import MlflowClient

    from nets.checkpoint import load

    client = MlflowClient(f"sqlite:///{repo}/mlflow.db")
    exp = client.get_experiment_by_name("tengen")
    runs = client.search_runs([exp.experiment_id], max_results=500)
    loops = [r for r in runs if r.data.tags.get("tengen.launcher") == "tengen run"]
    assert sorted(r.info.status for r in loops) == ["FINISHED", "FINISHED", "KILLED"]
    assert all(r.info.status != "RUNNING" for r in runs)
    resumed = min(
        (r for r in loops if r.info.status == "FINISHED"), key=lambda r: r.info.start_time
    )
    nested = {
        r.info.run_name: r
        for r in runs
        if r.data.tags.get("mlflow.parentRunId") == resumed.info.run_id
    }
    assert set(nested) == ran
    assert all(r.info.status == "FINISHED" for r in nested.values())
    train = nested["train-1"]
    assert "loss.total" in train.data.metrics and "train.lr_per_sample" in train.data.params
    history = client.get_metric_history(resumed.info.run_id, "gate_win_rate")
    assert sorted(m.step for m in history) == [0, 1]

    # The champion: the bigger net's generation-1 candidate (gating is off, and the bigger
    # net passing takes over), the same weights as its file.
    champion = client.get_model_version_by_alias("tengen", "champion")
    assert client.get_model_version_by_alias("tengen", "candidate").version == champion.version
    assert champion.tags["tengen.generation"] == "1" and champion.tags["tengen.net"] == "b4c32"
    assert nested["train-b4c32-1"].data.tags["tengen.net"] == "b4c32"
    # The registered model is the checkpoint itself: it loads with weights_only, as
    # docs/pipeline.md shows, and there is no pickled model to load.
    with tracking_uri_for(f"sqlite:///{repo}/mlflow.db"):
        folder = Path(mlflow.artifacts.download_artifacts("models:/tengen@champion"))
    assert sorted(p.name for p in folder.iterdir()) == ["candidate.pt"]
    net, _ = load(folder / "candidate.pt")
    saved, _ = load(repo / "models/gen-1/champion/champion.pt")
    for name, value in saved.state_dict().items():
        assert torch.equal(net.state_dict()[name], value), name

    # Its lineage: model -> the run that made it -> its window -> the self-play runs whose
    # rows the window holds -> the model that played them -> ... -> uniform priors.
    chain, version = [], champion
    while True:
        gen = int(version.tags["tengen.generation"])
        made_by = client.get_run(version.run_id)
        assert made_by.data.tags["tengen.stage"] == "ema"
        [window] = made_by.inputs.dataset_inputs
        assert window.dataset.name == f"window-gen-{gen}"
        assert window.dataset.digest == version.tags["tengen.window_sha256"][:36]
        games = [client.get_run(r) for r in version.tags["tengen.selfplay_runs"].split(",")]
        by_gen = {int(r.data.tags["tengen.generation"]): r for r in games}
        assert sorted(by_gen) == list(range(gen + 1))  # the window spans every generation
        player = by_gen[gen].data.tags["tengen.model_sha256"]
        chain.append(gen)
        if player == "uniform":
            break
        [version] = client.search_model_versions(
            f"name = 'tengen' and tags.`tengen.sha256` = '{player}'"
        )
    assert chain == [1, 0]


def test_killed_stages_are_retried_and_failed_ones_are_not():
    assert failure(1, "failed to run: python -m stages.train, exited with -9") is StageInterrupted
    assert failure(1, "failed to run: python -m stages.train, exited with 137") is StageInterrupted
    assert failure(-9, "") is StageInterrupted  # dvc itself killed
    assert failure(1, "failed to run: python -m stages.train, exited with 2") is StageFailed
    assert failure(1, "failed to run: python -m stages.train, exited with 1") is StageFailed
    assert failure(255, "ERROR: unexpected error") is StageFailed


def test_a_failed_stage_is_said_in_one_block_with_its_own_last_error_line():
    dvc = "ERROR: failed to reproduce 'evaluate-2': failed to run: python -m stages.evaluate"
    log = Path("/run/logs/evaluate-2.log")
    refused = (
        "Running stage 'evaluate-2':\n> python -m stages.evaluate --generation 2\n"
        "evaluate-2: gen-2 vs random: 6 of 10\n"
        "evaluate: error: evaluate.anchor: 'gnugo-2' is not among evaluate.opponents\n"
        f"{dvc} --generation 2, exited with 2\n"
    )
    error = stage_error("evaluate-2", 255, refused, log)
    assert isinstance(error, StageFailed)
    assert str(error).splitlines() == [
        "evaluate-2 failed (exit status 2): evaluate: error: evaluate.anchor: 'gnugo-2' is not "
        "among evaluate.opponents",
        "  its whole output: /run/logs/evaluate-2.log",
        "  Run again to resume at evaluate-2; the stages before it are kept.",
    ]
    # A crash: Python's last line says what it was. A kill: the signal. DVC's own refusal
    # (its lock): DVC's line, the only one there is.
    crash = f"Traceback (most recent call last):\n  ...\nMemoryError: cannot\n{dvc}, exited with 1"
    assert str(stage_error("train-1", 255, crash, log)).startswith(
        "train-1 failed (exit status 1): MemoryError: cannot\n"
    )
    # A kill mid-work: its last lines are progress, not why it stopped.
    killed = stage_error("train-1", 255, f"train-1: 40 of 96 steps\n{dvc}, exited with -9", log)
    assert isinstance(killed, StageInterrupted)
    assert str(killed).startswith(f"train-1 failed (killed by signal 9): {dvc}, exited with -9")
    busy = "ERROR: 'reports/history/gen-2.json' is busy, it is being blocked by: (PID 7: dvc)"
    assert str(stage_error("promote-2", 255, busy, None)).splitlines()[0] == (
        f"promote-2 failed (exit status 255): {busy}"
    )
    assert "its whole output" not in str(stage_error("promote-2", 255, busy, None))


def test_the_generation_summary_takes_the_deciding_gate_and_skips_what_is_not_a_number():
    results = [
        {"stage": "train-2", "ran": True,
         "metrics": {"window_rows": 300, "loss": {"total": 2.5}}},
        # train.net's gate was skipped (a bigger champion): no games, no win rate.
        {"stage": "gate-2", "ran": True,
         "metrics": {"win_rate": None, "skipped": "bigger champion"}},
        {"stage": "gate-b4c32-2", "ran": True, "metrics": {"win_rate": 0.75}},
        {"stage": "promote-2", "ran": True,
         "metrics": {"promoted": True, "decision": {"win_rate": 0.75}}},
        {"stage": "evaluate-2", "ran": False, "metrics": {"elo": -40.0, "elo_stderr": 20.0}},
    ]  # fmt: skip
    expected = {"window_rows": 300.0, "loss_total": 2.5, "gate_win_rate": 0.75, "promoted": 1.0,
                "elo": -40.0, "elo_stderr": 20.0}  # fmt: skip
    assert generation_summary(results) == expected
    # A resumed loop run (tengen ablate's evaluation of generation 2, whose other stages DVC
    # skipped) logs the evaluation alone: the rest is in the run at step 2 already.
    for r in results:
        r["ran"] = r["stage"] == "evaluate-2"
    assert generation_summary(results, ran_only=True) == {"elo": -40.0, "elo_stderr": 20.0}
    results[3]["metrics"] = {"promoted": False, "decision": {"win_rate": None}}
    assert "gate_win_rate" not in generation_summary(results)


def _processes_in(repo) -> list:
    """The processes working in `repo` (a loop, its dvc and stage, Prefect's local server)."""
    import psutil

    found = []
    for p in psutil.process_iter(["cwd", "status"]):
        cwd = p.info.get("cwd") or ""
        if cwd.startswith(str(repo)) and p.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(p)
    return found


@pytest.mark.slow
def test_ctrl_c_and_sigterm_stop_the_loop_and_its_stage_and_the_next_run_resumes(tmp_path):
    """`tengen run` on Prefect's own local server (no test harness): Ctrl-C to its process
    group, then SIGTERM to it alone, each while a stage runs: it exits within seconds, takes
    its stage and the server with it, marks the MLflow runs KILLED and leaves no temporary
    output; the third run finishes the run."""
    from mlflow import MlflowClient

    repo = make_run_repo(tmp_path / "run", code_deps=False, win_fraction=0.0)
    # Training long enough (about 6 s here) that the loop is stopped while train's temporary
    # folder exists: with the tiny run's 4 steps it lasts under 0.1 s and a poll misses it.
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["train"]["samples_per_generation"] = 16 * 400
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    run_in(repo, "git", "commit", "-qam", "train longer")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env["PREFECT_HOME"] = str(tmp_path / "prefect")
    command = [sys.executable, "-m", "flows.cli", "run", "--generations", "1"]

    def start_and_stop(marker: str, how: str) -> int:
        child = subprocess.Popen(
            command, cwd=repo, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True, start_new_session=True,
        )  # fmt: skip
        deadline = time.time() + 600
        while not list(repo.glob(marker)) and time.time() < deadline:
            assert child.poll() is None, child.stderr.read()[-3000:]
            time.sleep(0.1)
        assert list(repo.glob(marker)), f"no {marker} within 10 minutes"
        sent = time.time()
        if how == "group":
            os.killpg(child.pid, signal.SIGINT)
        else:
            child.send_signal(signal.SIGTERM)
        code = child.wait(60)
        took = time.time() - sent
        assert took < 30, f"took {took:.0f} s to stop"
        time.sleep(1)
        assert _processes_in(repo) == [], [p.cmdline() for p in _processes_in(repo)]
        assert not list(repo.rglob(".*.tmp-*")), list(repo.rglob(".*.tmp-*"))
        return code

    # Ctrl-C while generation 0 plays its games (self-play's temporary folder exists).
    assert start_and_stop("data/selfplay/.gen-0.tmp-*", "group") == 128 + signal.SIGINT
    # SIGTERM to the loop alone while train runs.
    assert start_and_stop("models/gen-0/.train.tmp-*", "pid") == 128 + signal.SIGTERM
    client = MlflowClient(f"sqlite:///{repo}/mlflow.db")
    exp = client.get_experiment_by_name("tengen")
    runs = client.search_runs([exp.experiment_id], max_results=100)
    loops = [r for r in runs if r.data.tags.get("tengen.launcher") == "tengen run"]
    assert [r.info.status for r in loops] == ["KILLED", "KILLED"]
    stopped = {r.info.run_name: r.info.status for r in runs if r not in loops}
    assert stopped.get("selfplay-0") in ("KILLED", "FINISHED") and stopped["train-0"] == "KILLED"
    # The next run resumes: self-play's games are not played again, and it finishes.
    finished = subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True,
                              timeout=900)  # fmt: skip
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert "up to date" in run_in(repo, "dvc", "status")
    assert json.loads((repo / "models/gen-0/champion/promotion.json").read_text())["promoted"]


def _tengen_run(repo: Path, tmp_path: Path, *args: str, gnugo: bool = True, **popen):
    """`tengen run` in `repo` as a user runs it (Prefect's own local server, no test harness);
    without `gnugo`, GNU Go is unfindable: off PATH and outside the folders looked in after it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env["PREFECT_HOME"] = str(tmp_path / "prefect")
    if not gnugo:
        env["PATH"] = f"{Path(sys.executable).parent}:/usr/bin:/bin"
        env["TENGEN_PROGRAM_DIRS"] = ""
    command = [sys.executable, "-m", "flows.cli", "run", *args]
    return subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True,
                          timeout=900, **popen)  # fmt: skip


def _one_evaluated_generation(tmp_path: Path) -> Path:
    """make_run_repo's run, one generation long and evaluated (against GNU Go level 0 and the
    random player, GNU Go the referee)."""
    repo = make_run_repo(tmp_path / "run", code_deps=False, win_fraction=0.0, evaluate_every=1)
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["run"]["generations"] = 1
    params["evaluate"]["referee"] = "gnugo --mode gtp --chinese-rules"
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    run_in(repo, "git", "commit", "-qam", "one generation")
    return repo


def _without_gnugo(tmp_path: Path) -> subprocess.CompletedProcess:
    if shutil.which("gnugo", path=f"{Path(sys.executable).parent}:/usr/bin:/bin"):
        pytest.skip("GNU Go is in /usr/bin here: it cannot be made unfindable")
    repo = _one_evaluated_generation(tmp_path)
    done = _tengen_run(repo, tmp_path, gnugo=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.mark.slow
def test_a_run_without_gnugo_evaluates_without_it_and_a_failed_stage_says_so_once(tmp_path):
    # A bare machine: GNU Go nowhere. The run names it before its first stage, with the
    # command that installs it, once; trains; evaluates against the rest; ends with exit 0.
    done = _without_gnugo(tmp_path)
    repo = tmp_path / "run"
    warning = "GNU Go (`gnugo`) is not installed: the evaluations leave out gnugo-0"
    assert done.stderr.count(warning) == 1, done.stderr[-3000:]
    assert "apt-get install -y gnugo" in done.stderr.split(warning)[1].splitlines()[0]
    assert done.stderr.index(warning) < done.stderr.index("selfplay-0")
    assert "Traceback" not in done.stderr
    report = json.loads((repo / "reports/eval/gen-0.json").read_text())
    assert [p["opponent"] for p in report["pairings"]] == ["random"]
    assert {e["opponent"] for e in report["left_out"]} == {"gnugo-0", "referee"}
    assert report["anchor"] == "random" and set(report["ratings"]) == {"gen-0", "random"}
    page = (repo / "reports/report/index.html").read_text()
    assert "Left out of the evaluations" in page and "apt-get install -y gnugo" in page
    assert "champion:" in done.stdout and "/#/experiments/" in done.stdout

    # A stage that fails (an opponent whose command exits at once: a typo in params.yaml)
    # ends the run with one block: the stage, its status, its own error line, its log, how
    # to resume; no Prefect traceback, no message said three times. The log keeps it whole.
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["evaluate"]["opponents"]["typo"] = (
        f"{sys.executable} -c \"import sys; sys.exit('unknown option --levle')\""
    )
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    failed = _tengen_run(repo, tmp_path, gnugo=False)
    assert failed.returncode == 2
    assert "Traceback" not in failed.stderr and failed.stderr.count("pairing typo") == 1
    block = failed.stderr[failed.stderr.index("tengen run: evaluate-0 failed") :].splitlines()
    assert block[0].startswith("tengen run: evaluate-0 failed (exit status 2): evaluate: error: "
                               "evaluate, pairing typo: engine B exited")  # fmt: skip
    log = repo / "logs" / "evaluate-0.log"
    assert block[1] == f"  its whole output: {log}"
    assert block[2] == "  Run again to resume at evaluate-0; the stages before it are kept."
    assert "pairing typo: engine B exited" in log.read_text()
    assert "Traceback" in (repo / "logs/tengen-run.log").read_text()  # kept whole there


@pytest.mark.slow
@pytest.mark.gnugo
def test_once_gnugo_is_installed_the_next_run_plays_what_was_left_out(tmp_path, gnugo_path):
    _without_gnugo(tmp_path)
    repo = tmp_path / "run"
    before = json.loads((repo / "reports/eval/gen-0.json").read_text())
    assert before["left_out"]
    done = _tengen_run(repo, tmp_path)  # GNU Go where it is installed
    assert done.returncode == 0, done.stderr[-3000:]
    assert "GNU Go is installed now: evaluate-0 plays again (it left out gnugo-0, referee)" in (
        done.stderr
    )
    report = json.loads((repo / "reports/eval/gen-0.json").read_text())
    assert [p["opponent"] for p in report["pairings"]] == ["gnugo-0", "random"]
    assert report["left_out"] == [] and report["anchor"] == "gnugo-0"
    assert "anchor_wanted" not in report and report["ratings"]["gnugo-0"]["elo"] == 0.0
    # Only the evaluation ran again; and a third run finds nothing left to play.
    ran = [line for line in done.stderr.splitlines() if ": ran" in line]
    assert len(ran) == 1 and "evaluate-0: ran" in ran[0]
    again = _tengen_run(repo, tmp_path)
    assert again.returncode == 0 and "plays again" not in again.stderr


def test_a_second_run_on_a_folder_in_use_stops_at_once_and_changes_nothing(tmp_path):
    from flows.runs import run_lock

    repo = make_run_repo(tmp_path / "run", code_deps=False)
    with run_lock(repo, command="tengen run (the first terminal)"):
        second = _tengen_run(repo, tmp_path)
    assert second.returncode == 2
    [line] = [line for line in second.stderr.splitlines() if line.startswith("tengen run:")]
    assert f"is in use by another tengen run (process {os.getpid()} on " in line
    assert "(the first terminal)" in line and f"kill {os.getpid()}" in line
    assert "started 20" in line  # its start, ISO 8601
    assert not (repo / "mlflow.db").exists() and not (repo / "data").exists()
    # A run killed while it held the folder leaves no lock behind: the next one takes it.
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; "
         "from flows.runs import run_lock; cm = run_lock(Path(sys.argv[1])); cm.__enter__(); "
         "print('held', flush=True); time.sleep(600)", str(repo)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunLocked, match=f"process {holder.pid} on "), run_lock(repo):
            pass
    finally:
        holder.kill()
        holder.wait()
    with run_lock(repo):  # stale: taken over
        assert f'"pid": {os.getpid()}' in (repo / ".dvc/tmp/tengen-run.lock").read_text()
