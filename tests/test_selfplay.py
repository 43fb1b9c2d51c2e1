"""Self-play, the driver (gocore.selfplay) and the stage (stages.selfplay): real games on 5x5 to
7x7 with the uniform net and a tiny random-init net, checked row by row against a replay of
each game's SGF."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml

from gocore import board as gb
from gocore import features as F
from gocore import mcts
from gocore import search as S
from gocore import selfplay as SP
from gocore.board import BLACK, WHITE
from play.sgf import read_sgf, replay
from stages import rows as R
from stages import selfplay as stage
from stages.params import ParamsError, SelfPlayParams, load_params, section
from tests.conftest import REPO, game_from_diagram, search_params

torch.set_num_threads(1)


def small_params(**overrides) -> dict:
    """params.yaml's real `selfplay` section, shrunk to a few quick 7x7 games."""
    params = load_params(REPO / "params.yaml")
    sp = params["selfplay"]
    sp.update(
        games=6,
        slots=3,
        leaves_per_game=2,
        full_visits=12,
        cheap_visits=4,
        decided_visits=4,
        board_sizes={7: 1.0},
        rows_per_shard=60,
    )
    sp.update(overrides)
    return params


def write_params(tmp_path: Path, **overrides) -> Path:
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(small_params(**overrides)))
    return path


def play(tmp_path: Path, generation=0, model=None, name="run", **overrides):
    params_path = write_params(tmp_path, **overrides)
    params, io = stage.prepare(
        params_path,
        generation,
        model=model,
        out=tmp_path / name / f"gen-{generation}",
        metrics=tmp_path / name / "metrics.json",
    )
    return stage.run(params, io, progress=False), io


def check_generation(folder: Path) -> list[dict]:
    """Every row against its game's SGF: the position replays legally and encodes to the
    stored planes; targets, outcome, score, ownership and opponent move agree with the game.
    A side position's rows take their outcome from their search and leave score and
    ownership free."""
    rows = [r for shard in R.list_shards(folder) for r in R.read_shard(shard).to_pylist()]
    by_game: dict[str, list[dict]] = {}
    for r in rows:
        by_game.setdefault(r["game_id"], []).append(r)
    sgfs = sorted((folder / "sgf").glob("*.sgf"))
    assert len(sgfs) >= len(by_game)
    for path in sgfs:
        record = read_sgf(path)
        end = replay(record)  # every move legal
        side = "side position of game" in (record.root_comment or "")
        if side:
            assert record.result is None
        else:
            lead = float(record.result[2:]) if record.result != "0" else 0.0
            black_lead = lead if record.result.startswith("B") else -lead
        for r in by_game.get(path.stem, []):
            n = r["board_size"]
            assert n == record.size and r["rules"] == record.rules
            assert r["komi"] == record.komi
            game = replay(record, upto=r["turn"])
            assert game.to_move == r["to_move"]
            planes = np.zeros((1, F.N_PLANES, n, n), np.float32)
            glob = np.zeros((1, F.N_GLOBALS), np.float32)
            F.encode_all(game.b, F.new_work(game.b), planes, glob)
            assert F.pack_planes(planes, n)[0].tobytes() == r["planes"]
            np.testing.assert_allclose(glob[0], r["globals"], rtol=1e-6)
            target = np.array(r["policy_target"])
            assert len(target) == n * n + 1
            if r["policy_weight"] > 0:
                assert target.sum() == pytest.approx(1.0, abs=1e-5)
            if r["turn"] < len(record.moves):
                # The move played is one the search visited (the target's support).
                color, move = record.moves[r["turn"]]
                index = n * n if move is None else move[1] * n + move[0]
                assert target[index] > 0 or r["policy_weight"] == 0
            if r["turn"] + 1 < len(record.moves):
                _, reply = record.moves[r["turn"] + 1]
                assert r["opponent_move"] == (n * n if reply is None else reply[1] * n + reply[0])
            else:
                assert r["opponent_move"] == -1
            assert len(r["ownership"]) == n * n
            if side:
                assert r["outcome"] == pytest.approx(r["root_value"])
                assert r["score_weight"] == 0 and not any(r["ownership"])
                continue
            mover = 1 if r["to_move"] == BLACK else -1
            assert r["score_weight"] == 1
            assert r["final_score"] == pytest.approx(mover * black_lead)
            assert r["outcome"] == mover * np.sign(black_lead)
            assert set(r["ownership"]) <= {-1, 0, 1}
        if not side:
            assert end.b.passes[0] >= 2 or end.b.move_count[0] >= math.ceil(3.0 * record.size**2)
    return rows


def test_stage_writes_shards_that_replay(tmp_path, tiny_model):
    metrics, io = play(
        tmp_path, generation=1, model=tiny_model, record_cheap_searches=True, rows_per_shard=20
    )
    rows = check_generation(io.out)
    assert metrics["games"] == 6 and metrics["rows"] == len(rows) > 0
    assert json.loads(io.metrics.read_text()) == metrics
    assert {r["model_id"] for r in rows} == {"tiny"}
    assert {r["generation"] for r in rows} == {1}
    assert len(R.list_shards(io.out)) >= 2  # rows_per_shard 20
    # Full searches (and only they) carry a policy target, with the visits asked; cheap ones
    # give value-only rows (record_cheap_searches).
    full = [r for r in rows if r["policy_weight"] > 0]
    cheap = [r for r in rows if r["policy_weight"] == 0]
    assert full and cheap
    assert all(r["visits"] >= 12 for r in full)
    assert metrics["rows_with_policy_target"] == len(full)
    assert not list(io.out.parent.glob(".*"))  # no temporary folder left


@pytest.mark.slow
def test_gumbel_self_play_replays_with_completed_q_targets(tmp_path, tiny_model):
    """selfplay.search.root gumbel: the games replay, every row checks out, and each policy
    target is the completed-Q policy, which covers every legal move (visited or not)."""
    search = dict(small_params()["selfplay"]["search"], root="gumbel", gumbel_considered=4)
    metrics, io = play(tmp_path, generation=1, model=tiny_model, search=search, games=4)
    rows = check_generation(io.out)
    full = [r for r in rows if r["policy_weight"] > 0]
    assert metrics["games"] == 4 and len(full) > 10
    for r in full:
        game = replay(read_sgf(io.out / "sgf" / f"{r['game_id']}.sgf"), upto=r["turn"])
        legal = gb.legal_all(game.b)[0]
        n = r["board_size"]
        local = [gb.point(game.b.stride, i % n, i // n) for i in range(n * n)] + [gb.PASS]
        assert (np.array(r["policy_target"]) > 0).tolist() == [bool(legal[p]) for p in local]


@pytest.mark.slow
def test_a_compiled_net_plays_a_generation(tmp_path, tiny_model):
    """selfplay.compile: the stage's net is compiled (one graph for every batch size, the
    last games' few rows too) and its generation's rows check out as an eager net's do."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()  # no graph compiled by an earlier test is reused
    graphs = counters["stats"]["unique_graphs"]
    metrics, io = play(tmp_path, generation=1, model=tiny_model, compile="default", games=4)
    rows = check_generation(io.out)
    assert metrics["games"] == 4 and metrics["rows"] == len(rows) > 0
    assert counters["stats"]["unique_graphs"] == graphs + 1


def test_a_run_folder_from_before_compile_runs_its_nets_eager(tmp_path):
    """params.yaml written before `selfplay.compile` and `gate.compile` existed: both stages'
    nets run eager, as they did; the file itself is not changed (DVC sees the same sections)."""
    from stages import gate
    from stages.params import read

    params = small_params()
    del params["selfplay"]["compile"], params["gate"]["compile"]
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    before = path.read_bytes()
    assert read(path, stage.Params).selfplay.compile == "none"
    assert read(path, gate.Params).gate.compile == "none"
    assert path.read_bytes() == before


@pytest.mark.slow
def test_same_seed_same_shards(tmp_path):
    play(tmp_path, name="a")
    play(tmp_path, name="b")
    play(tmp_path, name="c", seed=1)
    a, b, c = (R.read_shard(tmp_path / n / "gen-0" / "part-0.parquet") for n in "abc")
    assert a.equals(b)
    assert not a.equals(c)
    for sgf in (tmp_path / "a" / "gen-0" / "sgf").glob("*.sgf"):
        assert sgf.read_bytes() == (tmp_path / "b" / "gen-0" / "sgf" / sgf.name).read_bytes()


@pytest.mark.slow
def test_game_randomization():
    """Sizes, rules, komi and handicap drawn per game as params say (Appendix D)."""
    params = SelfPlayParams.model_validate(
        small_params(
            board_sizes={5: 1.0, 7: 1.0},
            rules={"japanese": 1.0, "tromp-taylor": 1.0},
            handicap_probability=0.3,
            early_fork_probability=0.3,
            side_position_probability=0.0,
            full_visits=4,
        )["selfplay"]
    )
    sp = SP.SelfPlay(params.config(), SP.UniformNet(0), games=40, slots=8, seed=5)
    infos = [g.info for g in sp.run()]
    assert {i.size for i in infos} == {5, 7}
    assert {i.rules for i in infos} == {"japanese", "tromp-taylor"}
    komi = np.array([i.komi for i in infos if i.size == 7])
    assert (komi * 2 == np.round(komi * 2)).all() and komi.std() > 0.3
    assert abs(komi.mean() - 9.0) < 1.0  # params.yaml's fair komi for 7x7
    handicap = [i for i in infos if i.handicap]
    assert 0 < len(handicap) < 40 and all(i.size == 7 for i in handicap)  # 5x5 has none
    assert all(i.colors[0] == WHITE and len(i.setup) == i.handicap for i in handicap)
    forks = [i for i in infos if i.fork_turn >= 0 and i.fork_turn < len(i.moves)]
    assert forks and all(i.kinds[i.fork_turn] == SP.FORK for i in forks)


@pytest.mark.slow
def test_side_positions_and_forks_replay(tmp_path):
    metrics, io = play(
        tmp_path,
        games=8,
        handicap_probability=0.8,
        early_fork_probability=0.5,
        side_position_probability=0.2,
    )
    check_generation(io.out)
    assert metrics["games"] == 8 and metrics["handicap_games"] > 0
    assert metrics["side_positions"] > 0 and metrics["side_position_rows"] > 0
    records = [read_sgf(p) for p in (io.out / "sgf").glob("*.sgf")]
    sides = [r for r in records if "side position of game" in (r.root_comment or "")]
    assert len(sides) == metrics["side_positions"] and len(records) == 8 + len(sides)
    # A side position's record holds its game's moves up to the branch, then the alternative
    # (never a pass), then any moves it went on for.
    for r in sides:
        kinds = r.comments
        at = kinds.index("side position")
        assert r.moves[at][1] is not None
        assert all(k.startswith("full search") for k in kinds[at + 1 :])


@pytest.mark.slow
def test_decided_games_get_fewer_visits_and_lighter_rows(tmp_path):
    # A threshold of 1 counts every turn as lost: decided after 2 searched turns.
    _, io = play(tmp_path, decided_winrate=1.0, decided_turns=2, decided_weight=0.25,
                 full_probability=1.0, opening_moves=0.0, early_fork_probability=0.0,
                 side_position_probability=0.0)  # fmt: skip
    rows = check_generation(io.out)
    by_game: dict[str, list[dict]] = {}
    for r in rows:
        by_game.setdefault(r["game_id"], []).append(r)
    for game_rows in by_game.values():
        game_rows.sort(key=lambda r: r["turn"])
        weights = [r["value_weight"] for r in game_rows]
        assert weights[:2] == [1.0, 1.0][: len(weights)]
        assert all(w == 0.25 for w in weights[2:])
        assert all(r["policy_weight"] in (0.0, 0.25) for r in game_rows[2:])


def test_row_pool_keeps_rows_in_place_chains_games_and_reuses_what_games_free():
    rows = SP.Rows(5, capacity=4)

    def add(before, turns):
        """One row each for len(before) games, after their rows `before`."""
        k = len(turns)
        return rows.append(
            np.array(before), turn=np.array(turns), to_move=np.ones(k), board_size=np.full(k, 5),
            planes=np.zeros((k, F.packed_length(5))), globals=np.zeros((k, 10)),
            policy_target=np.zeros((k, 26)), policy_weight=np.ones(k), value_weight=np.ones(k),
            opponent_move=np.full(k, -1), visits=np.ones(k), root_value=np.zeros(k),
            root_score=np.zeros(k),
        )  # fmt: skip

    a0, b0, c0 = add([SP.NO_ROW] * 3, [0, 10, 20])  # three games' first rows
    a1 = add([a0], [1])[0]
    assert rows.count == 4 and sorted([a0, b0, c0, a1]) == [0, 1, 2, 3]
    taken = rows.take(a1)  # game a: its rows in the order added, out of the pool
    assert taken["turn"].tolist() == [0, 1] and rows.count == 2
    assert taken["policy_target"].shape == (2, 26)
    with pytest.raises(RuntimeError, match="already taken"):
        rows.take(a1)
    b1, c1 = add([b0, c0], [11, 21])  # into the indices game a freed
    assert sorted([b1, c1]) == sorted([a0, a1])
    b2, c2 = add([b1, c1], [12, 22])  # no room: the pool doubles, no row moves
    assert len(rows.before) == 8 and rows.count == 6
    assert rows.columns["turn"][[b0, b1, c0, c1]].tolist() == [10, 11, 20, 21]
    firsts = add([SP.NO_ROW] * 11, list(range(30, 41)))  # past doubling: grows by what it needs
    assert len(rows.before) == 17 and rows.count == 17
    assert rows.take(c2)["turn"].tolist() == [20, 21, 22]
    assert rows.take(b2)["turn"].tolist() == [10, 11, 12]
    for first, turn in zip(firsts, range(30, 41), strict=True):
        assert rows.take(first)["turn"].tolist() == [turn]
    assert rows.count == 0
    none = rows.take(SP.NO_ROW)  # a game that recorded no row
    assert none["turn"].shape == (0,) and none["planes"].shape == (0, F.packed_length(5))
    assert sorted(rows.free[: rows.n_free].tolist()) == list(range(17))  # each index free once


def test_the_row_pools_size_changes_no_row():
    """Self-play's rows, through a pool that starts with room for 2 rows (it grows mid-game
    and gives one game's indices to another), are those of the pool's usual start."""
    params = SelfPlayParams.model_validate(
        small_params(games=6, slots=3, record_cheap_searches=True,
                     side_position_probability=0.1)["selfplay"]
    )  # fmt: skip
    runs = []
    for capacity in (1024, 2):
        sp = SP.SelfPlay(params.config(), SP.UniformNet(0), games=6, slots=3, seed=4)
        sp.rows = SP.Rows(sp.layout, capacity=capacity)
        runs.append([g.rows for g in sp.run()])
    assert len(sp.rows.before) > 2 and sp.rows.count == 0
    big, small = runs
    assert len(big) == len(small) >= 6 and sum(len(r["turn"]) for r in big) > 40
    for a, b in zip(big, small, strict=True):
        assert a.keys() == b.keys()
        for name in a:
            np.testing.assert_array_equal(a[name], b[name], err_msg=name)


@pytest.mark.slow
def test_many_slots_keep_every_row_right(tmp_path):
    """24 games at once, more rows in all than the row pool's first 1024."""
    _, io = play(tmp_path, games=24, slots=24, full_visits=3, cheap_visits=2,
                 record_cheap_searches=True, side_position_probability=0.05)  # fmt: skip
    rows = check_generation(io.out)
    assert len(rows) > 1024


class PassingNet(SP.UniformNet):
    """Priors of 0.9 on pass: what a net trained on early-pass games proposes."""

    def __call__(self, planes, glob, *, legal):
        out = super().__call__(planes, glob, legal=legal)
        policy = out["policy"] * 0.1
        policy[:, -1] += 0.9 * (np.asarray(legal)[:, -1] > 0)
        out["policy"] = policy / policy.sum(axis=1, keepdims=True)
        return out


def test_opening_moves_from_the_raw_policy_never_pass():
    """The raw-policy opening plays on the board even when the policy would pass: a drawn
    pass lets the opponent pass back and win, and teaches the net to pass early. (Under
    Tromp-Taylor rules, where suicide is legal, a move on the board is there to play even
    deep into these long openings; without suicide a full board can leave only the pass.)"""
    params = SelfPlayParams.model_validate(
        small_params(opening_moves=0.5, games=8, slots=8, early_fork_probability=0.0,
                     side_position_probability=0.0, handicap_probability=0.0,
                     rules={"tromp-taylor": 1.0})["selfplay"]
    )  # fmt: skip
    sp = SP.SelfPlay(params.config(), PassingNet(0), games=8, slots=8, seed=3)
    infos = [g.info for g in sp.run()]
    opening = [
        info.moves[i]
        for info in infos
        for i in range(len(info.moves))
        if info.kinds[i] == SP.RAW_POLICY
    ]
    assert len(opening) > 20
    assert gb.PASS not in opening
    # The searches that follow do pass: it is only the opening's draws that may not.
    searched = [m for info in infos for m, k in zip(info.moves, info.kinds, strict=True)
                if k in (SP.FULL, SP.CHEAP)]  # fmt: skip
    assert gb.PASS in searched


def test_only_the_roots_that_changed_are_marked_for_the_device():
    """Each step the driver hands the backend's mirror the games whose root changed since the
    last (a move played on it, or a game or side position started in its slot), and only
    those; `roots_mirrored` counts them."""
    import dataclasses

    params = SelfPlayParams.model_validate(
        small_params(games=10, slots=4, side_position_probability=0.3)["selfplay"]
    )
    sp = SP.SelfPlay(params.config(), SP.UniformNet(0), games=10, slots=4, seed=3)
    sent = []
    real = sp.xp.mirror
    sp.xp = dataclasses.replace(
        sp.xp, mirror=lambda host, device=None, which=None: sent.append(which.copy())
        or real(host, device, which),
    )  # fmt: skip
    pending = np.zeros(sp.slots, np.bool_)
    partial = total = 0
    while sp.finished < sp.games or sp.side_info or sp.active.any():
        turns, games = sp.roots.move_count.copy(), sp.game.copy()
        sent.clear()
        sp.step()
        pending |= (sp.roots.move_count != turns) | (sp.game != games)
        mirrored = np.logical_or.reduce(sent) if sent else np.zeros(sp.slots, np.bool_)
        assert np.array_equal(mirrored | sp.roots_changed, pending)
        assert not (mirrored & sp.roots_changed).any()
        total += int(mirrored.sum())
        partial += 0 < mirrored.sum() < sp.slots
        pending = sp.roots_changed.copy()
    assert total == sp.roots_mirrored
    # Most steps move only some of the games: all but those rows stay on the device.
    assert sp.moves_done > 100 and partial > sp.steps // 2
    assert sp.roots_mirrored < sp.steps * sp.slots / 2


def test_playout_cap_fraction():
    """About full_probability of the searched turns are full searches."""
    params = SelfPlayParams.model_validate(
        small_params(full_probability=0.3, games=8, slots=8, opening_moves=0.0)["selfplay"]
    )
    sp = SP.SelfPlay(params.config(), SP.UniformNet(0), games=8, slots=8, seed=3)
    kinds = np.concatenate([g.info.kinds for g in sp.run()])
    searched = kinds[(kinds == SP.FULL) | (kinds == SP.CHEAP)]
    assert len(searched) > 200
    assert (searched == SP.FULL).mean() == pytest.approx(0.3, abs=0.06)


def test_expected_score_utility():
    # A point belief is the formula itself; the expectation is odd around the centre.
    u = S.expected_score_utility(
        np.array([3.0, -3.0, 5.0]), np.zeros(3), np.array([1.0, 1.0, np.nan]),
        np.array([9, 9, 9]), np.array([BLACK, WHITE, BLACK]), 0.5,
    )  # fmt: skip
    f = 0.5 * 2 / math.pi * math.atan(2 / 9)
    g = 0.5 * 2 / math.pi * math.atan(-4 / 9)
    np.testing.assert_allclose(u, [f, -g, 0.0], rtol=1e-6)
    # Against sampling: a wide belief.
    rng = np.random.default_rng(0)
    samples = rng.normal(4.0, 6.0, 400_000)
    mc = 0.5 * 2 / math.pi * np.arctan((samples - 1.0) / 9).mean()
    quad = S.expected_score_utility(
        np.array([4.0]), np.array([6.0]), np.array([1.0]), np.array([9]), np.array([BLACK]), 0.5
    )
    assert quad[0] == pytest.approx(mc, abs=2e-3)


def test_score_utility_prefers_the_bigger_win():
    """Every move wins (komi -20.5); only the score utility tells the capture, which leaves
    Black the whole board, from the rest."""
    game = game_from_diagram(
        """
        . . . . .
        . . X . .
        . X O X .
        . . . . .
        . . . . .
        """,
        rules="chinese",
        to_move=BLACK,
    )
    game.set_komi(-20.5)
    capture = gb.point(game.b.stride, 2, 3)
    centre = gb.score_all(game.b)[0][0]  # the root's score: Black by 3 - 1 + 20.5
    assert centre == 22.5

    def evaluate(leaves, weight):
        scores, _ = gb.score_all(leaves)
        mover = np.where(leaves.to_move == BLACK, 1.0, -1.0)
        win = (np.sign(scores) * mover).astype(np.float32)
        utility = win + S.expected_score_utility(
            scores, np.zeros(len(scores)), np.full(len(scores), centre), leaves.size,
            leaves.to_move, weight,
        )  # fmt: skip
        policy = np.ones(leaves.color.shape, np.float32)
        return policy, utility, win, scores.astype(np.float32)

    share = {}
    for weight in (0.0, 0.5):
        params = search_params(score_utility=weight)
        tree = mcts.search(game.b, lambda b, w=weight: evaluate(b, w), 400, params=params)
        visits = S.root_visits(tree, 0)
        assert sum(visits.values()) == 399
        share[weight] = visits[capture] / 399
        # The root's expected final score is tracked from Black's side: a win by more than 20.
        assert tree.score_sum[0, S.ROOT] / tree.visits[0, S.ROOT] > 20
        if weight:
            assert max(visits, key=visits.get) == capture
    assert share[0.5] > 2 * share[0.0]


def test_killed_stage_leaves_nothing(tmp_path, monkeypatch):
    class Boom(RuntimeError):
        pass

    class Failing(SP.UniformNet):
        calls = 0

        def __call__(self, *args, **kwargs):
            Failing.calls += 1
            if Failing.calls > 20:
                raise Boom
            return super().__call__(*args, **kwargs)

    params_path = write_params(tmp_path)
    params, io = stage.prepare(params_path, 0, out=tmp_path / "out" / "gen-0",
                               metrics=tmp_path / "out" / "m.json")  # fmt: skip
    monkeypatch.setattr(stage, "evaluator_from_bytes", lambda model, **kw: (Failing(), "x"))
    with pytest.raises(Boom):
        stage.run(params, io, progress=False)
    assert list((tmp_path / "out").iterdir()) == []


@pytest.mark.slow
def test_bad_params_are_named(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("selfplay:\n  games: [1\n")
    with pytest.raises(ParamsError, match=r"bad.yaml \(line \d+, column \d+\): not valid YAML"):
        load_params(bad)
    raw = small_params(gamez=3, full_probability=2, compile="fast")
    with pytest.raises(ParamsError) as e:
        section(raw, "selfplay", SelfPlayParams, source="p.yaml")
    assert "selfplay.gamez" in str(e.value) and "selfplay.full_probability" in str(e.value)
    assert "selfplay.compile" in str(e.value) and "'reduce-overhead'" in str(e.value)
    raw = small_params(rules={"klingon": 1.0})
    with pytest.raises(ParamsError, match="p.yaml: selfplay.rules: unknown rules preset 'klingon'"):
        section(raw, "selfplay", SelfPlayParams, source="p.yaml")
    # The command line: exit status 2 and the message, no traceback.
    path = write_params(tmp_path, games=0)
    result = subprocess.run(
        [sys.executable, "-m", "stages.selfplay", "--generation", "0", "--params", str(path)],
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert result.returncode == 2
    assert "selfplay.games" in result.stderr and "Traceback" not in result.stderr
    path = write_params(tmp_path)
    result = subprocess.run(
        [sys.executable, "-m", "stages.selfplay", "--generation", "1", "--params", str(path),
         "--model", "models/none.pt"],
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert result.returncode == 2 and "models/none.pt does not exist" in result.stderr


def test_corrupt_shard_is_named(tmp_path):
    _, io = play(tmp_path, games=2, slots=2)
    shard = R.list_shards(io.out)[0]
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    with pytest.raises(R.ShardError, match=f"shard {shard} is corrupt or truncated"):
        R.read_shard(shard)
    other = tmp_path / "other.parquet"
    pq.write_table(pa.table({"x": [1]}), other)
    with pytest.raises(R.ShardError, match="does not have the rows schema"):
        R.read_shard(other)
