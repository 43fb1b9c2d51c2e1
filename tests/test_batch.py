"""The batched API: many games per call, the same answers as one game at a time, on any
number of threads."""

from __future__ import annotations

import numpy as np
import pytest

from gocore import board as gb
from gocore.board import BLACK, PASS, WHITE
from gocore.playout import new_rng, play_out_all, random_games
from gocore.rules import PRESETS
from play.game import Game


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


@pytest.mark.parametrize("layout", [2, 5, 9, 19])
def test_every_neighbour_and_diagonal_is_inside_the_layout(layout):
    b = gb.new_boards(1, layout)
    area, stride = b.color.shape[1], b.stride
    for y in range(layout):
        for x in range(layout):
            p = gb.point(stride, x, y)
            for d in (-stride - 1, -stride, -stride + 1, -1, 1, stride - 1, stride, stride + 1):
                assert 0 <= p + d < area
    # Everything that is not a point of the board is a wall.
    assert (b.color[0] == gb.WALL).sum() == area - layout * layout


def test_the_bottom_right_corner_eye_is_an_eye():
    # The corner's outer diagonal is the last cell of the layout (it used to be past the end).
    b = gb.new_boards(1, 5)
    for x, y in ((3, 4), (4, 3), (3, 3)):
        assert gb.setup_stone(b, 0, gb.point(b.stride, x, y), BLACK) == gb.LEGAL
    assert gb.is_eye(b, 0, gb.point(b.stride, 4, 4), BLACK)
    assert b.color[0, -1] == gb.WALL


def test_copy_game_onto_itself_keeps_the_superko_history():
    game = Game(5, PRESETS["tromp-taylor"])
    for colour, move in ((BLACK, (0, 0)), (WHITE, (1, 1)), (BLACK, (2, 2))):
        game.play(colour, move)
    history = game.b.history.copy()
    gb.copy_game(game.b, 0, game.b, 0)
    assert np.array_equal(game.b.history, history)
    copy = gb.new_boards(2, 5, PRESETS["tromp-taylor"])
    gb.copy_game(game.b, 0, copy, 1)
    assert np.array_equal(copy.history[1], history[0]) and copy.history_count[1] == 4


def test_a_full_move_history_is_reported_by_legality_too():
    game = Game(5, PRESETS["chinese"], max_moves=2)
    game.play(BLACK, (2, 2))
    game.play(WHITE, None)
    assert game.legality(BLACK, (0, 0)) == "move limit reached"
    assert game.legality(BLACK, None) == "move limit reached"
    assert game.legal_moves(BLACK) == []
    assert not gb.legal_all(game.b)[0, PASS]


def test_the_kernel_cache_is_named_by_every_kernel_source():
    from gocore.jit import CACHE_DIR, kernel_sources

    names = {path.name for path in kernel_sources()}
    # board.py's kernels are inlined into playout.py's drivers: both, and what they import.
    assert {"jit.py", "board.py", "playout.py", "rules.py"} <= names
    # The CUDA kernels are cached in the same folder (gocore/cuda.py): their device functions
    # are every other kernel source, so the digest must cover them all, and cuda.py.
    assert {"cuda.py", "features.py", "search.py"} <= names
    assert "gtp.py" not in names and "sgf.py" not in names
    assert CACHE_DIR.name.startswith("gocore-")


def test_compiles_of_a_second_or_more_are_logged(caplog):
    """`jit.log_compiles`: each outermost numba compile that took at least the threshold is
    logged with its function's name (what a fresh GPU machine spends its first minute on)."""
    import logging

    import numba

    from gocore import jit

    @numba.njit
    def callee(x):
        return x * 2

    @numba.njit
    def caller(x):
        return callee(x) + 1

    try:
        with caplog.at_level(logging.INFO, logger="gocore.jit"):
            jit.log_compiles(0.0)
            assert caller(3) == 7
            jit.log_compiles(3600.0)  # nothing compiles that long: nothing more is logged
            assert caller(2.5) == 6.0
    finally:
        jit.log_compiles(3600.0)
    logged = [r.getMessage() for r in caplog.records if r.name == "gocore.jit"]
    # One line: the caller's compile took its callee's in; a threshold above it logs nothing.
    assert len(logged) == 1 and logged[0].startswith("numba compiled ")
    assert "caller" in logged[0] and logged[0].endswith(" s")
