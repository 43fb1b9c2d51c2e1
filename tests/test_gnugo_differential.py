"""Differential test against GNU Go 3.8 (simple ko, no suicide: tengen's `simple` preset).

Hundreds of random games on 9x9 and 19x19: after every move the stones on both boards must be
identical, and the moves GNU Go allows (`all_legal`) must be exactly the ones tengen allows.
Each game is played on tengen first and sent to GNU Go as one GTP script, so the comparison
costs one round trip per game.
"""

from __future__ import annotations

import numpy as np
import pytest

from gocore.board import BLACK, WHITE
from gocore.rules import PRESETS, fixed_handicap_points, max_fixed_handicap
from play.game import Game
from play.gtp import format_vertex, parse_vertex
from play.match import GtpClient

pytestmark = pytest.mark.gnugo


@pytest.fixture(scope="module")
def gnugo(gnugo_path):
    client = GtpClient(f"{gnugo_path} --mode gtp --level 0", label="gnugo", timeout=120)
    yield client
    client.close()


def _colour(c: int) -> str:
    return "black" if c == BLACK else "white"


def _points(text: str, size: int) -> set:
    return {parse_vertex(v, size) for v in text.split()}


def play_random_game(size: int, seed: int, *, max_moves: int):
    """A random game on tengen: mostly the random player, sometimes any legal move (own eyes
    too, so big groups die and the board refills), sometimes a pass."""
    game = Game(size, PRESETS["simple"])
    rng = np.random.default_rng(seed)
    kernel_rng = np.array([seed * 7919 + 1], dtype=np.uint64)
    stones, legal = [], []
    while len(game.moves) < max_moves and not game.is_over:
        colour = game.to_move
        r = rng.random()
        move = None if r < 0.01 else game.random_move(colour, kernel_rng, avoid_own_eyes=r < 0.85)
        game.play(colour, move)
        stones.append((set(game.stones(BLACK)), set(game.stones(WHITE))))
        legal.append(set(game.legal_moves(game.to_move)))
    return game, stones, legal


def compare_with_gnugo(gnugo: GtpClient, size: int, seed: int, *, max_moves: int, legal_every: int):
    game, stones, legal = play_random_game(size, seed, max_moves=max_moves)
    script = [f"boardsize {size}", "clear_board"]
    checks = []
    for number, (colour, move) in enumerate(game.moves, start=1):
        script.append(f"play {_colour(colour)} {format_vertex(move, size)}")
        script += ["list_stones black", "list_stones white"]
        checks.append(("stones", number, len(script) - 2))
        if number % legal_every == 0:
            script.append(f"all_legal {_colour(3 - colour)}")
            checks.append(("legal", number, len(script) - 1))
    answers = gnugo.send_many(script)
    refused = [(cmd, text) for cmd, (ok, text) in zip(script, answers, strict=True) if not ok]
    assert not refused, f"seed {seed}: GNU Go refused {refused[:3]}"
    for kind, number, index in checks:
        if kind == "stones":
            black = _points(answers[index][1], size)
            white = _points(answers[index + 1][1], size)
            assert (black, white) == stones[number - 1], (
                f"{size}x{size} seed {seed}: after move {number}"
            )
        else:
            theirs = _points(answers[index][1], size)
            ours = legal[number - 1]
            assert theirs == ours, (
                f"{size}x{size} seed {seed}: legal moves after move {number} differ: "
                f"only tengen {sorted(ours - theirs)}, only GNU Go {sorted(theirs - ours)}"
            )
    return game


@pytest.mark.parametrize("block", range(4))
def test_9x9_random_games_match_gnugo(gnugo, block):
    captures = 0
    for seed in range(block * 60, (block + 1) * 60):
        game = compare_with_gnugo(gnugo, 9, seed, max_moves=400, legal_every=1)
        captures += sum(game.captures.values())
    assert captures > 1000  # the games exercise captures, not just filling the board


@pytest.mark.slow
@pytest.mark.parametrize("block", range(2))
def test_19x19_random_games_match_gnugo(gnugo, block):
    for seed in range(1000 + block * 50, 1000 + (block + 1) * 50):
        compare_with_gnugo(gnugo, 19, seed, max_moves=900, legal_every=7)


def test_gnugo_refuses_what_tengen_refuses(gnugo):
    """Illegal moves of every kind are refused by both: occupied, suicide, ko."""
    game = Game(5, PRESETS["simple"])
    moves = [
        (BLACK, (1, 0)), (WHITE, (2, 0)), (BLACK, (0, 1)), (WHITE, (3, 1)),
        (BLACK, (1, 2)), (WHITE, (2, 2)), (BLACK, (4, 3)), (WHITE, (0, 4)),
        (BLACK, (3, 4)), (WHITE, (4, 0)), (BLACK, (2, 1)), (WHITE, (1, 1)),
    ]  # fmt: skip
    script = ["boardsize 5", "clear_board"]
    for colour, move in moves:
        game.play(colour, move)
        script.append(f"play {_colour(colour)} {format_vertex(move, 5)}")
    # White just took the ko at (1, 1): Black may not retake at (2, 1); (1, 1) is occupied;
    # the corner (4, 4) is suicide for White.
    probes = [(BLACK, (2, 1), "ko"), (BLACK, (1, 1), "point occupied"), (WHITE, (4, 4), "suicide")]
    for colour, move, reason in probes:
        assert game.legality(colour, move) == reason
        script.append(f"is_legal {_colour(colour)} {format_vertex(move, 5)}")
    answers = gnugo.send_many(script)
    assert all(ok for ok, _ in answers)
    assert [text for _, text in answers[-3:]] == ["0", "0", "0"]


def test_fixed_handicap_placement_matches_gnugo(gnugo):
    script, cases = [], []
    for size in range(2, 20):
        for stones in range(2, 11):
            script += [f"boardsize {size}", "clear_board", f"fixed_handicap {stones}"]
            cases.append((size, stones, len(script) - 1))
    answers = gnugo.send_many(script)
    for size, stones, index in cases:
        ok, text = answers[index]
        if stones <= max_fixed_handicap(size):
            assert ok and _points(text, size) == set(fixed_handicap_points(size, stones)), (
                size,
                stones,
            )
        else:
            assert not ok, (size, stones, text)
