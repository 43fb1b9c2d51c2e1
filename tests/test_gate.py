"""The gate: matches between two networks with each leaf evaluated by its game's player to
move, colours alternating, the decision and its early stop, and the games as SGF."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from gocore.arena import play_match
from gocore.board import PASS, point_xy
from gocore.rules import PRESETS
from gocore.selfplay import UniformNet
from nets.checkpoint import save
from nets.config import net_config
from nets.model import GoNet
from play.sgf import read_sgf, replay
from stages import gate
from stages.params import MatchSearchSection
from tests.conftest import PUCT_ROOT, search_params

torch.set_num_threads(1)


class CornerNet:
    """Puts nearly all its prior on the tensor's first point: a corner, in every symmetry."""

    def __call__(self, planes, glob, *, legal):
        policy = np.where(legal, 1e-3, 0.0).astype(np.float32)
        policy[:, 0] = np.where(legal[:, 0], 1.0, 0.0)
        policy /= policy.sum(axis=1, keepdims=True)
        value = np.zeros((len(legal), 3), np.float32)
        value[:, :2] = 0.5
        return {"policy": policy, "value": value}


CORNERS = {(0, 0), (4, 0), (0, 4), (4, 4)}


def test_each_side_plays_with_its_own_net():
    """With two visits a move is the prior's favourite: the corner net's first move is a
    corner in every game, as Black and as White, and the uniform net's are spread out. So
    each game's leaves go to the net of the player to move at its root."""
    a_is_black = np.array([True, False] * 6)
    games = play_match(
        UniformNet(0), CornerNet(), a_is_black, size=5,
        rules=PRESETS["tromp-taylor"].with_komi(0.5), visits=2,
        params=search_params(score_utility=0.0), leaves_per_game=1, seed=0,
        temperature_start=0.05, temperature_end=0.05, max_moves_per_area=3.0,
    )  # fmt: skip
    assert [g.a_is_black for g in games] == a_is_black.tolist()
    first_b, first_a = [], []
    for g in games:
        b_color = 2 if g.a_is_black else 1
        moves = [(int(c), point_xy(g.stride, int(m))) for m, c in zip(g.moves, g.colors,
                                                                     strict=True)]  # fmt: skip
        first_b.append(next(p for c, p in moves if c == b_color))
        first_a.append(next(p for c, p in moves if c != b_color))
    assert all(p in CORNERS for p in first_b)
    assert sum(p in CORNERS for p in first_a) < 6


def test_gumbel_roots_play_whole_games_that_differ():
    """considered > 0: each move is the game's own Gumbel draw (no temperature); games with
    the same nets and colours still differ, and every one is played to its end."""
    games = play_match(
        UniformNet(0), UniformNet(1), np.array([True, False] * 3), size=5,
        rules=PRESETS["tromp-taylor"].with_komi(0.5), visits=8,
        params=search_params(score_utility=0.0), leaves_per_game=2, seed=0,
        temperature_start=0.5, temperature_end=0.1, max_moves_per_area=3.0, considered=4,
    )  # fmt: skip
    openings = {tuple(int(m) for m in g.moves[:6]) for g in games}
    assert len(openings) > 1
    for g in games:
        # Ended by two passes, or by the move limit (3 moves a point).
        assert (g.moves[-2:] == PASS).all() or len(g.moves) >= 75


def test_the_decision_and_its_early_stop():
    assert gate.decided(3, 3, 6, 3) is True
    assert gate.decided(0, 4, 6, 3) is False  # 2 games left cannot reach 3
    assert gate.decided(1, 4, 6, 3) is None
    assert gate.decided(2.5, 5, 6, 3) is None


def _params(**kw):
    search = MatchSearchSection(c_puct=1.1, puct_exponent=0.5, fpu_reduction=0.2,
                                virtual_loss=1.0, score_utility=0.0, **PUCT_ROOT)  # fmt: skip
    values = dict(games=6, win_fraction=0.5, early_stop=False, slots=3, visits=4,
                  leaves_per_game=2, board_size=5, rules="chinese", komi=0.5,
                  temperature_start=0.5, temperature_end=0.1, max_moves_per_area=3.0,
                  search=search, threads=1, compile="none", seed=0)  # fmt: skip
    values.update(kw)
    return gate.Params(gate=gate.GateParams(**values), device="cpu")


def test_gate_against_the_uniform_champion(tmp_path):
    torch.manual_seed(0)
    candidate = save(GoNet(net_config("b2c16")), tmp_path / "candidate.pt", {"model_id": "cand"})
    io = gate.GateIO(3, candidate, None, tmp_path / "gate", tmp_path / "gate.json")
    decision = gate.run(_params(), io)
    assert json.loads((tmp_path / "gate.json").read_text()) == decision
    assert decision["games"] == 6 and decision["champion"] == "uniform"
    assert decision["candidate"] == "cand" and not decision["stopped_early"]
    wins = 0.0
    sgfs = sorted((tmp_path / "gate" / "sgf").glob("*.sgf"))
    assert len(sgfs) == 6
    for i, path in enumerate(sgfs):
        record = read_sgf(path)
        replay(record)  # every move legal
        cand_black = record.black == "cand"
        assert cand_black == (i % 2 == 0)  # colours alternate
        if record.result == "0":
            wins += 0.5
        elif record.result.startswith("B") == cand_black:
            wins += 1
    assert decision["candidate_wins"] == wins
    assert decision["passed"] == (wins >= 3)
    # With an early stop the gate ends once the result is settled: asking for 6 wins of 6,
    # at the first game the candidate does not win (the same games, by the same seeds).
    full = gate.run(_params(slots=1, win_fraction=1.0), gate.GateIO(
        3, candidate, None, tmp_path / "full", tmp_path / "f.json"))  # fmt: skip
    early = gate.run(_params(slots=1, win_fraction=1.0, early_stop=True), gate.GateIO(
        3, candidate, None, tmp_path / "early", tmp_path / "e.json"))  # fmt: skip
    results = []
    for i, path in enumerate(sorted((tmp_path / "full" / "sgf").glob("*.sgf"))):
        record = read_sgf(path)
        won = record.result != "0" and record.result.startswith("B") == (i % 2 == 0)
        results.append(won)
    first_miss = results.index(False) if False in results else 5
    assert early["games"] == first_miss + 1 and early["passed"] == all(results)
    assert early["stopped_early"] == (first_miss < 5) and not full["stopped_early"]


@pytest.mark.slow
def test_the_gate_plays_with_a_compiled_net(tmp_path):
    """gate.compile: the candidate's net is compiled (one graph for every batch) and its
    games replay."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()  # no graph compiled by an earlier test is reused
    graphs = counters["stats"]["unique_graphs"]
    torch.manual_seed(0)
    candidate = save(GoNet(net_config("b2c16")), tmp_path / "candidate.pt", {"model_id": "cand"})
    io = gate.GateIO(3, candidate, None, tmp_path / "gate", tmp_path / "gate.json")
    decision = gate.run(_params(compile="default"), io)
    assert decision["games"] == 6 and decision["candidate"] == "cand"
    sgfs = sorted((tmp_path / "gate" / "sgf").glob("*.sgf"))
    assert len(sgfs) == 6
    for path in sgfs:
        replay(read_sgf(path))  # every move legal
    assert counters["stats"]["unique_graphs"] == graphs + 1


def test_a_missing_candidate_names_the_stage(tmp_path):
    with pytest.raises(gate.InputError, match="run the ema stage first"):
        gate.run(_params(), gate.GateIO(1, tmp_path / "none.pt", None, tmp_path / "g",
                                        tmp_path / "g.json"))  # fmt: skip
    assert not (tmp_path / "g").exists()


def test_a_candidate_smaller_than_the_champion_is_not_played(tmp_path, monkeypatch):
    """With run.grow, once a bigger net is champion, the smaller net's gate plays no games:
    promote could not take it anyway."""
    import yaml

    from tests.conftest import REPO

    monkeypatch.chdir(tmp_path)
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["train"]["net"] = "b2c16"
    params["run"]["grow"] = [{"net": "b4c32", "from": 1}]
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    torch.manual_seed(0)
    big = save(GoNet(net_config("b4c32")), tmp_path / "champion.pt", {"model_id": "big"})
    small = save(GoNet(net_config("b2c16")), tmp_path / "small.pt", {"model_id": "small"})
    _, io = gate.prepare("params.yaml", 2, candidate=small, champion=big)
    assert io.skip == "the champion is a b4c32, bigger than this b2c16"
    assert str(io.decision) == "reports/gate/gen-2.json"
    decision = gate.run(_params(), io)
    assert decision["games"] == 0 and not decision["passed"] and decision["skipped"]
    assert not list(io.out.rglob("*.sgf"))
    # The grown net's own gate against it is played, under its own paths.
    _, grown = gate.prepare("params.yaml", 2, champion=big, net="b4c32")
    assert grown.skip is None
    assert str(grown.candidate) == "models/gen-2/b4c32/ema/candidate.pt"
    assert str(grown.decision) == "reports/gate/gen-2-b4c32.json"
    # The nets' own counts decide: a b4c32 champion without global pooling (95,016
    # parameters) is bigger than a b4c32 candidate with it (87,336), though both are b4c32s.
    plain = save(GoNet(net_config("b4c32", global_pooling=False)), tmp_path / "plain.pt",
                 {"model_id": "plain"})  # fmt: skip
    pooled = save(GoNet(net_config("b4c32")), tmp_path / "pooled.pt", {"model_id": "pooled"})
    _, io = gate.prepare("params.yaml", 2, candidate=pooled, champion=plain)
    assert io.skip == "the champion is a b4c32, bigger than this b4c32"
    _, io = gate.prepare("params.yaml", 2, candidate=plain, champion=pooled)
    assert io.skip is None


@pytest.mark.slow
def test_the_score_utility_changes_the_gates_games(tmp_path):
    """gate.search.score_utility reaches the search: with it the same seeds give other games
    (before, every gate knob but c_puct, exponent, FPU and virtual loss was ignored)."""
    torch.manual_seed(1)
    candidate = save(GoNet(net_config("b2c16")), tmp_path / "candidate.pt", {"model_id": "cand"})

    def games(name, **search):
        values = dict(c_puct=1.1, puct_exponent=0.5, fpu_reduction=0.2, virtual_loss=1.0,
                      score_utility=0.0, **PUCT_ROOT)  # fmt: skip
        values.update(search)
        params = _params(games=2, slots=2, visits=16, search=MatchSearchSection(**values))
        gate.run(
            params, gate.GateIO(3, candidate, None, tmp_path / name, tmp_path / f"{name}.json")
        )
        return [p.read_bytes() for p in sorted((tmp_path / name / "sgf").glob("*.sgf"))]

    assert games("a") == games("b")  # the same seeds: the same games
    assert games("c", score_utility=0.5) != games("a")


@pytest.mark.parametrize("key", ["root_fpu_reduction", "forced_playouts_k"])
def test_the_gate_refuses_knobs_that_a_match_cannot_use(tmp_path, key):
    import yaml

    from stages.params import ParamsError
    from tests.conftest import REPO

    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["gate"]["search"][key] = 0.3
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    with pytest.raises(ParamsError, match=f"gate.search.{key}: Extra inputs are not permitted"):
        gate.prepare(tmp_path / "params.yaml", 1)


def test_a_gate_every_candidate_passes_still_plays_its_first_batch(tmp_path):
    # win_fraction 0 is decided before any game: the first batch is played all the same, so
    # the decision has games to show (and a win rate).
    torch.manual_seed(0)
    candidate = save(GoNet(net_config("b2c16")), tmp_path / "candidate.pt", {"model_id": "cand"})
    io = gate.GateIO(1, candidate, None, tmp_path / "gate", tmp_path / "gate.json")
    decision = gate.run(_params(win_fraction=0.0, early_stop=True), io)
    assert decision["passed"] and decision["games"] == 3 and decision["stopped_early"]
    assert len(list((tmp_path / "gate" / "sgf").glob("*.sgf"))) == 3


def test_a_gate_of_no_games_is_refused_naming_the_key(tmp_path):
    torch.manual_seed(0)
    candidate = save(GoNet(net_config("b2c16")), tmp_path / "candidate.pt", {"model_id": "cand"})
    io = gate.GateIO(1, candidate, None, tmp_path / "gate", tmp_path / "gate.json")
    with pytest.raises(gate.InputError, match="gate.games is 0"):
        gate.run(_params(games=0), io)
    assert not (tmp_path / "gate").exists() and not (tmp_path / "gate.json").exists()
