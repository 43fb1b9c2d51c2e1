"""Property tests on random games: the kernels against a from-scratch reference and themselves."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gocore import board as gb
from gocore.board import BLACK, WHITE
from gocore.rules import PRESETS
from play.game import Game
from tests.reference_rules import ReferenceGame

PRESET_NAMES = sorted(PRESETS)


def liberties_from_scratch(game: Game) -> dict[tuple[int, int], int]:
    board = game.board()
    n = game.size
    out = {}
    for _, group in game.groups():
        libs = set()
        for x, y in group:
            for qx, qy in ((x - 1, y), (x + 1, y), (x, y - 1), (x, y + 1)):
                if 0 <= qx < n and 0 <= qy < n and board[qy, qx] == 0:
                    libs.add((qx, qy))
        for p in group:
            out[p] = len(libs)
    return out


def check_past_keys(game: Game) -> None:
    """The board's keys of its last positions (what the encoder's ladder memo looks up) are
    those of the positions replay_position rebuilds from the moves: 2 and 1 moves ago, now."""
    b = game.b
    m = int(b.move_count[0])
    past = gb.new_boards(1, int(b.size[0]), b.rules[0], layout=b.layout, max_moves=4)
    # A copy (what a search's leaves start from) has them too; its slot 1, not 0.
    copy = gb.new_boards(2, int(b.size[0]), b.rules[0], layout=b.layout, max_moves=b.max_moves)
    gb.copy_game(b, 0, copy, 1)
    for k in range(max(m - 2, 0), m + 1):
        gb.replay_position(b, 0, past, 0, k)
        rebuilt = (past.hash[0], gb.ko_key(past.ko_point[0], past.ko_color[0]))
        assert gb.past_key(b, 0, k) == rebuilt, (m, k)
        assert gb.past_key(copy, 1, k) == rebuilt, (m, k)


def check_invariants(game: Game, setup_counts: dict[int, int]) -> None:
    # The incremental hash equals the hash recomputed from the stones.
    assert game.hash == gb.recompute_hash(game.b, 0)
    check_past_keys(game)
    # Incremental liberty counts equal a flood fill from scratch.
    for p, libs in liberties_from_scratch(game).items():
        assert game.liberties(p) == libs, p
    # Stones balance: placed - lost (captured by the other side, suicides included).
    for colour in (BLACK, WHITE):
        placed = setup_counts[colour] + sum(
            1 for c, m in game.moves if c == colour and m is not None
        )
        assert len(game.stones(colour)) == placed - game.captures[3 - colour]


@settings(max_examples=300, deadline=None)
@given(
    size=st.integers(2, 6),
    preset=st.sampled_from(PRESET_NAMES),
    choices=st.lists(st.integers(0, 10_000), min_size=5, max_size=90),
)
def test_random_games_agree_with_the_reference(size, preset, choices):
    rules = PRESETS[preset]
    game = Game(size, rules)
    ref = ReferenceGame(size, ko=rules.ko, suicide=rules.suicide)
    for choice in choices:
        colour = game.to_move
        legal = set(game.legal_moves(colour))
        assert legal == ref.legal_moves(colour)
        options = sorted(legal) + [None]
        move = options[choice % len(options)]
        game.play(colour, move)
        ref.play(colour, move)
        assert {(x, y): int(c) for (x, y), c in np.ndenumerate(game.board().T) if c} == ref.stones
        assert game.captures == ref.captures
        check_invariants(game, {BLACK: 0, WHITE: 0})


def test_whole_random_games_agree_with_the_reference():
    """Full games on 7x7 under every preset, with own-eye filling now and then, so that big
    groups die, the board empties again and superko has long histories to look through."""
    for preset in PRESET_NAMES:
        rules = PRESETS[preset]
        for seed in range(2):
            game = Game(7, rules)
            ref = ReferenceGame(7, ko=rules.ko, suicide=rules.suicide)
            rng = np.random.default_rng(seed)
            kernel_rng = np.array([seed + 17], dtype=np.uint64)
            while not game.is_over and len(game.moves) < 300:
                colour = game.to_move
                assert set(game.legal_moves(colour)) == ref.legal_moves(colour)
                move = game.random_move(colour, kernel_rng, avoid_own_eyes=rng.random() < 0.7)
                game.play(colour, move)
                ref.play(colour, move)
                assert game.captures == ref.captures
            check_invariants(game, {BLACK: 0, WHITE: 0})


@settings(max_examples=40, deadline=None)
@given(
    size=st.integers(5, 13),
    preset=st.sampled_from(PRESET_NAMES),
    seed=st.integers(0, 2**31),
)
def test_random_games_keep_their_invariants_and_replay_exactly(size, preset, seed):
    game = Game(size, PRESETS[preset])
    rng = np.random.default_rng(seed)
    kernel_rng = np.array([seed], dtype=np.uint64)
    for _ in range(int(rng.integers(10, 3 * size * size))):
        colour = game.to_move
        # Mostly the random player; sometimes any legal move (own eyes too, for big captures).
        move = game.random_move(colour, kernel_rng, avoid_own_eyes=rng.random() < 0.8)
        game.play(colour, move)
        check_invariants(game, {BLACK: 0, WHITE: 0})
    # Replaying the same moves in a fresh game gives the same position, bit for bit.
    again = Game(size, PRESETS[preset])
    for colour, move in game.moves:
        again.play(colour, move)
    for field in ("color", "group_size", "group_libs", "hash", "captures", "history", "ko_point"):
        assert np.array_equal(getattr(game.b, field), getattr(again.b, field)), field


def test_long_random_19x19_games_keep_their_invariants():
    for seed in range(3):
        game = Game(19, PRESETS["tromp-taylor"])
        kernel_rng = np.array([seed], dtype=np.uint64)
        while not game.is_over:
            colour = game.to_move
            game.play(colour, game.random_move(colour, kernel_rng))
        check_invariants(game, {BLACK: 0, WHITE: 0})
        assert len(game.moves) > 300  # the random player plays until only eyes are left


def test_the_last_positions_keys_hold_after_setup_stones_undo_and_passes():
    """A handicap game (setup stones, White first) played with passes now and then, and moves
    taken back: the keys of the last positions stay those of the rebuilt positions."""
    for preset in PRESET_NAMES:
        game = Game(7, PRESETS[preset])
        game.add_setup_stones(BLACK, [(2, 2), (4, 4)])
        game.set_to_move(WHITE)
        check_past_keys(game)
        kernel_rng = np.array([5], dtype=np.uint64)
        rng = np.random.default_rng(5)
        for turn in range(60):
            colour = game.to_move
            move = None if rng.random() < 0.1 else game.random_move(colour, kernel_rng)
            game.play(colour, move)
            check_past_keys(game)
            if turn % 17 == 16:
                game.undo()
                check_past_keys(game)
