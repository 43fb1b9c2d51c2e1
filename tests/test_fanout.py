"""Self-play's shards (stages.selfplay) and where they run (stages.fanout): in the stage's
process or on a real Dask LocalCluster through prefect-dask, byte for byte the same files;
a worker killed mid-shard and the generation still whole, each shard once; the gate's batches
and the evaluate stage's engine pairs on a LocalCluster, the same games as one process."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from play.programs import install_command
from play.sgf import read_sgf
from stages import selfplay as stage
from stages.fanout import each_shard_once
from stages.params import ClusterParams, ParamsError, SelfPlayParams, load_params, read, section
from tests.conftest import REPO
from tests.test_selfplay import check_generation, small_params


def files_of(folder: Path) -> dict[str, str]:
    """Every file under a generation's folder (relative name -> SHA-256)."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def params_file(tmp_path: Path, cluster: dict | None = None, **selfplay) -> Path:
    params = small_params(**selfplay)
    if cluster is not None:
        params["cluster"] = dict(params["cluster"], **cluster)
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


def in_process(tmp_path: Path, name: str, generation: int, model=None, **selfplay) -> Path:
    """The stage's run() in this process (cluster: null)."""
    folder = tmp_path / name
    folder.mkdir(exist_ok=True)
    params, io = stage.prepare(
        params_file(folder, **selfplay), generation, model=model or "uniform",
        out=folder / f"gen-{generation}", metrics=folder / f"gen-{generation}.json",
    )  # fmt: skip
    stage.run(params, io, progress=False)
    return io.out


def stage_command(params: Path, out: Path, generation: int, model) -> list[str]:
    return [
        sys.executable, "-m", "stages.selfplay", "--generation", str(generation),
        "--params", str(params), "--model", str(model or "uniform"), "--out", str(out),
        "--metrics", str(out.parent / f"gen-{generation}.json"), "--quiet",
    ]  # fmt: skip


def environment(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ, MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path}/mlflow.db")
    env.pop("PREFECT_API_URL", None)  # the stage starts its own temporary API
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return env


def stop(processes: list[subprocess.Popen]) -> None:
    """Terminate the processes (the last started first), killing one that lingers."""
    for p in reversed(processes):
        p.terminate()
    for p in processes:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()


# -- the plan -------------------------------------------------------------------------------


def test_games_split_evenly_each_shard_its_own_seed():
    sp = section(small_params(games=10, shards=3), "selfplay", SelfPlayParams, source="test")
    plan = stage.shard_plan(sp, generation=4)
    assert [s.games for s in plan] == [4, 3, 3]
    assert [s.index for s in plan] == [0, 1, 2] and {s.count for s in plan} == {3}
    assert len({s.seed for s in plan}) == 3
    assert plan == stage.shard_plan(sp, generation=4)  # fixed by (seed, generation, shard)
    assert {s.seed for s in plan}.isdisjoint(s.seed for s in stage.shard_plan(sp, generation=5))
    assert plan[1].game_id(4, sp.seed, 7) == f"g4-s{sp.seed}-k1-000007"


def test_one_shard_keeps_the_generation_seed_and_game_ids_of_older_runs():
    sp = section(small_params(games=10, shards=1), "selfplay", SelfPlayParams, source="test")
    (only,) = stage.shard_plan(sp, generation=2)
    assert only.seed == stage.game_seed(sp.seed, 2) and only.games == 10
    assert only.game_id(2, sp.seed, 7) == f"g2-s{sp.seed}-000007"


def test_more_shards_than_games_is_a_params_error():
    with pytest.raises(ParamsError, match=r"selfplay: shards \(7\) must not exceed games \(6\)"):
        section(small_params(games=6, shards=7), "selfplay", SelfPlayParams, source="p.yaml")


def test_fewer_games_than_shards_on_the_command_line_is_a_params_error(tmp_path):
    path = params_file(tmp_path, games=6, shards=3)
    with pytest.raises(ParamsError, match=r"--games must be at least selfplay.shards \(3; got 2\)"):
        stage.prepare(path, 0, model="uniform", out=tmp_path / "gen-0", games=2)


def test_a_run_folder_from_before_shards_reads_as_one_shard_in_this_process(tmp_path):
    """params.yaml written before `selfplay.shards` and `cluster:` existed: one shard, here;
    the file itself is not changed (DVC sees the same sections)."""
    params = small_params()
    del params["selfplay"]["shards"], params["cluster"]
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    before = path.read_bytes()
    assert read(path, stage.Params).selfplay.shards == 1
    cluster = section(load_params(path), "cluster", ClusterParams, source=path)
    assert cluster.address is None and cluster.worker_threads == 1
    assert path.read_bytes() == before


@pytest.mark.parametrize(
    ("address", "problem"),
    [("local:0", "cluster.address"), ("8786", "cluster.address"), ("local:two", "address")],
)
def test_a_bad_cluster_address_exits_2_naming_the_key(tmp_path, address, problem):
    path = params_file(tmp_path, cluster={"address": address})
    out = tmp_path / "gen-0"
    done = subprocess.run(
        stage_command(path, out, 0, None), capture_output=True, text=True,
        env=environment(tmp_path), timeout=300,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert problem in done.stderr and str(path) in done.stderr
    assert not out.exists()


def test_a_scheduler_that_does_not_answer_exits_2_before_any_game(tmp_path):
    path = params_file(tmp_path, cluster={"address": "tcp://127.0.0.1:1"}, shards=2)
    out = tmp_path / "gen-0"
    done = subprocess.run(
        stage_command(path, out, 0, None), capture_output=True, text=True,
        env=environment(tmp_path), timeout=300,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    assert "cluster.address tcp://127.0.0.1:1: no Dask scheduler answered" in done.stderr
    assert "Traceback" not in done.stderr and not out.exists()


def test_shards_came_back_twice_or_not_at_all_is_an_error():
    one = stage.ShardResult(0, [], {}, stage._Stats(), 0, 0, 0, 0.0, "m", "h:1")
    two = stage.ShardResult(1, [], {}, stage._Stats(), 0, 0, 0, 0.0, "m", "h:2")
    assert [r.index for r in each_shard_once([two, one], [0, 1], "selfplay gen-0")] == [0, 1]
    with pytest.raises(
        RuntimeError, match=r"gen-0: shards \[0, 0\] came back; expected each of \[0, 1\]"
    ):
        each_shard_once([one, one], [0, 1], "selfplay gen-0")
    with pytest.raises(RuntimeError, match=r"shards \[1\] came back"):
        each_shard_once([two], [0, 1], "selfplay gen-0")


def test_three_shards_in_process_make_one_sound_generation(tmp_path, tiny_model):
    out = in_process(tmp_path, "three", 1, tiny_model, games=7, shards=3, rows_per_shard=40)
    metrics = json.loads((tmp_path / "three" / "gen-1.json").read_text())
    assert metrics["games"] == 7 and metrics["shards"] == 3
    rows = check_generation(out)  # every row against its game's SGF
    played = [p.stem for p in (out / "sgf").glob("*.sgf") if "side position" not in
              (read_sgf(p).root_comment or "")]  # fmt: skip
    per_shard = {k: sum(f"-k{k}-" in g for g in played) for k in range(3)}
    assert per_shard == {0: 3, 1: 2, 2: 2}
    manifest = json.loads((out / "manifest.json").read_text())
    assert sum(f["rows"] for f in manifest["files"]) == len(rows) == metrics["rows"]


# -- on a Dask cluster ----------------------------------------------------------------------


@pytest.mark.slow
def test_local_cluster_gives_the_same_files_as_one_process(tmp_path, tiny_model):
    """Two generations (uniform priors, then a net) with 3 shards: on a LocalCluster of 2
    worker processes through prefect-dask (the stage as dvc.yaml runs it) and in one process,
    every Parquet file, SGF and the manifest byte for byte the same."""
    shape = dict(games=6, shards=3, rows_per_shard=40)
    for generation, model in ((0, None), (1, tiny_model)):
        here = in_process(tmp_path, "here", generation, model, **shape)
        folder = tmp_path / "cluster"
        folder.mkdir(exist_ok=True)
        path = params_file(folder, cluster={"address": "local:2"}, **shape)
        out = folder / f"gen-{generation}"
        done = subprocess.run(
            stage_command(path, out, generation, model), capture_output=True, text=True,
            env=environment(tmp_path), timeout=600,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        assert "3 shards on local:2" in done.stderr
        assert files_of(out) == files_of(here)
        metrics = json.loads((folder / f"gen-{generation}.json").read_text())
        assert metrics["cluster"] == "local:2" and metrics["workers"] == 2
        assert metrics["shards"] == 3 and metrics["games"] == 6
        assert len(set(metrics["shard_seeds"])) == 3


@pytest.mark.slow
def test_a_standing_cluster_runs_the_shards_on_the_worker_with_the_resource_they_ask(
    tmp_path, tiny_model, prefect_api
):
    """docs/cluster.md's several-machine recipe on one machine: `dask scheduler`, a `dask worker`
    and a second started with `--resources GPU=1`, every process on one Prefect API; with
    cluster.address tcp://... and cluster.resources {GPU: 1} every shard runs on the second
    worker (dask.annotate through prefect-dask), and the files are one process's."""
    from distributed import Client
    from prefect.settings import PREFECT_API_URL

    from stages.fanout import worker_environment
    from tests.test_remote import free_port

    shape = dict(games=6, shards=3, rows_per_shard=40)
    here = in_process(tmp_path, "here", 1, tiny_model, **shape)
    env = dict(environment(tmp_path), PREFECT_API_URL=PREFECT_API_URL.value())
    env.update(worker_environment(1))
    dask_cli = str(Path(sys.executable).parent / "dask")
    address = f"tcp://127.0.0.1:{free_port()}"
    worker = [dask_cli, "worker", address, "--nthreads", "1", "--no-nanny", "--no-dashboard"]
    logs = tmp_path / "dask"
    logs.mkdir()
    processes = []

    def start(name: str, *cmd: str) -> subprocess.Popen:
        with (logs / f"{name}.log").open("w") as out:
            processes.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env))
        return processes[-1]

    try:
        start("scheduler", dask_cli, "scheduler", "--host", "127.0.0.1",
              "--port", address.rsplit(":", 1)[1], "--no-dashboard")  # fmt: skip
        start("plain", *worker, "--name", "plain")
        gpu = start("gpu", *worker, "--name", "gpu", "--resources", "GPU=1")
        with Client(address, timeout="60s", set_as_default=False) as client:
            client.wait_for_workers(2, timeout=120)
        folder = tmp_path / "cluster"
        folder.mkdir()
        path = params_file(folder, cluster={"address": address, "resources": {"GPU": 1}},
                           **shape)  # fmt: skip
        out = folder / "gen-1"
        done = subprocess.run(stage_command(path, out, 1, tiny_model), capture_output=True,
                              text=True, env=env, timeout=600)  # fmt: skip
        logged = "".join(p.read_text() for p in sorted(logs.glob("*.log")))
        assert done.returncode == 0, done.stderr[-3000:] + logged[-3000:]
        assert f"3 shards on {address}" in done.stderr
        assert files_of(out) == files_of(here)
        metrics = json.loads((folder / "gen-1.json").read_text())
        assert metrics["cluster"] == address and metrics["workers"] == 1
        assert [w.rsplit(":", 1)[1] for w in metrics["shard_workers"]] == [str(gpu.pid)] * 3
    finally:
        stop(processes)


def _workers(stage_pid: int) -> list[psutil.Process]:
    """The Dask worker processes of the stage's LocalCluster: its nannies run in the stage's
    process and start each worker with multiprocessing's spawn."""
    try:
        children = psutil.Process(stage_pid).children()
        return [p for p in children if "spawn_main" in " ".join(p.cmdline())]
    except psutil.Error:
        return []


def _running_shards(api_url: str, flow_run: str) -> int:
    """The shard task runs RUNNING in the stage's flow run, by Prefect's API."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterId,
        TaskRunFilter,
        TaskRunFilterState,
        TaskRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: api_url}), get_client(sync_client=True) as c:
        runs = c.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run])),
            task_run_filter=TaskRunFilter(
                state=TaskRunFilterState(type=TaskRunFilterStateType(any_=[StateType.RUNNING]))
            ),
        )
    return sum(" shard-" in run.name for run in runs)


@pytest.mark.slow
def test_a_worker_killed_mid_shard_and_every_shard_still_once(tmp_path, tiny_model):
    """4 shards on 2 workers; once both workers are inside a shard (Prefect's API says two
    task runs are RUNNING), one is killed with SIGKILL. Dask reschedules its shard; the
    generation comes out whole, each shard once, the same files as in one process."""
    shape = dict(games=8, shards=4, rows_per_shard=40, full_visits=48, cheap_visits=12)
    here = in_process(tmp_path, "here", 1, tiny_model, **shape)
    folder = tmp_path / "cluster"
    folder.mkdir()
    path = params_file(folder, cluster={"address": "local:2"}, **shape)
    out = folder / "gen-1"
    log = folder / "stage.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(
            stage_command(path, out, 1, tiny_model), stdout=subprocess.DEVNULL, stderr=sink,
            text=True, env=environment(tmp_path),
        )  # fmt: skip
    killed = None
    try:
        deadline = time.monotonic() + 300
        api_url = flow_run = None
        while killed is None and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
            text = log.read_text()
            if api_url is None and "temporary API for this stage at " in text:
                api_url = text.split("temporary API for this stage at ")[1].split()[0]
            if flow_run is None and "/runs/flow-run/" in text:
                flow_run = text.split("/runs/flow-run/")[1].split()[0]
            if api_url and flow_run and _running_shards(api_url, flow_run) >= 2:
                workers = _workers(proc.pid)
                if len(workers) == 2:
                    killed = workers[0].pid
                    workers[0].kill()
        assert killed is not None, f"no worker was killed mid-shard:\n{log.read_text()[-3000:]}"
        assert proc.wait(timeout=600) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert files_of(out) == files_of(here)
    metrics = json.loads((folder / "gen-1.json").read_text())
    assert metrics["games"] == 8 and metrics["shards"] == 4
    assert metrics["workers"] >= 2  # the killed worker's shard ran again on another process


# -- the gate's games ---------------------------------------------------------------------


def gate_params(folder: Path, address: str | None, **gate) -> Path:
    """params.yaml with the gate shrunk to 5 games on 5x5 in batches of 2, 2 and 1 (one shard
    each)."""
    params = small_params()
    params["gate"].update(
        games=5, slots=2, visits=4, leaves_per_game=2, board_size=5, komi=0.5, **gate
    )
    params["cluster"]["address"] = address
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


@pytest.mark.slow
def test_the_gate_on_a_local_cluster_keeps_the_games_and_decision_of_one_process(
    tmp_path, tiny_model
):
    """The gate's batches as shards on 2 workers: the same SGFs and decision as in one process,
    with early_stop (decided in game order from the batches that came back) and without."""
    import torch

    from nets.checkpoint import save
    from nets.config import net_config
    from nets.model import GoNet

    torch.manual_seed(1)
    champion = save(GoNet(net_config("b2c16")), tmp_path / "champion.pt", {"model_id": "champ"})
    for early_stop, win_fraction in ((True, 1.0), (False, 0.5)):
        runs = {}
        for address in (None, "local:2"):
            folder = tmp_path / f"{early_stop}-{address}".replace(":", "")
            path = gate_params(folder, address, early_stop=early_stop, win_fraction=win_fraction)
            command = [
                sys.executable, "-m", "stages.gate", "--generation", "2", "--params", str(path),
                "--candidate", str(tiny_model), "--champion", str(champion),
                "--out", str(folder / "gate"), "--decision", str(folder / "gate.json"),
            ]  # fmt: skip
            done = subprocess.run(
                command, capture_output=True, text=True, env=environment(folder), timeout=600
            )
            assert done.returncode == 0, done.stderr[-3000:]
            runs[address] = (json.loads((folder / "gate.json").read_text()),
                             files_of(folder / "gate"))  # fmt: skip
        (here, here_files), (there, there_files) = runs[None], runs["local:2"]
        assert there_files == here_files and len(here_files) == here["games"]
        assert there.pop("cluster") == "local:2" and there.pop("workers") == 2
        assert there.pop("games_played") == 5  # every batch played there
        shard_workers = there.pop("shard_workers")  # host:pid of the batches 2, 2 and 1
        assert len(shard_workers) == 3 and len(set(shard_workers)) == 2
        assert there == here
        if early_stop:  # 5 wins of 5 needed: decided in the first batch with a game not won
            assert here["stopped_early"] and here["games"] < 5
        else:
            assert here["games"] == 5


# -- the evaluate stage's games ----------------------------------------------------------


@pytest.mark.slow
def test_evaluate_on_a_local_cluster_plays_the_games_of_one_process(tmp_path, tiny_model):
    """Generation 1's evaluation against the random player and generation 0's champion (the
    uniform priors; the champion's checkpoint and params.yaml go to the workers as bytes): each
    pairing's 2 engine pairs as shards on 2 workers play the games one process plays."""
    import shutil

    import torch

    from nets.checkpoint import save
    from nets.config import net_config
    from nets.model import GoNet

    base = tmp_path / "base"
    for k in (0, 1):
        folder = base / "models" / f"gen-{k}" / "champion"
        folder.mkdir(parents=True)
        if k == 0:  # promoted nothing: the uniform priors (no checkpoint to send)
            (folder / "promotion.json").write_text('{"promoted": false}')
        else:
            torch.manual_seed(k)
            save(GoNet(net_config("b2c16")), folder / "champion.pt", {"model_id": f"champ-{k}"})
        (base / "reports" / "selfplay").mkdir(parents=True, exist_ok=True)
        (base / "reports" / "selfplay" / f"gen-{k}.json").write_text('{"evaluations": 100}')
    params = small_params()
    params["evaluate"].update(
        games=2, board_size=5, komi=0.5, visits=4, workers=2, timeout=60, past_champions=1,
        opponents={"random": "{tengen} gtp --player random --seed 1"}, anchor="random",
        referee=None,
    )  # fmt: skip

    def evaluate(
        folder: Path, generation: int, earlier: str = "", **env: str
    ) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "stages.evaluate", "--generation", str(generation)]
        command += ["--earlier", earlier] if earlier else []
        return subprocess.run(
            command, capture_output=True, text=True, env={**environment(folder), **env},
            timeout=600, cwd=folder,
        )  # fmt: skip

    (base / "params.yaml").write_text(yaml.safe_dump(params))
    first = evaluate(base, 0)
    assert first.returncode == 0, first.stderr[-3000:]
    reports = {}
    for address in (None, "local:2"):
        folder = tmp_path / str(address).replace(":", "")
        shutil.copytree(base, folder)
        params["cluster"]["address"] = address
        (folder / "params.yaml").write_text(yaml.safe_dump(params))
        done = evaluate(folder, 1, "0")
        assert done.returncode == 0, done.stderr[-3000:]
        report = json.loads((folder / "reports" / "eval" / "gen-1.json").read_text())
        games = folder / "reports" / "eval" / "gen-1"
        sgfs = {str(p.relative_to(games)): p.read_bytes() for p in games.rglob("*.sgf")}
        reports[address] = (report, sgfs, done.stderr)
    (here, here_games, _), (there, there_games, log) = reports[None], reports["local:2"]
    assert "4 shards on local:2" in log and there["cluster"] == "local:2"
    assert [p["opponent"] for p in there["pairings"]] == ["random", "gen-0"]
    assert there_games == here_games and len(here_games) == 4
    for mine, theirs in zip(here["pairings"], there["pairings"], strict=True):
        assert "--model uniform" in theirs.pop("command") or theirs["opponent"] == "random"
        mine.pop("command")
        assert mine == theirs
    assert here["ratings"] == there["ratings"]

    # Workers without GNU Go (off PATH, outside /usr/games): its rung plays none of its games
    # there and the referee scores none, each said once; the rest are the same games.
    folder = tmp_path / "without-gnugo"
    shutil.copytree(base, folder)
    params["cluster"]["address"] = "local:2"
    params["evaluate"]["opponents"]["gnugo-0"] = "gnugo --mode gtp --level 0 --chinese-rules"
    params["evaluate"]["referee"] = "gnugo --mode gtp --chinese-rules"
    (folder / "params.yaml").write_text(yaml.safe_dump(params))
    done = evaluate(folder, 1, "0", PATH=f"{Path(sys.executable).parent}:/usr/bin:/bin",
                    TENGEN_PROGRAM_DIRS="")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((folder / "reports" / "eval" / "gen-1.json").read_text())
    assert [p["opponent"] for p in report["pairings"]] == ["random", "gen-0"]
    host = socket.gethostname()
    assert report["left_out"] == [
        {"opponent": "gnugo-0", "program": "gnugo", "install": install_command("gnugo"),
         "where": host, "games": 2},
        {"opponent": "referee", "program": "gnugo", "install": install_command("gnugo"),
         "where": host},
    ]  # fmt: skip
    warning = f"warning: GNU Go (`gnugo`) is not installed on {host}: the evaluations leave out"
    assert done.stderr.count(warning) == 1, done.stderr[-3000:]
    games = folder / "reports" / "eval" / "gen-1"
    assert {str(p.relative_to(games)): p.read_bytes() for p in games.rglob("*.sgf")} == here_games
