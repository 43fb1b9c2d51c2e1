"""The batched API: many games per call, the same answers as one game at a time, on any
number of threads."""

from __future__ import annotations

import numpy as np
import pytest

from gocore import board as gb
from gocore.board import BLACK, PASS, WHITE
from gocore.game import Game
from gocore.playout import new_rng, play_out_all, random_games
from gocore.rules import PRESETS


def random_batch(games: int, size: int, seed: int, moves: int) -> gb.Boards:
    b = gb.new_boards(games, size, PRESETS["tromp-taylor"])
    rng = np.random.default_rng(seed)
    for _ in range(moves):
        legal = gb.legal_all(b)
        choice = np.array([rng.choice(np.nonzero(row)[0]) for row in legal])
        assert (gb.play_all(b, choice) == gb.LEGAL).all()
    return b


def test_play_all_and_legal_all_match_single_games():
    b = random_batch(16, 9, seed=0, moves=40)
    legal = gb.legal_all(b)
    for g in range(b.games):
        game = Game(9, PRESETS["tromp-taylor"])
        for m in range(b.move_count[g]):
            move = int(b.moves[g, m])
            game.play(int(b.move_colors[g, m]), game.index_point(move))
        assert np.array_equal(game.b.color[0], b.color[g])
        assert game.hash == b.hash[g]
        expected = {gb.point(b.stride, x, y) for x, y in game.legal_moves(game.to_move)}
        assert set(np.nonzero(legal[g])[0]) - {PASS} == expected


def test_play_all_refuses_per_game_and_leaves_that_game_alone():
    b = gb.new_boards(3, 5, PRESETS["chinese"])
    centre = gb.point(b.stride, 2, 2)
    gb.play_all(b, np.array([centre, centre, PASS]))
    before = b.color.copy()
    status = gb.play_all(b, np.array([centre, gb.point(b.stride, 0, 0), centre]))
    assert status.tolist() == [gb.ILLEGAL_OCCUPIED, gb.LEGAL, gb.LEGAL]
    assert np.array_equal(b.color[0], before[0])
    assert b.move_count.tolist() == [1, 2, 2]


def test_score_all_matches_game_score():
    b = random_batch(8, 7, seed=3, moves=30)
    scores, owner = gb.score_all(b)
    for g in range(b.games):
        game = Game(7, PRESETS["tromp-taylor"])
        for m in range(b.move_count[g]):
            game.play(int(b.move_colors[g, m]), game.index_point(int(b.moves[g, m])))
        assert scores[g] == game.score()
        # Area scoring: the score is what the owner map says, less komi.
        assert scores[g] == (owner[g] == BLACK).sum() - (owner[g] == WHITE).sum() - 7.5


@pytest.mark.parametrize("threads", ["1", "2", "3"])
def test_playouts_do_not_depend_on_the_thread_count(monkeypatch, threads):
    reference = gb.new_boards(12, 9, PRESETS["tromp-taylor"])
    play_out_all(reference, new_rng(12, 99), True)
    monkeypatch.setenv("TENGEN_THREADS", threads)
    b = gb.new_boards(12, 9, PRESETS["tromp-taylor"])
    play_out_all(b, new_rng(12, 99), True)
    assert np.array_equal(b.color, reference.color)
    assert np.array_equal(b.moves, reference.moves)
    assert (b.passes == 2).all()  # every game played to its end


def test_random_games_are_deterministic_for_a_seed():
    b = gb.new_boards(1, 9, PRESETS["tromp-taylor"])
    first = random_games(b, new_rng(1, 5), 20)
    second = random_games(b, new_rng(1, 5), 20)
    assert first == second and first[0] > 20 * 30 and first[1] == 0


def test_move_limit_is_reported_not_overrun():
    b = gb.new_boards(1, 5, PRESETS["chinese"], max_moves=3)
    for _ in range(3):
        assert gb.play_all(b, np.array([PASS]))[0] == gb.LEGAL
    assert gb.play_all(b, np.array([PASS]))[0] == gb.ILLEGAL_GAME_FULL
