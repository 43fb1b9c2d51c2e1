"""The promote stage: a candidate that passed becomes the champion, else the previous one
stays (or none before the first); the line of champions is kept."""

from __future__ import annotations

import json
import math

import pytest
import torch

from gocore.atomic import sha256_file
from nets.checkpoint import save
from nets.config import net_config
from nets.model import GoNet
from stages import champions, promote
from stages.champions import champion_in
from stages.lines import size_of


def _candidate(path, model_id):
    torch.manual_seed(len(model_id))
    return save(GoNet(net_config("b2c16")), path, {"model_id": model_id})


def _decision(path, passed):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"passed": passed, "candidate_wins": 3, "games": 4}))
    return path


def test_promotions_across_generations(tmp_path):
    def io(gen, passed, previous=True):
        cand = _candidate(tmp_path / f"gen-{gen}" / "candidate.pt", f"cand-{gen}")
        return promote.PromoteIO(
            gen, cand, _decision(tmp_path / f"gate-{gen}.json", passed),
            tmp_path / f"gen-{gen}" / "champion",
            tmp_path / f"gen-{gen - 1}" / "champion" if previous else None,
        )  # fmt: skip

    # Generation 0 fails against uniform priors: still no champion.
    assert promote.run(promote.Params(), io(0, False, previous=False)) == {
        "generation": 0, "promoted": False, "champion": None, "champion_net": None}  # fmt: skip
    assert champion_in(tmp_path / "gen-0" / "champion") is None
    # Generation 1 passes: its candidate is the champion, byte for byte.
    assert promote.run(promote.Params(), io(1, True))["champion"] == "cand-1"
    champ = champion_in(tmp_path / "gen-1" / "champion")
    assert champ.read_bytes() == (tmp_path / "gen-1" / "candidate.pt").read_bytes()
    # Generation 2 fails: generation 1's champion stays.
    assert promote.run(promote.Params(), io(2, False))["champion"] == "cand-1"
    champ2 = champion_in(tmp_path / "gen-2" / "champion")
    assert champ2.read_bytes() == champ.read_bytes()
    promotion = json.loads((tmp_path / "gen-2" / "champion" / "promotion.json").read_text())
    assert promotion["champion"]["generation"] == 1 and not promotion["promoted"]
    assert [c["id"] for c in promotion["line"]] == ["cand-1"]
    assert promote.run(promote.Params(), io(3, True))["champion"] == "cand-3"
    line = json.loads((tmp_path / "gen-3" / "champion" / "promotion.json").read_text())["line"]
    assert [c["id"] for c in line] == ["cand-1", "cand-3"]


def test_without_gates_every_candidate_is_promoted(tmp_path):
    """gate.games 0: no gate stage, and each generation's candidate becomes the champion."""
    from stages.spec import Plan

    ungated = Plan(2, gated=False)
    assert pipeline_names(ungated) == [
        f"{s}-{n}" for n in (0, 1) for s in ("selfplay", "shuffle", "train", "ema", "promote")
    ]
    (stage,) = promote.dvc(1, ungated)
    assert stage.args.endswith("--ungated") and not any("gate" in d for d in stage.deps)
    for gen in (0, 1):
        cand = _candidate(tmp_path / f"gen-{gen}" / "candidate.pt", f"cand-{gen}")
        previous = tmp_path / f"gen-{gen - 1}" / "champion" if gen else None
        io = promote.PromoteIO(gen, cand, None, tmp_path / f"gen-{gen}" / "champion", previous)
        assert promote.run(promote.Params(), io)["champion"] == f"cand-{gen}"
    promotion = json.loads((tmp_path / "gen-1" / "champion" / "promotion.json").read_text())
    assert promotion["promoted"] and promotion["decision"]["games"] == 0
    assert [c["id"] for c in promotion["line"]] == ["cand-0", "cand-1"]


def pipeline_names(plan) -> list[str]:
    from flows import pipeline

    return list(pipeline.pipeline(plan)["stages"])


def test_missing_inputs_name_the_stage(tmp_path):
    cand = _candidate(tmp_path / "c.pt", "c")
    with pytest.raises(promote.InputError, match="run the gate stage first"):
        promote.run(
            promote.Params(), promote.PromoteIO(1, cand, tmp_path / "none.json", tmp_path / "out")
        )
    decision = _decision(tmp_path / "d.json", True)
    with pytest.raises(promote.InputError, match="previous generation's"):
        promote.run(
            promote.Params(),
            promote.PromoteIO(1, cand, decision, tmp_path / "out", tmp_path / "gen-0"),
        )
    with pytest.raises(promote.InputError, match="run the ema stage first"):
        promote.run(
            promote.Params(), promote.PromoteIO(0, tmp_path / "nope.pt", decision, tmp_path / "out")
        )
    assert not (tmp_path / "out").exists()


def test_self_play_and_gate_need_the_previous_promotion(tmp_path, monkeypatch):
    from stages import gate, selfplay
    from tests.conftest import REPO

    monkeypatch.chdir(tmp_path)
    params = REPO / "params.yaml"
    with pytest.raises(promote.InputError, match="run the promote stage of generation 4"):
        selfplay.prepare(params, 5)
    with pytest.raises(promote.InputError, match="run the promote stage of generation 4"):
        gate.prepare(params, 5)
    # A promotion that kept no champion (none passed yet): uniform priors, on purpose.
    (tmp_path / "models/gen-4/champion").mkdir(parents=True)
    (tmp_path / "models/gen-4/champion/promotion.json").write_text('{"champion": null}')
    assert selfplay.prepare(params, 5)[1].model is None
    assert gate.prepare(params, 5)[1].champion is None
    assert selfplay.prepare(params, 5, model="uniform")[1].model is None


def test_the_history_rows_and_the_champion_elo(tmp_path):
    """One row per generation for DVC's plots; the champion's Elo moves only on promotion, by
    the candidate's gate score ((wins + 1/2) / (games + 1), so a sweep stays finite)."""
    assert promote.elo_gain(1, 2) == 0.0
    assert promote.elo_gain(2, 2) == pytest.approx(400 * math.log10(5))  # p = 2.5/3
    assert promote.elo_gain(0, 2) == pytest.approx(-400 * math.log10(5))
    reports = tmp_path / "reports"
    for gen in range(3):
        for stage, data in (
            ("selfplay", {"games": 8, "rows": 100 + gen}),
            ("train", {"window_rows": 100 * (gen + 1), "loss": {"total": 3.0 - gen}}),
        ):
            (reports / stage).mkdir(parents=True, exist_ok=True)
            (reports / stage / f"gen-{gen}.json").write_text(json.dumps(data))
    outcomes = [(2, True), (0, False), (1, True)]  # wins of 2, passed
    for gen, (wins, passed) in enumerate(outcomes):
        decision = tmp_path / f"gate-{gen}.json"
        decision.write_text(json.dumps({"passed": passed, "candidate_wins": wins, "games": 2,
                                        "win_rate": wins / 2}))  # fmt: skip
        promote.run(promote.Params(), promote.PromoteIO(
            gen, _candidate(tmp_path / f"c{gen}.pt", f"c{gen}"), decision,
            tmp_path / f"gen-{gen}" / "champion",
            tmp_path / f"gen-{gen - 1}" / "champion" if gen else None,
            history=reports / "history" / f"gen-{gen}.json", reports=reports,
            lineage=reports / "lineage" / f"gen-{gen}.json",
        ))  # fmt: skip
    rows = json.loads((reports / "history" / "gen-2.json").read_text())
    assert [r["generation"] for r in rows] == [0, 1, 2]
    assert [r["promoted"] for r in rows] == [1, 0, 1]
    sweep = round(400 * math.log10(5), 1)
    assert [r["elo_gain"] for r in rows] == [sweep, -sweep, 0.0]
    assert [r["champion_elo"] for r in rows] == [sweep, sweep, sweep]
    assert [r["window_rows"] for r in rows] == [100, 200, 300]
    assert [r["loss_total"] for r in rows] == [3.0, 2.0, 1.0]
    assert rows[:2] == json.loads((reports / "history" / "gen-1.json").read_text())
    # The lineage: each generation's champion (the one before, where none passed) and
    # candidate by SHA-256, what a player checks a checkpoint from MLflow against.
    # Not in the history's rows: DVC's plots cannot draw a file with strings in it.
    sha = {gen: sha256_file(tmp_path / f"c{gen}.pt") for gen in range(3)}
    assert not any("sha256" in key for row in rows for key in row)
    lines = [json.loads((reports / "lineage" / f"gen-{g}.json").read_text()) for g in range(3)]
    assert [r["candidate_sha256"] for r in lines] == [sha[0], sha[1], sha[2]]
    assert [r["champion_sha256"] for r in lines] == [sha[0], sha[0], sha[2]]
    assert sha256_file(tmp_path / "gen-2/champion/champion.pt") == sha[2]
    known = champions.lineage(tmp_path)
    assert (
        known[sha[0]] == "generation 0's champion" and known[sha[1]] == "generation 1's candidate"
    )
    assert champions.check_against(tmp_path / "c1.pt", "runs:/x/c", tmp_path, "here") == (
        "generation 1's candidate"
    )
    # Under the `champion` alias only the newest champion: an older one is a rollback.
    assert champions.check_against(tmp_path / "c2.pt", "models:/t@champion", tmp_path, "s") == (
        "generation 2's champion"
    )
    with pytest.raises(promote.InputError, match="is generation 0's champion .* not its newest"):
        champions.check_against(tmp_path / "c0.pt", "models:/t@champion", tmp_path, "s")
    assert champions.check_against(tmp_path / "c0.pt", "models:/t/1", tmp_path, "s") == (
        "generation 0's champion"
    )
    stranger = _candidate(tmp_path / "stranger.pt", "stranger")
    refused = r"refused: .* not in the run's lineage at .*: it is none of the 3 checkpoints"
    with pytest.raises(promote.InputError, match=refused):
        champions.check_against(stranger, "models:/tengen@champion", tmp_path, "the store")
    with pytest.raises(promote.InputError, match=r"--lineage .*: no reports/lineage/gen-N.json"):
        champions.check_against(stranger, "models:/tengen@champion", tmp_path / "x", "here")
    assert champions.lineage_of_store(f"sqlite:///{tmp_path}/mlflow.db") == tmp_path
    assert champions.lineage_of_store(f"sqlite:///{tmp_path}/x/mlflow.db") is None
    assert champions.lineage_of_store("http://head:5000") is None
    # A generation whose earlier history is missing says which stage to run.
    (reports / "history" / "gen-1.json").unlink()
    with pytest.raises(promote.InputError, match="gen-1.json does not exist; run the promote"):
        promote.run(promote.Params(), promote.PromoteIO(
            2, tmp_path / "c2.pt", tmp_path / "gate-2.json", tmp_path / "again",
            tmp_path / "gen-1" / "champion", history=reports / "history" / "x.json",
            reports=reports,
        ))  # fmt: skip
    assert not (tmp_path / "again").exists()


def test_a_bigger_net_takes_over_and_is_never_given_back(tmp_path):
    """Two nets train side by side: the bigger one's candidate that passes its gate becomes
    the champion even when the smaller one passes too; after that a smaller candidate is not
    eligible, whatever its gate says."""

    def candidate(gen, net, passed):
        torch.manual_seed(gen)
        path = save(GoNet(net_config(net)), tmp_path / f"gen-{gen}/{net}/candidate.pt",
                    {"model_id": f"gen-{gen}-{net}"})  # fmt: skip
        return path, _decision(tmp_path / f"gate-{gen}-{net}.json", passed)

    def generation(gen, small_passes, big_passes):
        small, small_decision = candidate(gen, "b2c16", small_passes)
        big, big_decision = candidate(gen, "b4c32", big_passes)
        grown = (promote.Contender("b4c32", big, big_decision, tmp_path / "unused.json"),)
        return promote.run(promote.Params(), promote.PromoteIO(
            gen, small, small_decision, tmp_path / f"gen-{gen}/champion",
            tmp_path / f"gen-{gen - 1}/champion" if gen else None, grown=grown,
        ))  # fmt: skip

    assert generation(0, True, False)["champion"] == "gen-0-b2c16"
    # Both pass: the bigger net takes over.
    assert generation(1, True, True)["champion"] == "gen-1-b4c32"
    promotion = json.loads((tmp_path / "gen-1/champion/promotion.json").read_text())
    assert promotion["champion"]["net"] == "b4c32"
    assert promotion["champion"]["parameters"] == size_of("b4c32") > size_of("b2c16")
    assert set(promotion["decisions"]) == {"train.net", "b4c32"}
    # Only the smaller passes: it may not replace a bigger champion.
    result = generation(2, True, False)
    assert result == {"generation": 2, "promoted": False, "champion": "gen-1-b4c32",
                      "champion_net": "b4c32"}  # fmt: skip
    assert generation(3, False, True)["champion"] == "gen-3-b4c32"


def test_a_net_without_global_pooling_is_counted_by_its_own_parameters(tmp_path):
    """The no-global-pooling ablation's nets keep their size's name (b4c32) with more
    parameters than it (95,016, not 87,336): promote records the net's own count."""
    torch.manual_seed(0)
    plain = GoNet(net_config("b4c32", global_pooling=False))
    path = save(plain, tmp_path / "gen-0/candidate.pt", {"model_id": "gen-0-b4c32"})
    io = promote.PromoteIO(0, path, _decision(tmp_path / "gate-0.json", True),
                           tmp_path / "gen-0/champion", None)  # fmt: skip
    assert promote.run(promote.Params(), io)["champion"] == "gen-0-b4c32"
    champion = json.loads((tmp_path / "gen-0/champion/promotion.json").read_text())["champion"]
    own = sum(p.numel() for p in plain.parameters())
    assert champion["net"] == "b4c32" and champion["parameters"] == own != size_of("b4c32")


def test_a_champion_recorded_before_parameter_counts_is_measured_from_its_checkpoint(tmp_path):
    """A promotion.json written before champions recorded their parameters: the floor is the
    champion checkpoint's own count (95,016 for a b4c32 without global pooling), not its size
    name's (87,336), so a b4c32 with global pooling does not replace it."""
    torch.manual_seed(0)
    before = tmp_path / "gen-0/champion"
    before.mkdir(parents=True)
    save(GoNet(net_config("b4c32", global_pooling=False)), before / promote.CHAMPION,
         {"model_id": "gen-0-b4c32"})  # fmt: skip
    old = {"id": "gen-0-b4c32", "generation": 0, "source": "x", "net": "b4c32"}
    (before / promote.PROMOTION).write_text(json.dumps({"champion": old, "line": [old]}))
    path = save(GoNet(net_config("b4c32")), tmp_path / "gen-1/candidate.pt",
                {"model_id": "gen-1-b4c32"})  # fmt: skip
    io = promote.PromoteIO(1, path, _decision(tmp_path / "gate-1.json", True),
                           tmp_path / "gen-1/champion", before)  # fmt: skip
    result = promote.run(promote.Params(), io)
    assert not result["promoted"] and result["champion"] == "gen-0-b4c32"
    # Recorded with its count, the same champion gives the same floor.
    (before / promote.PROMOTION).write_text(json.dumps(
        {"champion": {**old, "parameters": 95016}, "line": [old]}))  # fmt: skip
    assert not promote.run(promote.Params(), io)["promoted"]
    # A size name alone (no checkpoint left beside it) falls back to the name's count.
    (before / promote.CHAMPION).unlink()
    (before / promote.PROMOTION).write_text(json.dumps({"champion": old, "line": [old]}))
    assert promote.run(promote.Params(), io)["champion"] == "gen-1-b4c32"
