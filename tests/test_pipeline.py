"""dvc.yaml: the run unrolled per generation, each stage with exactly its deps, outs and
params; `dvc repro` in a fresh git repository runs it all, a second does nothing, and a
changed params key reruns only the stages that read it."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from flows import pipeline
from stages.lines import lines
from stages.params import ParamsError, load_params
from stages.spec import Plan, plan_of
from tests.conftest import REPO, make_run_repo, run_in


def test_generations_unroll_with_their_links():
    stages = pipeline.pipeline(Plan(3))["stages"]
    assert len(stages) == 18
    names = ("selfplay", "shuffle", "train", "ema", "gate", "promote")
    assert list(stages)[:6] == [f"{s}-0" for s in names]
    # Generation 0 starts from nothing; generation 2 from generation 1's outputs.
    assert "models/gen--1/champion" not in str(stages["selfplay-0"])
    assert "models/gen-1/champion" in stages["selfplay-2"]["deps"]
    assert stages["shuffle-2"]["deps"][-3:] == [f"data/selfplay/gen-{g}" for g in range(3)]
    assert "models/gen-1/train" in stages["train-2"]["deps"]
    assert "models/gen-1/ema" in stages["ema-2"]["deps"]
    assert stages["train-2"]["params"] == ["train", "loss", "device"]
    # Every out is made by exactly one stage, and every data dep by an earlier one.
    made = {}
    for name, stage in stages.items():
        declared = stage["outs"] + stage.get("metrics", [])
        for out in (o if isinstance(o, str) else next(iter(o)) for o in declared):
            assert out not in made, out
            made[out] = name
    order = list(stages)
    for name, stage in stages.items():
        for dep in stage["deps"]:
            if dep.startswith(("data/", "models/", "reports/")):
                assert order.index(made[dep]) < order.index(name), (name, dep)
    # The plots read the last generation's history, which promote-2 writes.
    plotted = {f for plot in pipeline.plots(Plan(3)) for f in next(iter(plot.values()))["y"]}
    assert plotted == {"reports/history/gen-2.json"} and made[plotted.pop()] == "promote-2"
    # The committed dvc.yaml is what params.yaml says.
    committed = yaml.safe_load((REPO / "dvc.yaml").read_text())
    raw = load_params(REPO / "params.yaml")
    assert committed == pipeline.pipeline(plan_of(raw, "params.yaml"))
    raw["run"]["generations"] = 0
    with pytest.raises(ParamsError, match="p.yaml: run.generations: Input should be greater"):
        plan_of(raw, "p.yaml")


@pytest.mark.slow
@pytest.mark.gnugo
def test_dvc_repro_runs_the_run_then_nothing_then_only_what_changed(tmp_path, gnugo_path):
    repo = make_run_repo(tmp_path / "run", code_deps=False, evaluate_every=2)

    def sh(*cmd):
        return run_in(repo, *cmd)

    out = sh("dvc", "repro")
    assert out.count("Running stage") == 13
    promotion = json.loads((repo / "models/gen-1/champion/promotion.json").read_text())
    assert promotion["generation"] == 1
    assert json.loads((repo / "reports/gate/gen-1.json").read_text())["games"] >= 1
    # The stages logged themselves to MLflow, as under the loop: one parent run for the
    # workspace's `dvc repro`, a run per stage, the candidates registered.
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{repo}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("tengen").experiment_id])
    [parent] = [r for r in runs if r.data.tags.get("tengen.launcher") == "dvc"]
    nested = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert sorted(r.info.run_name for r in nested) == sorted(
        [f"{s}-{n}" for n in (0, 1) for s in ("selfplay", "shuffle", "train", "ema", "gate",
                                                  "promote")] + ["evaluate-1"]
    )  # fmt: skip
    # The evaluation after the last generation: the champion against GNU Go level 0 and the
    # random player, Elo anchored on GNU Go, logged as the stage's metrics.
    report = json.loads((repo / "reports/eval/gen-1.json").read_text())
    assert [p["opponent"] for p in report["pairings"]] == ["gnugo-0", "random"]
    assert report["ratings"]["gnugo-0"]["elo"] == 0.0
    [evaluation] = [r for r in nested if r.info.run_name == "evaluate-1"]
    assert evaluation.data.metrics["elo"] == report["elo"]
    assert "win_rate_gnugo-0" in evaluation.data.metrics
    assert {r.info.status for r in nested} == {"FINISHED"}
    assert {r.data.tags["tengen.dvc_stage"] for r in nested} == {r.info.run_name for r in nested}
    candidate = client.get_model_version_by_alias("tengen", "candidate")
    assert candidate.tags["tengen.generation"] == "1"
    # Nothing changed: nothing runs, and DVC says the pipeline is up to date.
    again = sh("dvc", "repro")
    assert "Running stage" not in again
    assert "up to date" in sh("dvc", "status")
    # One params key changed: only the stages that read that section are stale.
    original = (repo / "params.yaml").read_text()
    params = yaml.safe_load(original)
    params["gate"]["visits"] = 6
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    stale = json.loads(sh("dvc", "status", "--json"))
    assert set(stale) == {"gate-0", "gate-1"}
    (repo / "params.yaml").write_text(original)

    # DVC's plots: the last generation's history, a row per generation.
    plots = json.loads(sh("dvc", "plots", "show", "--json"))["data"]
    elo = plots["champion Elo (from the gate games; uniform priors = 0)"][0]["content"]
    assert [row["generation"] for row in elo["data"]["values"]] == [0, 1]
    ladder = plots["champion Elo against GNU Go (evaluate)"][0]["content"]
    assert [row["elo"] for row in ladder["data"]["values"]] == [report["elo"]]

    # An ablation: `dvc exp run -S` reruns what the learning rate reaches, not self-play's
    # first generation, and logs to MLflow under the experiment's own name.
    out = sh("dvc", "exp", "run", "-n", "lowlr", "-S", "train.lr_per_sample=1e-5")
    ran = set(re.findall(r"Running stage '([\w-]+)'", out))
    assert {"train-0", "ema-0", "gate-0", "promote-0", "train-1", "promote-1"} <= ran
    assert not ran & {"selfplay-0", "shuffle-0"}
    shown = json.loads(sh("dvc", "exp", "show", "--json"))
    [exp] = [e for rev in shown for e in rev.get("experiments") or [] if e["name"] == "lowlr"]
    [run] = exp["revs"]
    assert run["data"]["params"]["params.yaml"]["data"]["train"]["lr_per_sample"] == 1e-5
    ablation = client.search_runs(
        [client.get_experiment_by_name("tengen").experiment_id],
        "tags.`tengen.dvc_exp` = 'lowlr' and tags.`tengen.stage` = 'train'",
    )
    assert {r.data.params["train.lr_per_sample"] for r in ablation} == {"1e-05"}
    assert int(client.get_model_version_by_alias("tengen-lowlr", "candidate").version) == 2
    assert int(client.get_model_version_by_alias("tengen", "candidate").version) == 2


def test_grown_nets_get_their_own_stages_from_their_generation():
    raw = load_params(REPO / "params.yaml")
    raw["run"]["grow"] = [{"net": "b6c96", "from": 1}, {"net": "b10c128", "from": 2}]
    nets = lines(raw, "params.yaml")
    assert [(x.net, x.start, x.rank) for x in nets] == [
        (raw["train"]["net"], 0, 0), ("b6c96", 1, 1), ("b10c128", 2, 2)]  # fmt: skip
    stages = pipeline.pipeline(Plan(3, tuple(nets)))["stages"]
    assert "train-b6c96-0" not in stages and "train-b10c128-1" not in stages
    assert list(stages)[-10:] == [
        "train-2", "train-b6c96-2", "train-b10c128-2", "ema-2", "ema-b6c96-2", "ema-b10c128-2",
        "gate-2", "gate-b6c96-2", "gate-b10c128-2", "promote-2"]  # fmt: skip
    assert stages["train-b6c96-2"]["cmd"].endswith("--generation 2 --net b6c96")
    assert stages["ema-b6c96-1"]["cmd"].endswith("--generation 1 --net b6c96 --fresh")
    assert stages["promote-2"]["cmd"].endswith("--grown b6c96,b10c128")
    # Only dvc.yaml reads run.grow: adding a net reruns its stages and the promotes only.
    assert not any("run.grow" in str(stage.get("params")) for stage in stages.values())
    assert "models/gen-1/b6c96/train" in stages["train-b6c96-2"]["deps"]
    assert not any("gen-0/b6c96" in d for d in stages["train-b6c96-1"]["deps"])  # a fresh net
    assert stages["train-b6c96-2"]["outs"] == ["models/gen-2/b6c96/train"]
    promote_deps = stages["promote-2"]["deps"]
    for path in ("reports/gate/gen-2.json", "reports/gate/gen-2-b6c96.json",
                 "models/gen-2/b10c128/ema", "reports/train/gen-2-b10c128.json"):  # fmt: skip
        assert path in promote_deps
    made = {}
    for name, stage in stages.items():
        for out in stage["outs"] + stage.get("metrics", []):
            path = out if isinstance(out, str) else next(iter(out))
            assert path not in made, path
            made[path] = name

    for bad, message in (
        ([{"net": "b99c1", "from": 1}], "unknown net"),
        ([{"net": raw["train"]["net"], "from": 1}], "already one of the run's nets"),
        ([{"net": "b6c96", "from": 0}], r"run.grow.0.from: Input should be greater than or"),
        ([{"net": "b6c96"}], r"run.grow.0.from: Field required"),
        ([{"net": "b6c96", "from": 3}, {"net": "b10c128", "from": 2}], "start in order"),
        ([{"net": "b10c128", "from": 1}, {"net": "b6c96", "from": 2}], "not bigger than b10c128"),
    ):
        raw["run"]["grow"] = bad
        with pytest.raises(ParamsError, match=message):
            lines(raw, "params.yaml")


def test_the_dependency_direction_and_no_stage_importing_another():
    """flows -> stages -> play -> (gocore, nets), from the import graph: no stage reaches
    another stage's module, play/gocore/nets never reach stages or flows, gocore never imports
    torch, and dvc.yaml's code deps are exactly that graph."""
    import ast

    from stages.imports import SOURCE, code_files

    names = ("selfplay", "shuffle", "train", "ema", "gate", "promote", "evaluate")
    for name in names:
        reached = code_files((f"stages.{name}",))
        others = {f"stages/{o}.py" for o in names if o != name}
        assert not others & set(reached), (name, sorted(others & set(reached)))
        assert not [f for f in reached if f.startswith("flows/")], name
    for package in ("play", "gocore", "nets"):
        for path in sorted((SOURCE / package).glob("*.py")):
            reached = code_files((f"{package}.{path.stem}",))
            assert not [f for f in reached if f.startswith(("stages/", "flows/"))], path
    for path in sorted((SOURCE / "gocore").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom):
                modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [
                    node.module or ""]  # fmt: skip
                assert not any(m.split(".")[0] == "torch" for m in modules), path
    committed = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    listed = {d for d in committed["shuffle-0"]["deps"] if d.endswith(".py")}
    assert listed == set(code_files(("stages.shuffle",)))
    # An edit to gocore/board.py reruns the shuffle (it reaches it through gocore/features.py).
    assert {"gocore/board.py", "gocore/features.py", "stages/rows.py"} <= listed


def test_the_source_tree_can_run_its_own_pipeline():
    """DVC refuses to run where dvc.lock is git-ignored ("'dvc.lock' is git-ignored"), which
    broke `make run` once: the source tree's .gitignore must leave it visible."""
    import shutil
    import subprocess

    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    ignored = subprocess.run(["git", "check-ignore", "-q", "dvc.lock"], cwd=REPO)
    assert ignored.returncode == 1, "dvc.lock is git-ignored: `make run` would fail"
