"""dvc.yaml: the run unrolled per generation, each stage with exactly its deps, outs and
params; `dvc repro` in a fresh git repository runs it all, a second does nothing, and a
changed params key reruns only the stages that read it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from flows import pipeline
from stages.params import ParamsError, load_params
from tests.conftest import REPO

BIN = Path(sys.executable).parent


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


def _tiny_params(path: Path) -> None:
    params = load_params(REPO / "params.yaml")
    params["run"]["generations"] = 2
    params["selfplay"].update(games=4, slots=4, full_visits=8, cheap_visits=2, decided_visits=2,
                              board_sizes={5: 1.0})  # fmt: skip
    params["shuffle"].update(window_c=100, rows_per_file=50)
    params["train"].update(net="b2c16", tensor=5, batch_size=16, samples_per_generation=64,
                           warmup_samples=0, threads=1)  # fmt: skip
    params["ema"].update(bn_batches=1, bn_batch_size=16)
    params["gate"].update(games=2, slots=2, visits=4, board_size=5, komi=0.5)
    path.write_text(yaml.safe_dump(params))


@pytest.mark.slow
def test_dvc_repro_runs_the_run_then_nothing_then_only_what_changed(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    repo = tmp_path / "run"
    repo.mkdir()
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}")

    def sh(*cmd):
        result = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True,
                                timeout=900)  # fmt: skip
        assert result.returncode == 0, f"{cmd}: {result.stdout[-2000:]}{result.stderr[-3000:]}"
        return result.stdout

    _tiny_params(repo / "params.yaml")
    pipeline.write_dvc_yaml(repo / "params.yaml", repo / "dvc.yaml", code_deps=False)
    sh("git", "init", "-q")
    sh("git", "config", "user.email", "ci@tengen")
    sh("git", "config", "user.name", "ci")
    sh("dvc", "init", "-q")
    sh("git", "add", "-A")
    sh("git", "commit", "-qm", "run")
    out = sh("dvc", "repro")
    assert out.count("Running stage") == 12
    promotion = json.loads((repo / "models/gen-1/champion/promotion.json").read_text())
    assert promotion["generation"] == 1
    assert json.loads((repo / "reports/gate/gen-1.json").read_text())["games"] >= 1
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
