"""dvc.yaml: the run unrolled per generation, each stage with exactly its deps, outs and
params; `dvc repro` in a fresh git repository runs it all, a second does nothing, and a
changed params key reruns only the stages that read it."""

from __future__ import annotations

import json

import pytest
import yaml

from flows import pipeline
from stages.params import ParamsError, load_params
from tests.conftest import REPO, make_run_repo, run_in


def test_generations_unroll_with_their_links():
    stages = pipeline.pipeline(3)["stages"]
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
        for out in stage["outs"] + [next(iter(m)) for m in stage.get("metrics", [])]:
            assert out not in made, out
            made[out] = name
    order = list(stages)
    for name, stage in stages.items():
        for dep in stage["deps"]:
            if dep.startswith(("data/", "models/", "reports/")):
                assert order.index(made[dep]) < order.index(name), (name, dep)
    # The committed dvc.yaml is what params.yaml says.
    committed = yaml.safe_load((REPO / "dvc.yaml").read_text())
    count = pipeline.generations_of(load_params(REPO / "params.yaml"), "params.yaml")
    assert committed == pipeline.pipeline(count)
    with pytest.raises(ParamsError, match="run.generations"):
        pipeline.generations_of({"run": {"generations": 0}}, "p.yaml")


@pytest.mark.slow
def test_dvc_repro_runs_the_run_then_nothing_then_only_what_changed(tmp_path):
    repo = make_run_repo(tmp_path / "run", code_deps=False)

    def sh(*cmd):
        return run_in(repo, *cmd)

    out = sh("dvc", "repro")
    assert out.count("Running stage") == 12
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
        f"{s}-{n}"
        for n in (0, 1)
        for s in ("selfplay", "shuffle", "train", "ema", "gate", "promote")
    )
    assert {r.info.status for r in nested} == {"FINISHED"}
    assert {r.data.tags["tengen.dvc_stage"] for r in nested} == {r.info.run_name for r in nested}
    candidate = client.get_model_version_by_alias("tengen", "candidate")
    assert candidate.tags["tengen.generation"] == "1"
    # Nothing changed: nothing runs, and DVC says the pipeline is up to date.
    again = sh("dvc", "repro")
    assert "Running stage" not in again
    assert "up to date" in sh("dvc", "status")
    # One params key changed: only the stages that read that section are stale.
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["gate"]["visits"] = 6
    (repo / "params.yaml").write_text(yaml.safe_dump(params))
    stale = json.loads(sh("dvc", "status", "--json"))
    assert set(stale) == {"gate-0", "gate-1"}
