"""Hand-built positions with known answers, for every rule variant."""

from __future__ import annotations

import numpy as np
import pytest

from gocore import board as gb
from gocore.board import BLACK, EMPTY, WHITE
from gocore.rules import (
    PRESETS,
    Rules,
    RulesError,
    fixed_handicap_points,
    max_fixed_handicap,
    parse_rules,
)
from play.game import Game, IllegalMoveError
from tests.conftest import (
    TRIPLE_KO_CYCLE,
    diagram_of,
    game_from_diagram,
    ko_position,
    triple_ko_game,
)


def test_zobrist_keys_are_distinct_and_not_zero():
    """The keys of every stone on every point of the largest board: a repeat would make two
    positions one for superko, a zero key a stone the hash cannot see."""
    keys = {int(gb.zobrist(c, p)) for c in (BLACK, WHITE) for p in range(gb.MAX_AREA)}
    assert len(keys) == 2 * gb.MAX_AREA and 0 not in keys
    assert int(gb.EMPTY_BOARD_HASH) not in keys


def test_capture_and_liberties_on_a_small_board():
    game = game_from_diagram(
        """
        . X .
        X O X
        . . .
        """
    )
    assert game.liberties((1, 1)) == 1
    assert game.liberties((1, 0)) == 2 and game.liberties((0, 1)) == 2
    game.play(BLACK, (1, 2))
    assert game.color_at((1, 1)) == EMPTY
    assert game.captures == {BLACK: 1, WHITE: 0}
    assert game.liberties((1, 2)) == 3  # the captured stone's point is a liberty again
    assert game.liberties((1, 0)) == 3
    assert game.hash == gb.recompute_hash(game.b, 0)


def test_snapback_captures_three_after_giving_one():
    game = game_from_diagram(
        """
        . . O . .
        X X O . .
        O O . . .
        . . . . .
        . . . . .
        """,
        rules="chinese",
        to_move=WHITE,
    )
    game.play(WHITE, (0, 0))  # throw-in: the white stone can be taken
    assert game.liberties((0, 1)) == 1
    game.play(BLACK, (1, 0))  # black takes it ...
    assert game.color_at((0, 0)) == EMPTY and game.captures[BLACK] == 1
    assert game.liberties((1, 0)) == 1  # ... and is left with one liberty, where it captured
    assert game.legality(WHITE, (0, 0)) == "legal"  # not a ko: three stones will go
    game.play(WHITE, (0, 0))
    assert game.captures[WHITE] == 3
    assert [game.color_at(p) for p in ((1, 0), (0, 1), (1, 1))] == [EMPTY] * 3


@pytest.mark.parametrize("preset", ["tromp-taylor", "new-zealand", "chinese", "japanese", "aga"])
def test_multi_stone_suicide_only_where_the_rules_allow_it(preset):
    game = game_from_diagram(
        """
        X X . O .
        O O O . .
        . . . . .
        . . . . .
        . . . . .
        """,
        rules=preset,
    )
    allowed = PRESETS[preset].suicide
    assert game.legality(BLACK, (2, 0)) == ("legal" if allowed else "suicide")
    if allowed:
        game.play(BLACK, (2, 0))
        assert [game.color_at((x, 0)) for x in range(3)] == [EMPTY] * 3
        assert game.captures[WHITE] == 3  # suicided stones count as the opponent's prisoners
        assert game.liberties((0, 1)) == 7  # the white wall got its three points back: 3 + 3 + 1
        assert game.hash == gb.recompute_hash(game.b, 0)


@pytest.mark.parametrize("preset", ["tromp-taylor", "new-zealand", "chinese"])
def test_single_stone_suicide_is_never_legal(preset):
    game = game_from_diagram(
        """
        . O . . .
        O . . . .
        . . . . .
        . . . . .
        . . . . .
        """,
        rules=preset,
    )
    assert game.legality(BLACK, (0, 0)) == "suicide"
    with pytest.raises(IllegalMoveError, match="suicide"):
        game.play(BLACK, (0, 0))
    assert game.color_at((0, 0)) == EMPTY and not game.moves  # nothing changed


@pytest.mark.parametrize("preset", ["chinese", "tromp-taylor", "new-zealand", "japanese"])
def test_simple_ko_cannot_be_retaken_at_once(preset):
    game = ko_position(preset)
    game.play(BLACK, (2, 1))  # black takes the ko
    assert game.captures[BLACK] == 1 and game.color_at((1, 1)) == EMPTY
    assert game.legality(WHITE, (1, 1)) in ("ko", "superko")
    assert (1, 1) not in game.legal_moves(WHITE)
    game.play(WHITE, (4, 4))  # a ko threat elsewhere
    game.play(BLACK, (4, 3))
    assert game.legality(WHITE, (1, 1)) == "legal"  # now white may retake
    game.play(WHITE, (1, 1))
    assert game.color_at((2, 1)) == EMPTY


def test_a_pass_lifts_the_simple_ko_ban():
    game = ko_position("chinese")
    game.play(BLACK, (2, 1))
    game.play(WHITE, None)
    game.play(BLACK, None)
    assert game.legality(WHITE, (1, 1)) == "legal"


@pytest.mark.parametrize("preset", ["chinese", "japanese"])
def test_triple_ko_cycles_forever_under_simple_ko(preset):
    game = triple_ko_game(preset)
    start = game.hash
    for _ in range(3):
        for colour, p in TRIPLE_KO_CYCLE:
            game.play(colour, p)
        assert game.hash == start and game.to_move == BLACK


@pytest.mark.parametrize("preset", ["tromp-taylor", "new-zealand", "aga"])
def test_triple_ko_cycle_is_stopped_by_superko(preset):
    game = triple_ko_game(preset)
    for colour, p in TRIPLE_KO_CYCLE[:-1]:
        game.play(colour, p)
    last_colour, last = TRIPLE_KO_CYCLE[-1]
    assert game.legality(last_colour, last) == "superko"
    assert last not in game.legal_moves(last_colour)


def _sending_two_returning_one(rules: str) -> Game:
    # Black t = (1, 0) with the empty corner c = (0, 0) and a = (2, 0). Black plays a (two
    # stones in atari), White takes two at c, Black takes one back at t: the starting position
    # again, but with White to move.
    return game_from_diagram(
        """
        . X . O . . .
        X O O . . . .
        X . . . . . .
        . . . . . . .
        . . . . . . .
        . . . . . . .
        . . . . . . .
        """,
        rules=rules,
    )


def test_sending_two_returning_one_positional_vs_situational():
    for preset, expected in (
        ("chinese", "legal"),
        ("new-zealand", "legal"),
        ("tromp-taylor", "superko"),
    ):
        game = _sending_two_returning_one(preset)
        start = game.hash
        game.play(BLACK, (2, 0))  # sends two
        game.play(WHITE, (0, 0))  # takes two
        assert game.captures[WHITE] == 2
        # Returning one recreates the starting position, now with White to move: positional
        # superko forbids it, situational superko (new-zealand) and simple ko do not.
        assert game.legality(BLACK, (1, 0)) == expected, preset
        if expected == "legal":
            game.play(BLACK, (1, 0))
            assert game.hash == start and game.to_move == WHITE
            if preset == "new-zealand":
                game.play(WHITE, None)
                # Sending two again would repeat a position with the same player to move.
                assert game.legality(BLACK, (2, 0)) == "superko"


def test_multi_stone_suicide_repeating_a_position_positional_vs_situational():
    diagram = """
        . . O . .
        O O . . .
        . . . . .
        . . . . .
        . . . . .
        """
    for preset, expected in (("tromp-taylor", "superko"), ("new-zealand", "legal")):
        game = game_from_diagram(diagram, rules=preset)
        game.play(BLACK, (0, 0))
        game.play(WHITE, None)
        # Black's suicide of two stones restores the start, but with White to move.
        assert game.legality(BLACK, (1, 0)) == expected, preset


SEKI = """
. X X . O O .
X X X X O O O
O O O O X X X
. . . O X . .
. . . O X . .
. . . O X . .
. . . O X . X
"""
# Black's seki group (6 stones, eye (0,0)) and White's (5 stones, eye (6,0)) share (3,0).
# White's outside wall (8 stones) owns the lower-left 12 points; Black's (7 stones) the
# lower-right 8 points, where one more Black stone stands at (6,6).
SEKI_BLACK_GROUP = [(1, 0), (2, 0), (0, 1), (1, 1), (2, 1), (3, 1)]
SEKI_WHITE_GROUP = [(4, 0), (5, 0), (4, 1), (5, 1), (6, 1)]


def test_seki_under_area_scoring():
    game = game_from_diagram(SEKI, rules=Rules(ko="simple", suicide=False, scoring="area", komi=0))
    # Nobody may fill the shared liberty without putting their own group in atari, and the
    # eyes are suicide for the other side.
    assert game.liberties((0, 1)) == 2 and game.liberties((4, 0)) == 2
    assert game.legality(WHITE, (0, 0)) == "suicide" and game.legality(BLACK, (6, 0)) == "suicide"
    # Black: 14 stones + eye + 7 points = 22. White: 13 stones + eye + 12 points = 26.
    # The shared liberty (3, 0) is nobody's.
    assert game.score() == -4.0


def test_seki_under_territory_scoring():
    rules = Rules(ko="simple", suicide=False, scoring="territory", komi=0)
    game = game_from_diagram(SEKI, rules=rules)
    # Counting every single-colour region: Black 1 + 7, White 1 + 12.
    assert game.score() == -5.0
    # Japanese rules: eyes of groups in seki are not territory. Black 7, White 12.
    seki = SEKI_BLACK_GROUP + SEKI_WHITE_GROUP
    assert game.score(seki=seki) == -5.0
    # Marking only Black's group shows the eye rule is per group: Black 7, White 1 + 12.
    assert game.score(seki=SEKI_BLACK_GROUP) == -6.0
    # A dead White stone in Black's area: its point is Black's territory and it is a prisoner.
    with_dead = SEKI.replace(". . . O X . X", ". . . O X O X")
    dead_game = game_from_diagram(with_dead, rules=rules)
    assert dead_game.score(seki=seki, dead=[(5, 6)]) == -4.0  # Black 7 + 1, White 12


def test_dead_stones_under_area_scoring():
    with_dead = SEKI.replace(". . . O X . X", ". . . O X O X")
    game = game_from_diagram(with_dead, rules=Rules(ko="simple", suicide=False, komi=0))
    # Not removed: Black's 7 points become 6 dame and a White stone, which counts for White.
    assert game.score() == -4.0 - 7 - 1
    assert game.score(dead=[(5, 6)]) == -4.0  # removed: Black's area again, as without it


def test_komi_and_draws():
    game = Game(2, Rules(ko="positional", suicide=False, scoring="area", komi=2))
    game.play(BLACK, (0, 0))
    game.play(WHITE, (1, 1))
    # 2x2: one stone each, the two empty points touch both colours: 1 - 1 - komi.
    assert game.score() == -2.0
    assert Game(2, Rules(komi=0)).score() == 0.0


@pytest.mark.parametrize("size", [9, 13, 19])
def test_fixed_handicap_placement(size):
    star = {9: (2, 6, 4), 13: (3, 9, 6), 19: (3, 15, 9)}[size]
    low, high, mid = star
    assert fixed_handicap_points(size, 2) == [(low, high), (high, low)]  # D4/Q16 on 19x19
    assert set(fixed_handicap_points(size, 4)) == {
        (low, low),
        (low, high),
        (high, low),
        (high, high),
    }
    assert (mid, mid) in fixed_handicap_points(size, 5)
    assert (mid, mid) not in fixed_handicap_points(size, 6)
    assert set(fixed_handicap_points(size, 9)) == {(x, y) for x in star for y in star}
    with pytest.raises(RulesError):
        fixed_handicap_points(size, 10)
    with pytest.raises(RulesError):
        fixed_handicap_points(size, 1)


def test_fixed_handicap_limits_by_board_size():
    assert [max_fixed_handicap(n) for n in (5, 6, 7, 8, 9, 10, 11, 12, 13, 19)] == [
        0,
        0,
        4,
        4,
        9,
        4,
        9,
        4,
        9,
        9,
    ]
    assert fixed_handicap_points(7, 4) == [(2, 4), (4, 2), (2, 2), (4, 4)]


def test_handicap_stones_are_setup_not_moves():
    game = Game(9, PRESETS["chinese"])
    game.add_setup_stones(BLACK, fixed_handicap_points(9, 3))
    game.set_to_move(WHITE)
    assert len(game.stones(BLACK)) == 3 and not game.moves
    assert game.to_move == WHITE
    with pytest.raises(IllegalMoveError):
        game.add_setup_stones(BLACK, [(2, 6)])  # occupied: all or nothing
    assert len(game.stones(BLACK)) == 3


def test_rules_presets_and_parsing():
    assert PRESETS["simple"] == Rules(ko="simple", suicide=False, scoring="area", komi=7.5)
    assert parse_rules("tromp-taylor").ko == "positional"
    assert parse_rules("koSITUATIONALscoreAREAsui1") == Rules(ko="situational", suicide=True)
    assert parse_rules("Japanese", komi=0.5).komi == 0.5
    assert (
        parse_rules('{"ko": "SIMPLE", "scoring": "TERRITORY", "suicide": false}').scoring
        == "territory"
    )
    assert parse_rules("koSIMPLEscoreAREAsui0").name == "chinese"
    with pytest.raises(RulesError, match="unknown rules"):
        parse_rules("chess")
    with pytest.raises(RulesError, match="komi"):
        Rules(komi=6.25)
    with pytest.raises(RulesError, match="unknown keys"):
        parse_rules('{"kO": "SIMPLE"}')


def test_rules_row_drives_the_kernels_per_game():
    # One batch, two games under different rules: suicide legal in one, not in the other.
    rows = np.stack([PRESETS["tromp-taylor"].as_row(), PRESETS["chinese"].as_row()])
    b = gb.new_boards(2, 5, rows)
    stride = b.stride
    for g in range(2):
        for x, y in ((0, 1), (1, 1), (2, 1), (3, 0)):
            assert gb.setup_stone(b, g, gb.point(stride, x, y), WHITE) == gb.LEGAL
        for x, y in ((0, 0), (1, 0)):
            assert gb.setup_stone(b, g, gb.point(stride, x, y), BLACK) == gb.LEGAL
    p = gb.point(stride, 2, 0)
    assert gb.legality(b, 0, p, BLACK) == gb.LEGAL
    assert gb.legality(b, 1, p, BLACK) == gb.ILLEGAL_SUICIDE


def test_board_sizes_two_to_nineteen():
    for size in (2, 3, 19):
        game = Game(size)
        assert len(game.legal_moves(BLACK)) == size * size
    with pytest.raises(ValueError, match="board size"):
        Game(1)
    with pytest.raises(ValueError, match="board size"):
        Game(20)


def test_mixed_sizes_share_one_batch():
    b = gb.new_boards(3, np.array([5, 9, 7]))
    legal = gb.legal_all(b)
    assert legal.sum(axis=1).tolist() == [26, 82, 50]  # n*n points plus pass
    assert diagram_of(Game(3)) == ". . .\n. . .\n. . ."
