"""`tengen ablate`: the arms' params, matched compute points, the acceleration factors, and a
tiny ablation end to end (run folders, DVC, the evaluation ladder, MLflow's Elo-vs-compute
metrics, the chart), resumed without redoing anything."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import yaml

from flows import ablate as A
from flows.runs import merge
from stages import params as P
from stages.params import load_params
from tests.conftest import REPO

REFERENCE_CURVE = [
    {"evaluations": 1000.0, "elo": -200.0, "elo_stderr": 50.0},
    {"evaluations": 2000.0, "elo": 0.0, "elo_stderr": 50.0},
    {"evaluations": 4000.0, "elo": 200.0, "elo_stderr": 50.0},
]


def _arm(evaluations, elo, stderr=0.0):
    return [{"evaluations": evaluations, "elo": elo, "elo_stderr": stderr}]


def test_the_acceleration_factor_reads_the_reference_curve():
    # The same Elo at the same compute: 1.
    assert A.acceleration(REFERENCE_CURVE, _arm(2000, 0))["factor"] == 1.0
    # Elo 100 at 1000 evaluations: the reference needs 2000 + 2000 * 100 / 200 = 3000 -> 3x.
    assert A.acceleration(REFERENCE_CURVE, _arm(1000, 100))["factor"] == 3.0
    # Elo -100 after 4000 evaluations: the reference had it at 1500 -> 0.375 (slower).
    slow = A.acceleration(REFERENCE_CURVE, _arm(4000, -100, stderr=25.0))
    assert slow["factor"] == 0.375 and slow["bound"] == ""
    # Its interval: Elo -100 -+ 1.96 * 25 = -149 / -51 -> 1255 / 1745 evaluations.
    low, high = slow["interval"]
    assert low == pytest.approx((1000 + 1000 * 51.0 / 200) / 4000, abs=1e-3)
    assert high == pytest.approx((1000 + 1000 * 149.0 / 200) / 4000, abs=1e-3)
    # Beyond the reference's best: a lower bound; below its first point: an upper bound.
    above = A.acceleration(REFERENCE_CURVE, _arm(2000, 300))
    assert above["bound"] == ">" and above["factor"] == 2.0
    below = A.acceleration(REFERENCE_CURVE, _arm(2000, -400))
    assert below["bound"] == "<" and below["factor"] == 0.5
    # A dip of the reference between points is noise: its best so far counts.
    dipping = [*REFERENCE_CURVE[:2], {"evaluations": 3000.0, "elo": -50.0, "elo_stderr": 0.0},
               REFERENCE_CURVE[2]]  # fmt: skip
    assert A.acceleration(dipping, _arm(1000, 0))["factor"] == 2.0
    assert A.acceleration([], _arm(1000, 0))["factor"] is None
    # The interval's ends carry their own bounds: Elo 150 -+ 98 -> 2,520 evaluations and
    # beyond the reference's best (at most its 4,000).
    ends = A.acceleration(REFERENCE_CURVE, _arm(2000, 150, stderr=50.0))
    assert ends["interval"] == [1.26, 2.0] and ends["interval_bounds"] == ["", ">"]
    assert "[1.26, >2.00]" in A.format_report({"ablation": "t", "budget": 1.0, "points": [1.0],
        "arms": {"x": {"points": _arm(2000, 150, 50.0), "acceleration": ends}}})  # fmt: skip
    # The reference's first Elo: reached there or before it.
    assert A.acceleration(REFERENCE_CURVE, _arm(1000, -200))["bound"] == "<"


def test_every_arm_is_a_valid_params_yaml_on_the_shipped_defaults():
    base = load_params(REPO / "params.yaml")
    ab = A.Ablation("t", REPO / "runs" / "ablate-t", (A.REFERENCE, "gumbel"), 1e6, 2)
    models = {"selfplay": P.SelfPlayParams, "train": P.TrainParams, "loss": P.LossParams,
              "evaluate": P.EvaluateParams, "mlflow": P.MlflowParams}  # fmt: skip
    for arm in [*A.ARMS, "fixed-cap-32"]:
        raw = merge(base, ab.change(arm))
        parsed = {k: P.section(raw, k, m, source=arm) for k, m in models.items()}
        # Every arm is rated on the fixed ladder alone, at its compute points only.
        assert parsed["evaluate"].every == 0 and parsed["evaluate"].past_champions == 0
        assert parsed["mlflow"].experiment == f"ablate-t/{arm}"
        root = parsed["selfplay"].search.root
        assert root == ("gumbel" if arm == "gumbel" else "puct"), arm
        assert parsed["selfplay"].record_cheap_searches is False  # the paper's rows
    raw = merge(base, ab.change("fixed-cap-32"))
    assert raw["selfplay"]["full_visits"] == 32 and raw["selfplay"]["full_probability"] == 1.0
    assert merge(base, ab.change("no-global-pooling"))["train"]["global_pooling"] is False
    assert merge(base, ab.change("no-go-features"))["train"]["go_features"] is False
    no_aux = merge(base, ab.change("no-ownership-score"))
    assert no_aux["loss"]["ownership"] == 0 and no_aux["loss"]["score_pdf"] == 0
    assert no_aux["loss"]["policy"] == base["loss"]["policy"]
    assert merge(base, ab.change("no-forced-playouts"))["selfplay"]["search"][
        "forced_playouts_k"] == 0  # fmt: skip
    with pytest.raises(A.AblationError, match="unknown arm 'no-komi'"):
        A.arm_change("no-komi")


def test_an_ablation_is_made_once_and_can_only_grow(tmp_path):
    with pytest.raises(A.AblationError, match="needs --budget"):
        A.open_ablation("x", ["gumbel"], budget=None, points=None, root=tmp_path)
    with pytest.raises(A.AblationError, match="at least one arm"):
        A.open_ablation("x", [], budget=10, points=None, root=tmp_path)
    with pytest.raises(A.AblationError, match="letters, digits"):
        A.open_ablation("../x", ["gumbel"], budget=10, points=None, root=tmp_path)
    ab = A.open_ablation("x", ["gumbel", "full"], budget=10, points=3, root=tmp_path)
    assert ab.arms == ("full", "gumbel") and ab.targets() == pytest.approx([10 / 3, 20 / 3, 10])
    (ab.folder).mkdir(parents=True)
    (ab.folder / A.SPEC).write_text(json.dumps(ab.spec()))
    again = A.open_ablation("x", ["no-go-features"], budget=None, points=None, root=tmp_path)
    assert again.arms == ("full", "gumbel", "no-go-features") and again.budget == 10
    with pytest.raises(A.AblationError, match="can grow, not shrink"):
        A.open_ablation("x", None, budget=5, points=None, root=tmp_path)
    with pytest.raises(A.AblationError, match="made with 3 points"):
        A.open_ablation("x", None, budget=None, points=4, root=tmp_path)


def _evaluated_arm(ab, arm, results):
    """An arm folder with one evaluation at generation 0: {opponent: (wins, games)}, and the
    Elo its own fit would give (pinned at -500 by the lost anchor pairing, whatever else)."""
    folder = ab.arm_folder(arm)
    (folder / "reports/eval").mkdir(parents=True)
    evaluate = {"at": [0], "anchor": "gnugo-1", "anchor_elo": 0.0, "prior_draws": 1.0}
    (folder / "params.yaml").write_text(yaml.safe_dump({"evaluate": evaluate}))
    pairings = [{"a": "gen-0", "b": name, "opponent": name, "games": games, "a_score": wins}
                for name, (wins, games) in results.items()]  # fmt: skip
    report = {
        "generation": 0,
        "champion": "gen-0",
        "elo": -500.0,
        "elo_stderr": 250.0,
        "selfplay_evaluations": 1000.0,
        "selfplay_seconds": 10.0,
        "pairings": pairings,
    }
    (folder / "reports/eval/gen-0.json").write_text(json.dumps(report))


def test_the_arms_are_rated_in_one_fit_over_all_their_games(tmp_path):
    # Both arms lose every game to the anchor; the reference wins 9 of 10 against GNU Go
    # giving five stones where the other arm wins 1. Each arm's own fit cannot tell them
    # apart (both -500); one fit over both, where the rung is one player, must.
    ab = A.Ablation("j", tmp_path / "ablate-j", ("full", "gumbel"), 1000.0, 1)
    _evaluated_arm(ab, "full", {"gnugo-1": (0, 10), "gnugo-1-h5": (9, 10), "random": (10, 10)})
    _evaluated_arm(ab, "gumbel", {"gnugo-1": (0, 10), "gnugo-1-h5": (1, 10), "random": (10, 10)})
    rep = A.report(ab)
    assert rep["rating"] == "one Bradley-Terry fit over every arm's games"
    (full,), (gumbel,) = rep["arms"]["full"]["points"], rep["arms"]["gumbel"]["points"]
    assert full["elo_arm"] == gumbel["elo_arm"] == -500.0
    # 9/10 against 1/10 on one common player: about 2 x 400 log10(9) = 763 Elo apart before
    # the prior's virtual draws shrink it; the stderr of each well under the gap.
    gap = full["elo"] - gumbel["elo"]
    assert 400 < gap < 763 and full["elo_stderr"] < gap / 2
    assert full["elo"] < 0  # still below the anchor it never beat
    # The reference curve then ends above the arm: the reference reached the arm's Elo at
    # its first point or before it.
    acc = rep["arms"]["gumbel"]["acceleration"]
    assert acc["bound"] == "<" and acc["factor"] == 1.0


def _tiny_base(path):
    params = load_params(REPO / "params.yaml")
    params["run"]["generations"] = 1
    # Rows of full searches only in every arm (the paper's): half the searches full.
    params["selfplay"].update(games=4, slots=4, full_visits=8, cheap_visits=2, decided_visits=2,
                              full_probability=0.5, board_sizes={5: 1.0})  # fmt: skip
    params["shuffle"].update(window_c=100, rows_per_file=50)
    params["train"].update(net="b2c16", tensor=5, batch_size=16, samples_per_generation=64,
                           warmup_samples=0, threads=1)  # fmt: skip
    params["ema"].update(bn_batches=1, bn_batch_size=16, threads=1)
    params["gate"]["games"] = 0
    params["evaluate"].update(
        games=2, board_size=5, komi=0.5, visits=2, workers=1, referee=None,
        opponents={"random": "{tengen} gtp --player random --seed 1"}, anchor="random",
    )  # fmt: skip
    path.write_text(yaml.safe_dump(params))
    return path


@pytest.mark.slow
def test_a_tiny_ablation_end_to_end_and_resumed(tmp_path, prefect_api, monkeypatch):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    import mlflow

    base = _tiny_base(tmp_path / "base.yaml")
    runs = tmp_path / "runs"
    # Two points on a budget that one tiny generation passes: the second point is the first's
    # generation again, not another evaluation.
    rep = A.ablation_flow("t", ["no-opponent-policy"], budget=2, points=2, base=str(base),
                          root=str(runs))  # fmt: skip
    folder = runs / "ablate-t"
    assert set(rep["arms"]) == {"full", "no-opponent-policy"}
    for arm, a in rep["arms"].items():
        params = load_params(folder / arm / "params.yaml")
        assert params["selfplay"]["search"]["root"] == "puct"
        assert params["loss"]["opponent_policy"] == (0.0 if arm != "full" else 0.15)
        assert params["evaluate"]["at"] == [0]  # one evaluation for both points
        (point,) = a["points"]
        assert point["generation"] == 0 and point["evaluations"] > 2
        report = json.loads((folder / arm / "reports/eval/gen-0.json").read_text())
        assert report["pairings"][0]["games"] == 2 and report["anchor"] == "random"
        assert point["elo_arm"] == report["elo"]  # its own fit; "elo" is the one over both
        # The arm's stages are DVC's: nothing left to do.
        status = _dvc_status(folder / arm)
        assert status == {}, status
    acc = rep["arms"]["no-opponent-policy"]["acceleration"]
    assert acc is not None and "factor" in acc
    assert (folder / "elo.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    plots = yaml.safe_load((folder / "dvc.yaml").read_text())["plots"]
    assert set(next(iter(plots[0].values()))["y"]) == {
        "points/full.json", "points/no-opponent-policy.json"}  # fmt: skip
    assert json.loads((folder / "points/full.json").read_text())[0]["generation"] == 0
    shown = subprocess.run([sys.executable, "-m", "dvc", "plots", "show", "--json"], cwd=folder,
                           capture_output=True, text=True, check=True).stdout  # fmt: skip
    (chart,) = json.loads(shown)["data"].values()
    drawn = {row["filename"] for row in chart[0]["content"]["data"]["values"]}
    assert drawn == {"full.json", "no-opponent-policy.json"}

    # MLflow: an experiment marked model training, one run per arm, Elo stepped by compute.
    client = mlflow.MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    exp = client.get_experiment_by_name("ablate-t")
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    arm_runs = {r.info.run_name: r for r in client.search_runs([exp.experiment_id])}
    assert set(arm_runs) == {"full", "no-opponent-policy"}
    for arm, run in arm_runs.items():
        assert run.info.status == "FINISHED"
        (elo,) = client.get_metric_history(run.info.run_id, "elo")
        (point,) = rep["arms"][arm]["points"]
        assert elo.step == round(point["evaluations"]) and elo.value == point["elo"]
        assert "elo.png" in {f.path for f in client.list_artifacts(run.info.run_id)}
    stage_exp = client.get_experiment_by_name("ablate-t/no-opponent-policy")
    assert stage_exp.tags["mlflow.experimentKind"] == "custom_model_development"
    before = len(client.search_runs([stage_exp.experiment_id]))

    # The arm grew by loops of a generation (and one to evaluate): all in one loop run.
    def loop_runs():
        where = "tags.`tengen.launcher` = 'tengen run'"
        return client.search_runs([stage_exp.experiment_id], where)

    (loop_run,) = loop_runs()
    assert loop_run.info.status == "FINISHED" and loop_run.data.tags["run.generations"] == "1"
    stages = client.search_runs([stage_exp.experiment_id], "tags.`tengen.stage` != ''")
    assert {r.data.tags.get("mlflow.parentRunId") for r in stages} == {loop_run.info.run_id}

    # Again: every point is there; nothing runs, nothing is logged twice.
    again = A.ablation_flow("t", None, base=str(base), root=str(runs))
    assert again["arms"] == rep["arms"]
    assert len(client.search_runs([stage_exp.experiment_id])) == before
    (elo,) = client.get_metric_history(arm_runs["full"].info.run_id, "elo")
    text = A.format_report(again)
    assert "full" in text and "1 (reference)" in text and "no-opponent-policy" in text

    # An evaluation that did not finish (stopped, or GNU Go missing) is run again before the
    # arm goes on: no generation is added for it.
    arm = folder / "no-opponent-policy"
    (arm / "reports/eval/gen-0.json").unlink()
    resumed = A.ablation_flow("t", None, root=str(runs), base=str(base))
    assert resumed["arms"]["no-opponent-policy"]["points"][0]["generation"] == 0
    assert (arm / "reports/eval/gen-0.json").exists() and not (arm / "models/gen-1").exists()
    assert load_params(arm / "params.yaml")["evaluate"]["at"] == [0]
    assert _dvc_status(arm) == {}
    assert [r.info.run_id for r in loop_runs()] == [loop_run.info.run_id]
    assert loop_runs()[0].info.status == "FINISHED"


def _dvc_status(folder):
    out = subprocess.run(
        [sys.executable, "-m", "dvc", "status", "--json"], cwd=folder, capture_output=True,
        text=True, check=True,
    ).stdout  # fmt: skip
    return json.loads(out or "{}")


@pytest.mark.slow
def test_ctrl_c_in_an_arms_loop_marks_the_arms_runs_killed(tmp_path):
    """`tengen ablate` on Prefect's own local server, Ctrl-C to its process group while the
    first arm plays its games: the loop ends the process (os._exit, past the ablation's
    `finally`), and the ablation's runs in MLflow are KILLED, not left RUNNING."""
    import os
    import signal
    import time

    import mlflow

    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    base = _tiny_base(tmp_path / "base.yaml")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env["PREFECT_HOME"] = str(tmp_path / "prefect")
    command = [sys.executable, "-m", "flows.cli", "ablate", "no-opponent-policy", "--name", "c",
               "--budget", "2", "--points", "1", "--base", str(base)]  # fmt: skip
    child = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    folder = tmp_path / "runs" / "ablate-c"
    marker = "full/data/selfplay/.gen-0.tmp-*"
    deadline = time.time() + 600
    while not list(folder.glob(marker)) and time.time() < deadline:
        assert child.poll() is None, child.stderr.read()[-3000:]
        time.sleep(0.1)
    assert list(folder.glob(marker)), f"no {marker} within 10 minutes"
    client = mlflow.MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    exp = client.get_experiment_by_name("ablate-c")

    def statuses():
        return {r.info.run_name: r.info.status for r in client.search_runs([exp.experiment_id])}

    assert statuses() == {"full": "RUNNING", "no-opponent-policy": "RUNNING"}
    os.killpg(child.pid, signal.SIGINT)
    assert child.wait(60) == 128 + signal.SIGINT
    assert statuses() == {"full": "KILLED", "no-opponent-policy": "KILLED"}
