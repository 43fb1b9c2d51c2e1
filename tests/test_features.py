"""The network's inputs: planes and globals on hand-built positions, ladders (hand-built and
against GNU Go's ladder_attack), Benson's pass-alive area, symmetries and bit-packing."""

from __future__ import annotations

import numpy as np
import pytest

from gocore import features as F
from gocore.board import (
    BLACK,
    PASS,
    WHITE,
    Boards,
    legal_all,
    new_boards,
    play_all,
    point,
    point_xy,
)
from gocore.playout import new_rng
from gocore.rules import PRESETS
from play.game import Game
from play.gtp import format_vertex, parse_vertex
from tests.conftest import TRIPLE_KO_CYCLE, game_from_diagram, ko_position, triple_ko_game


def encode_game(game: Game, sym: int = 0, tensor: int | None = None):
    tensor = game.size if tensor is None else tensor
    planes = np.zeros((1, F.N_PLANES, tensor, tensor), np.float32)
    glob = np.zeros((1, F.N_GLOBALS), np.float32)
    F.encode_all(game.b, F.new_work(game.b), planes, glob, np.array([sym]))
    return planes[0], glob[0]


def points_of(plane: np.ndarray, size: int) -> set[str]:
    """The GTP vertices set on an (unsymmetrized) plane."""
    ys, xs = np.nonzero(plane[:size, :size])
    return {format_vertex((int(x), int(y)), size) for x, y in zip(xs, ys, strict=True)}


def vertices(text: str, size: int) -> set[str]:
    return {format_vertex(parse_vertex(v, size), size) for v in text.split()}


# ---------------------------------------------------------------------------------------------
# Planes and globals
# ---------------------------------------------------------------------------------------------


def test_stones_liberties_and_board_planes_from_the_mover_view():
    game = game_from_diagram(
        """
        X O . . .
        X O . . .
        . X . O O
        . . . O .
        . . . . .
        """,
        to_move=WHITE,
    )
    planes, _ = encode_game(game, tensor=7)
    assert planes[F.ON_BOARD].sum() == 25 and planes[F.ON_BOARD, :5, :5].all()
    assert points_of(planes[F.OWN], 5) == vertices("B5 B4 D3 E3 D2", 5)  # white to move
    assert points_of(planes[F.OPPONENT], 5) == vertices("A5 A4 B3", 5)
    assert points_of(planes[F.LIBERTIES_1], 5) == vertices("A5 A4", 5)  # only A3
    assert points_of(planes[F.LIBERTIES_2], 5) == vertices("B5 B4", 5)  # C5, C4
    assert points_of(planes[F.LIBERTIES_3], 5) == vertices("B3", 5)
    game.play(WHITE, (0, 2))  # A3 captures A5-A4
    planes, _ = encode_game(game)
    assert points_of(planes[F.OWN], 5) == vertices("B3", 5)  # black to move now
    assert points_of(planes[F.OPPONENT], 5) == vertices("B5 B4 A3 D3 E3 D2", 5)
    assert points_of(planes[F.LIBERTIES_1], 5) == set()
    assert points_of(planes[F.LAST_MOVE], 5) == vertices("A3", 5)


def test_liberty_planes_count_exactly():
    game = game_from_diagram(
        """
        X O . . .
        . . . . .
        . . X X .
        . . . . .
        . . . . O
        """
    )
    planes, _ = encode_game(game)
    assert points_of(planes[F.LIBERTIES_1], 5) == vertices("A5", 5)  # A5: only A4
    assert points_of(planes[F.LIBERTIES_2], 5) == vertices("B5 E1", 5)
    # C3-D3 has 6 liberties: on no liberty plane.
    assert not planes[F.LIBERTIES_1 : F.LIBERTIES_3 + 1, 2, 2:4].any()


def test_ko_plane_marks_the_simple_ko_ban_for_the_player_to_move():
    game = ko_position("chinese")
    game.play(BLACK, (2, 1))  # takes the ko at B4
    planes, _ = encode_game(game)
    assert points_of(planes[F.KO_BANNED], 5) == vertices("B4", 5)
    game.play(WHITE, (4, 4))
    planes, _ = encode_game(game)
    assert points_of(planes[F.KO_BANNED], 5) == set()


def test_ko_plane_marks_superko_bans():
    # Three kos; under positional superko White's last retake would repeat the position.
    game = triple_ko_game("tromp-taylor")
    for colour, p in TRIPLE_KO_CYCLE[:-1]:
        game.play(colour, p)
    planes, _ = encode_game(game)
    banned = points_of(planes[F.KO_BANNED], 9)
    assert format_vertex((1, 7), 9) in banned  # the superko ban
    assert game.legality(WHITE, (1, 7)) == "superko"
    # Exactly the points the rules engine refuses for ko or superko.
    expected = {
        format_vertex(p, 9)
        for p in [(x, y) for x in range(9) for y in range(9)]
        if game.legality(WHITE, p) in ("ko", "superko")
    }
    assert banned == expected


def test_move_history_planes_and_pass_globals():
    game = Game(7, PRESETS["chinese"])
    moves = [
        (BLACK, (3, 3)),
        (WHITE, (2, 2)),
        (BLACK, None),
        (WHITE, (4, 4)),
        (BLACK, (1, 1)),
        (WHITE, None),
        (BLACK, (5, 5)),
    ]
    for colour, move in moves:
        game.play(colour, move)
    planes, glob = encode_game(game)
    # Latest first: (5,5), pass, (1,1), (4,4), pass.
    assert points_of(planes[F.LAST_MOVE], 7) == {format_vertex((5, 5), 7)}
    assert not planes[F.LAST_MOVE + 1].any()
    assert points_of(planes[F.LAST_MOVE + 2], 7) == {format_vertex((1, 1), 7)}
    assert points_of(planes[F.LAST_MOVE + 3], 7) == {format_vertex((4, 4), 7)}
    assert not planes[F.LAST_MOVE + 4].any()
    assert list(glob[F.LAST_PASS : F.LAST_PASS + 5]) == [0, 1, 0, 0, 1]
    fresh, fresh_glob = encode_game(Game(7))
    assert not fresh[F.LAST_MOVE : F.LAST_MOVE + 5].any() and not fresh_glob[:5].any()


@pytest.mark.parametrize(
    ("preset", "ko", "suicide", "territory"),
    [
        ("chinese", (0, 0), 0, 0),
        ("tromp-taylor", (1, 0.5), 1, 0),
        ("new-zealand", (1, -0.5), 1, 0),
        ("japanese", (0, 0), 0, 1),
        ("aga", (1, -0.5), 0, 0),
    ],
)
def test_rule_globals(preset, ko, suicide, territory):
    game = Game(9, PRESETS[preset])
    _, glob = encode_game(game)
    assert tuple(glob[F.KO_RULE : F.KO_RULE + 2]) == ko
    assert glob[F.SUICIDE] == suicide and glob[F.TERRITORY] == territory
    komi = PRESETS[preset].komi
    assert glob[F.KOMI] == pytest.approx(-komi / F.KOMI_SCALE)  # black to move: komi against
    game.play(BLACK, (4, 4))
    _, glob = encode_game(game)
    assert glob[F.KOMI] == pytest.approx(komi / F.KOMI_SCALE)


def test_smaller_board_sits_top_left_of_the_tensor():
    game = game_from_diagram(". X .\n. O .\n. . .")
    planes, _ = encode_game(game, tensor=9)
    assert planes[F.ON_BOARD].sum() == 9 and planes[F.ON_BOARD, :3, :3].all()
    assert not planes[:, 3:, :].any() and not planes[:, :, 3:].any()


def test_encoder_checks_its_buffers():
    b = new_boards(2, 9)
    w = F.new_work(b)
    with pytest.raises(ValueError, match=r"planes must be \[2, 18, T, T\]"):
        F.encode_all(b, w, np.zeros((2, 17, 9, 9), np.float32), np.zeros((2, 10), np.float32))
    with pytest.raises(ValueError, match="cannot hold a 9x9 board"):
        F.encode_all(b, w, np.zeros((2, 18, 7, 7), np.float32), np.zeros((2, 10), np.float32))
    with pytest.raises(ValueError, match="symmetries are 0..7"):
        F.encode_all(
            b, w, np.zeros((2, 18, 9, 9), np.float32), np.zeros((2, 10), np.float32), [0, 8]
        )


# ---------------------------------------------------------------------------------------------
# Ladders
# ---------------------------------------------------------------------------------------------

NET = {  # the ladder net around white E5 (in atari at F5 unless E4 is left out)
    3: ". . . . X . . . .",
    4: ". . . X O . . . .",
    5: ". . . . X X . . .",
}


def _board(rows: dict[int, str], size: int = 9) -> str:
    empty = " ".join("." * size)
    return "\n".join(rows.get(y, empty) for y in range(size))


def _with(rows: dict[int, str], **extra: str) -> dict[int, str]:
    out = dict(rows)
    for key, row in extra.items():
        out[int(key[1:])] = row
    return out


def _big_net(**extra: str) -> str:
    rows = {
        9: ". " * 9 + "X " + ". " * 9,
        10: ". " * 8 + "X O " + ". " * 9,
        11: ". " * 9 + "X X " + ". " * 8,
    }
    rows = {y: row.strip() for y, row in rows.items()}
    return _board(_with(rows, **extra), 19)


LADDERS = [
    # (name, diagram, player to move, laddered stones, ladder-catching moves)
    ("runs_to_the_edge", _board(NET), WHITE, "E5", ""),
    (
        "broken_by_a_stone_on_the_diagonal",
        _board(_with(NET, y1=". . . . . . . O .")),
        WHITE,
        "",
        "",
    ),
    (
        "attacker_stone_on_the_diagonal_helps",
        _board(_with(NET, y1=". . . . . . . X .")),
        WHITE,
        "E5",
        "",
    ),
    (
        "stone_on_the_other_diagonal_is_irrelevant",
        _board(_with(NET, y7=". O . . . . . . .")),
        WHITE,
        "E5",
        "",
    ),
    (
        "defender_escapes_by_capturing",
        _board(_with(NET, y2=". . . . O . . . .", y3=". . . O X . . . .")),
        WHITE,
        "",
        "",
    ),
    ("extension_gets_three_liberties", _board(_with(NET, y5=". . . . X . . . .")), WHITE, "", ""),
    # Extending to F5 joins white G5: 4 liberties, no ladder; with black G4 and H5 the joined
    # chain has 2 (F6, G6) and Black G6 leads the ladder on; G5 alone is laddered too, by G6.
    ("extension_joins_a_strong_chain", _board(_with(NET, y4=". . . X O . O . .")), WHITE, "", ""),
    (
        "extension_joins_a_weak_chain",
        _board(_with(NET, y4=". . . X O . O X .", y5=". . . . X X X . .")),
        WHITE,
        "E5 G5",
        "",
    ),
    (
        "two_liberties_attacker_to_move",
        _board(_with(NET, y5=". . . . . X . . .")),
        BLACK,
        "E5",
        "E4 F5",
    ),
    ("two_liberties_defender_to_move", _board(_with(NET, y5=". . . . . X . . .")), WHITE, "E5", ""),
    (
        "two_liberties_both_ways_broken",
        _board(_with(NET, y5=". . . . . X . . .", y1=". . . . . . . O .", y7=". O . . . . . . .")),
        BLACK,
        "",
        "",
    ),
    (
        "second_line_into_the_edge",
        _board({6: ". . . X . . . . .", 7: ". . X O . . . . ."}),
        BLACK,
        "D2",
        "E2",
    ),
    ("three_liberties_is_no_ladder", _board({4: ". . . X O . . . ."}), BLACK, "", ""),
    ("19x19_across_the_board", _big_net(), WHITE, "K9", ""),
    ("19x19_broken_far_away", _big_net(y2=". " * 17 + "O ."), WHITE, "", ""),
    ("19x19_attacker_first", _big_net(y11=". " * 10 + "X " + ". " * 8), BLACK, "K9", "K8 L9"),
]


@pytest.mark.parametrize(
    ("diagram", "to_move", "laddered", "catches"),
    [case[1:] for case in LADDERS],
    ids=[case[0] for case in LADDERS],
)
def test_ladders_on_hand_built_positions(diagram, to_move, laddered, catches):
    game = game_from_diagram(diagram, to_move=to_move)
    size = game.size
    planes, _ = encode_game(game)
    assert points_of(planes[F.LADDERED], size) == vertices(laddered, size)
    assert points_of(planes[F.LADDER_CATCH], size) == vertices(catches, size)
    # The reader leaves the position as it found it.
    lad, _ = F.ladders_all(game.b)
    assert {format_vertex(point_xy(game.b.stride, p), size) for p in np.flatnonzero(lad[0])} == (
        vertices(laddered, size)
    )


def test_a_search_out_of_budget_leaves_the_board_as_it_was():
    # The long 19x19 ladder needs a few dozen nodes; every smaller budget stops it somewhere
    # else, and each time the reader's board must be the real board again.
    game = game_from_diagram(_big_net(), to_move=WHITE)
    k9 = point(game.b.stride, *parse_vertex("K9", 19))
    results = []
    for budget in range(1, 80):
        work = F.new_work(game.b, ladder_nodes=budget)
        laddered, _ = F.ladders_all(game.b, work)
        assert np.array_equal(work.color, game.b.color), budget
        results.append(bool(laddered[0, k9]))
    assert not results[0] and results[-1]  # too small a budget reads as an escape


def test_work_space_and_policy_shapes_are_checked():
    b9, b19 = new_boards(2, 9), new_boards(2, 19)
    with pytest.raises(ValueError, match="does not fit boards of shape"):
        F.ladders_all(b19, F.new_work(b9))
    with pytest.raises(ValueError, match="does not fit boards of shape"):
        F.encode_all(
            b19,
            F.new_work(new_boards(1, 19)),
            np.zeros((2, 18, 19, 19), np.float32),
            np.zeros((2, 10), np.float32),
        )
    with pytest.raises(ValueError, match=r"policy must be \[2, T \* T \+ 1\]"):
        F.policy_all(b9, np.zeros((2, 80), np.float32))
    with pytest.raises(ValueError, match=r"policy must be \[2, T \* T \+ 1\]"):
        F.policy_all(b9, np.zeros((1, 82), np.float32))
    with pytest.raises(ValueError, match="a policy over 7x7 cannot hold a 9x9 board"):
        F.policy_all(b9, np.zeros((2, 50), np.float32))


def test_ladder_planes_of_earlier_positions():
    # Black ataris and White extends, still laddered; then White places a ladder breaker.
    game = game_from_diagram(_board(_with(NET, y5=". . . . . X . . .")), to_move=BLACK)
    game.play(BLACK, (5, 4))  # F5: atari
    game.play(WHITE, (4, 5))  # E4: extends to 2 liberties, the ladder still works
    game.play(BLACK, (0, 4))  # A5: elsewhere (3 liberties)
    game.play(WHITE, (1, 7))  # B2: breaks the ladder
    planes, _ = encode_game(game)
    stones = vertices("E5 E4", 9)
    assert points_of(planes[F.LADDERED + 2], 9) == stones  # after E4
    assert points_of(planes[F.LADDERED + 1], 9) == stones  # after A5
    assert points_of(planes[F.LADDERED], 9) == set()  # after the breaker


@pytest.mark.gnugo
@pytest.mark.parametrize(("size", "games"), [(9, 120), (19, 12)])
def test_ladders_agree_with_gnugo_ladder_attack(gnugo_path, size, games):
    """Every chain with 2 liberties in random positions: we say laddered (attacker first) iff
    GNU Go's ladder_attack finds a capture. Results GNU Go marks as kos are skipped. A ladder
    where the defender captures its way into a ko is still read differently (we give kos to
    the defender, as KataGo does; GNU Go does not): about 1 chain in 500 on these positions,
    hence the 1% tolerance."""
    from play.match import GtpClient

    gnu = GtpClient(f"{gnugo_path} --mode gtp --chinese-rules", label="gnugo")
    rng = new_rng(1, size)
    compared = disagreed = 0
    try:
        for i in range(games):
            game = Game(size, PRESETS["simple"])
            commands = [f"boardsize {size}", "clear_board"]
            length = np.random.default_rng(i).integers(10, size * size)
            for _ in range(length):
                colour = game.to_move
                move = game.random_move(colour, rng)
                game.play(colour, move)
                commands.append(f"play {'bw'[colour - 1]} {format_vertex(move, size)}")
                if game.is_over:
                    break
            gnu.send_many(commands)
            laddered, _ = F.ladders_all(game.b)
            b = game.b
            for p in range(b.color.shape[1]):
                if b.color[0, p] not in (BLACK, WHITE) or b.group_head[0, p] != p:
                    continue
                if b.group_libs[0, p] != 2:
                    continue
                answer = gnu.send(f"ladder_attack {format_vertex(point_xy(b.stride, p), size)}")
                code = answer.split()[0]
                if code not in ("0", "1"):
                    continue  # a ko result
                compared += 1
                disagreed += bool(laddered[0, p]) != (code == "1")
    finally:
        gnu.close()
    assert compared > 100
    assert disagreed <= 0.01 * compared, f"{disagreed} of {compared} disagree"


# ---------------------------------------------------------------------------------------------
# Pass-alive area
# ---------------------------------------------------------------------------------------------


def pass_alive(game: Game) -> dict[int, set[str]]:
    area = F.pass_alive_all(game.b)[0]
    s, n = game.b.stride, game.size
    return {
        colour: {format_vertex(point_xy(s, p), n) for p in np.flatnonzero(area & bit)}
        for colour, bit in ((BLACK, F.AREA_BLACK), (WHITE, F.AREA_WHITE))
    }


def test_two_real_eyes_are_pass_alive_with_their_eyes():
    game = game_from_diagram(
        """
        . X . X O . . . .
        X X X X O . . . .
        O O O O O . . . .
        """
        + "\n".join([" ".join("." * 9)] * 6)
    )
    area = pass_alive(game)
    assert area[BLACK] == vertices("A9 B9 C9 D9 A8 B8 C8 D8", 9)
    assert area[WHITE] == set()
    planes, _ = encode_game(game)  # black to move
    assert points_of(planes[F.OWN_PASS_ALIVE], 9) == area[BLACK]
    assert not planes[F.OPPONENT_PASS_ALIVE].any()


def test_a_big_eye_is_not_pass_alive():
    game = game_from_diagram(
        """
        . . . X O . . . .
        X X X X O . . . .
        O O O O O . . . .
        """
        + "\n".join([" ".join("." * 9)] * 6)
    )
    assert pass_alive(game) == {BLACK: set(), WHITE: set()}


def test_seki_is_not_pass_alive():
    game = game_from_diagram(
        """
        . X . O . O X . .
        X X X O O O X . .
        O O O X X X . . .
        """
        + "\n".join([" ".join("." * 9)] * 6)
    )
    assert pass_alive(game) == {BLACK: set(), WHITE: set()}


def test_a_whole_board_of_two_eyed_groups():
    game = game_from_diagram(
        """
        . X O . O
        X X O O O
        . X O . O
        X X O O .
        . X O O O
        """
    )
    area = pass_alive(game)
    # Black: A5, A3, A1 eyes and the black column; White: D5, D3 and E2 eyes.
    assert area[BLACK] == vertices("A5 B5 A4 B4 A3 B3 A2 B2 A1 B1", 5)
    assert area[WHITE] == vertices("C5 D5 E5 C4 D4 E4 C3 D3 E3 C2 D2 E2 C1 D1 E1", 5)


@pytest.mark.parametrize("preset", ["chinese", "tromp-taylor"])
def test_pass_alive_stones_survive_any_attack(preset):
    """Random finished positions; the opponent of each pass-alive colour plays random legal
    moves while its owner passes: no pass-alive stone is ever captured."""
    rng = new_rng(1, 11)
    seen = 0
    for i in range(12):
        game = Game(7, PRESETS[preset])
        while not game.is_over:
            game.play(game.to_move, game.random_move(game.to_move, rng))
        area = pass_alive(game)
        for owner in (BLACK, WHITE):
            stones = {v for v in area[owner] if game.color_at(parse_vertex(v, 7)) == owner}
            if not stones:
                continue
            seen += 1
            attack = game.copy()
            attacker = 3 - owner
            for _ in range(60):
                move = attack.random_move(attacker, rng, avoid_own_eyes=False)
                attack.play(attacker, move)
                attack.play(owner, None)
                assert all(attack.color_at(parse_vertex(v, 7)) == owner for v in stones), i
    assert seen >= 6


# ---------------------------------------------------------------------------------------------
# Symmetries
# ---------------------------------------------------------------------------------------------


def _transformed(game: Game, sym: int) -> Game:
    """The same game with every stone and move moved by symmetry `sym`."""
    n = game.size
    out = Game(n, game.rules)
    for colour, p in game.setup:
        out.add_setup_stones(colour, [F.symmetric_xy(p[0], p[1], n, sym)])
    for colour, move in game.moves:
        out.play(colour, None if move is None else F.symmetric_xy(move[0], move[1], n, sym))
    return out


def _random_game(size: int, moves: int, seed: int) -> Game:
    game = Game(size, PRESETS["chinese"])
    rng = new_rng(1, seed)
    for _ in range(moves):
        game.play(game.to_move, game.random_move(game.to_move, rng))
    return game


@pytest.mark.parametrize("sym", range(8))
def test_encoding_a_transformed_board_equals_transforming_the_encoding(sym):
    for seed, (size, moves, tensor) in enumerate([(9, 50, 9), (7, 30, 9), (9, 70, 11)]):
        game = _random_game(size, moves, seed)
        planes, glob = encode_game(game, 0, tensor)
        moved, moved_glob = encode_game(_transformed(game, sym), 0, tensor)
        expected = F.symmetric_planes(planes, sym, size)
        assert np.array_equal(moved, expected)
        assert np.array_equal(glob, moved_glob)
        direct, _ = encode_game(game, sym, tensor)
        assert np.array_equal(direct, expected)


def test_policy_maps_back_through_the_symmetry():
    size, tensor = 7, 9
    game = _random_game(size, 10, 3)
    b = game.b
    for sym in range(8):
        for x, y in [(0, 0), (1, 2), (6, 3), (5, 6)]:
            sx, sy = F.symmetric_xy(x, y, size, sym)
            policy = np.zeros((1, tensor * tensor + 1), np.float32)
            policy[0, sy * tensor + sx] = 0.75
            policy[0, -1] = 0.25
            out = F.policy_all(b, policy, np.array([sym]))[0]
            assert out[point(b.stride, x, y)] == 0.75
            assert out[PASS] == 0.25 and out.sum() == pytest.approx(1.0)


def test_symmetries_form_the_dihedral_group():
    n = 5
    images = set()
    for sym in range(8):
        mapping = tuple(F.symmetric_xy(x, y, n, sym) for y in range(n) for x in range(n))
        assert sorted(mapping) == sorted((x, y) for y in range(n) for x in range(n))
        images.add(mapping)
    assert len(images) == 8


# ---------------------------------------------------------------------------------------------
# Bit-packing
# ---------------------------------------------------------------------------------------------


def test_bit_packing_round_trips_exactly():
    for size, tensor in [(9, 9), (7, 9), (19, 19), (5, 5)]:
        games = [_random_game(size, m, m) for m in (0, 5, 20)]
        rows = np.concatenate([encode_game(g, 0, tensor)[0][None] for g in games])
        packed = F.pack_planes(rows, size)
        assert packed.dtype == np.uint8 and packed.shape == (3, F.packed_length(size))
        assert np.array_equal(F.unpack_planes(packed, size, tensor), rows)
    assert F.packed_length(19) == 813 and F.packed_length(9) == 183


def test_bit_packing_rejects_bad_input():
    with pytest.raises(ValueError, match="must be 0 or 1"):
        F.pack_planes(np.full((1, 18, 9, 9), 0.5, np.float32), 9)
    with pytest.raises(ValueError, match=r"\[rows, 183\] bytes"):
        F.unpack_planes(np.zeros((2, 100), np.uint8), 9)


def test_work_space_is_reusable_between_calls():
    # Pass-alive area and a ladder-catching move in one position, encoded twice with one work
    # space: nothing of the first call leaks into the second.
    game = game_from_diagram(
        """
        . X . X O . . . .
        X X X X O . . . .
        O O O O O . . . .
        . . . . X . . . .
        . . . X O . . . .
        . . . . . X . . .
        . . . . . . . . .
        . . . . . . . . .
        . . . . . . . . .
        """
    )
    work = F.new_work(game.b)
    results = []
    for _ in range(2):
        planes = np.zeros((1, F.N_PLANES, 9, 9), np.float32)
        glob = np.zeros((1, F.N_GLOBALS), np.float32)
        F.encode_all(game.b, work, planes, glob)
        results.append(planes)
    assert np.array_equal(results[0], results[1])
    # E4 would drive White up into its wall on the 7th line: only F5 catches.
    assert points_of(results[1][0, F.LADDER_CATCH], 9) == vertices("F5", 9)
    assert points_of(results[1][0, F.OWN_PASS_ALIVE], 9) == vertices("A9 B9 C9 D9 A8 B8 C8 D8", 9)


def test_ladders_of_earlier_positions_are_remembered_by_position():
    """The ladders of the positions 1 and 2 turns ago are kept in the work space's memo (a
    search's leaves share them step after step), keyed by the position: the same position is
    served from the memo, another one is read afresh."""
    game = game_from_diagram(_board(_with(NET, y5=". . . . . X . . .")), to_move=BLACK)
    game.play(BLACK, (5, 4))  # F5: atari
    game.play(WHITE, (4, 5))  # E4: extends to 2 liberties, the ladder still works
    game.play(BLACK, (0, 4))  # A5: elsewhere
    work = F.new_work(game.b)

    def encode(w=work) -> np.ndarray:
        planes = np.zeros((1, F.N_PLANES, 9, 9), np.float32)
        F.encode_all(game.b, w, planes, np.zeros((1, F.N_GLOBALS), np.float32))
        return planes[0]

    first = encode()
    assert points_of(first[F.LADDERED + 2], 9) == vertices("E5", 9)  # after F5
    assert points_of(first[F.LADDERED + 1], 9) == vertices("E5 E4", 9)  # after E4
    assert (work.memo_tag[0] >= 0).sum() == 2  # two positions remembered
    # A memo entry that says otherwise is what the encoder uses for its position ...
    work.memo_marks[0] = 0
    again = encode()
    assert points_of(again[F.LADDERED + 2], 9) == set()
    assert points_of(again[F.LADDERED + 1], 9) == set()
    # ... and only for it: after a new move, the position 2 turns ago (after E4) comes from the
    # memo, and so does the one 1 turn ago (after A5): it was the current position of the
    # calls before, whose ladders joined the memo. Nothing was read past the first call.
    game.play(WHITE, (1, 7))  # B2 breaks the ladder
    after = encode()
    assert points_of(after[F.LADDERED + 2], 9) == set()  # the memo's (emptied) entry
    assert points_of(after[F.LADDERED + 1], 9) == vertices("E5 E4", 9)
    assert work.past_reads[0] == 2
    assert points_of(encode(F.new_work(game.b))[F.LADDERED + 2], 9) == vertices("E5 E4", 9)


def test_a_games_leaves_share_one_memo_of_ladders():
    """Rows in groups of `share` (a game's leaves) share a memo, and the positions they encode
    join it: a leaf's position is, at the next call, the position 1 turn ago of its child in
    another row of the group, which then reads no ladders of the past; a row of another group
    reads both. The planes are a fresh work space's, row for row."""
    game = game_from_diagram(_board(_with(NET, y5=". . . . . X . . .")), to_move=BLACK)
    game.play(BLACK, (5, 4))  # F5: atari, E5 laddered
    game.play(WHITE, (4, 5))  # E4: extends to 2 liberties, E5 E4 laddered
    leaf = Boards(*(np.repeat(a, 4, axis=0) if isinstance(a, np.ndarray) else a for a in game.b))
    game.play(BLACK, (0, 4))  # A5: elsewhere
    child = Boards(*(np.repeat(a, 4, axis=0) if isinstance(a, np.ndarray) else a for a in game.b))

    def encode(b, work, which):
        planes = np.zeros((4, F.N_PLANES, 9, 9), np.float32)
        F.encode_some(b, work, np.array(which), planes, np.zeros((4, F.N_GLOBALS), np.float32))
        return planes

    work = F.new_work(leaf, share=2)
    assert work.memo_tag.shape == (2, 2 * F.LADDER_MEMO)
    encode(leaf, work, [True, False, False, False])
    assert work.past_reads.tolist() == [2, 0, 0, 0]  # before F5 and after it
    which = [False, True, True, False]
    got = encode(child, work, which)
    assert work.past_reads.tolist() == [2, 0, 2, 0]  # row 1 shares row 0's memo, row 2 does not
    for row in (1, 2):
        assert points_of(got[row, F.LADDERED + 2], 9) == vertices("E5", 9)  # after F5
        assert points_of(got[row, F.LADDERED + 1], 9) == vertices("E5 E4", 9)  # after E4
    assert np.array_equal(got, encode(child, F.new_work(child), which))
    # The work each child's read is expected to take is what its parent's (the leaf's) took,
    # taken from the memo in row 1 and read anew in row 2: its flood fills.
    parent = Boards(*(a[:1] if isinstance(a, np.ndarray) else a for a in leaf))
    reader = F.new_work(parent)
    F.ladders_all(parent, reader)
    assert reader.mark[0, 0] > 0  # the stamps of its flood fills
    assert work.row_work[1] == work.row_work[2] == reader.mark[0, 0]
    with pytest.raises(ValueError, match="groups of 3"):
        F.new_work(leaf, share=3)


def test_a_rows_expected_work_is_what_encoding_its_parent_takes():
    """row_work is the flood fills the encoder's read of the row's position 1 turn ago takes,
    whether that position joined the memo as a row's current position or was read by remember:
    both read as the encoder does (every catch of the opponent of the player to move tried;
    stopping at the first would take 7 fills here, not 13)."""

    def batch(moves):
        b = new_boards(1, 5, PRESETS["chinese"], max_moves=10)
        for x, y in moves:
            assert play_all(b, np.array([point(b.stride, x, y)]))[0] == 0
        return b

    parent = batch([(1, 3), (0, 4)])  # B2, then White A1 with 2 liberties; Black to move
    child = batch([(1, 3), (0, 4), (4, 0)])  # then Black E5
    reader = F.new_work(parent)
    F.ladders_all(parent, reader)  # catches against White, as the encoder reads it
    assert reader.mark[0, 0] == 13

    def encode(b, work):
        planes = np.zeros((1, F.N_PLANES, 5, 5), np.float32)
        F.encode_all(b, work, planes, np.zeros((1, F.N_GLOBALS), np.float32))

    work = F.new_work(child)  # the parent is read by remember
    encode(child, work)
    assert work.past_reads[0] == 2 and work.row_work[0] == 13
    work = F.new_work(parent)  # the parent is encoded, then its child finds it in the memo
    encode(parent, work)
    assert work.now_work[0] == 13
    encode(child, work)
    assert work.past_reads[0] == 2 and work.row_work[0] == 13


def test_the_encoder_order_puts_the_most_work_first():
    """The GPU's encoder launches the marked rows, the most work expected first (ties in row
    order; past uint16's range, work counts as the most)."""
    which = np.array([True, True, False, True, True, True, True])
    work = np.array([5, 90, 99, 5, 0, 40_000, 33_000], np.int32)
    order = F.encode_order(which, work)
    assert order.dtype == np.int32
    assert order.tolist() == [5, 6, 1, 0, 3, 4]
    work[5], work[6] = 70_000, 80_000  # past uint16's range: a tie, in row order
    assert F.encode_order(which, work).tolist() == [5, 6, 1, 0, 3, 4]
    assert F.encode_order(np.zeros(7, np.bool_), work).tolist() == []


def test_the_ladder_memo_tells_board_sizes_and_kos_apart():
    """The memo's key holds what a ladder read depends on besides the stones: the board's
    size (its edges) and the ko. The same stones on a 9x9 and a 7x7 board (one layout, one
    hash) are two entries; a ko capture and the pass after it (the same stones, the ko lifted)
    are two entries."""
    moves = [(2, 3), (3, 3), (3, 2), (0, 0), (4, 4), (0, 1), (6, 0)]  # a ladder, no captures

    def batch(size):
        b = new_boards(1, size, PRESETS["chinese"], layout=9, max_moves=50)
        for x, y in moves:
            assert play_all(b, np.array([point(b.stride, x, y)]))[0] == 0
        return b

    def encode(b, work):
        planes = np.zeros((1, F.N_PLANES, 9, 9), np.float32)
        F.encode_all(b, work, planes, np.zeros((1, F.N_GLOBALS), np.float32))
        return planes[0]

    nine, seven = batch(9), batch(7)
    assert nine.hash[0] == seven.hash[0]
    work = F.new_work(nine)
    encode(nine, work)
    work.memo_marks[0] = 1  # the 9x9 entries, poisoned: a 7x7 read must not take them
    fresh = encode(seven, F.new_work(seven))
    assert fresh[F.LADDERED + 1].any() and fresh[F.LADDERED + 2].any()
    assert np.array_equal(encode(seven, work), fresh)

    game = ko_position("tromp-taylor")
    game.play(BLACK, (2, 1))  # C4 takes the ko: White may not retake at once
    game.play(WHITE, None)  # a pass lifts the ban: the same stones, no ko
    game.play(BLACK, (4, 4))
    work = F.new_work(game.b)
    encode_game_with = np.zeros((1, F.N_PLANES, 5, 5), np.float32)
    F.encode_all(game.b, work, encode_game_with, np.zeros((1, F.N_GLOBALS), np.float32))
    used = work.memo_tag[0] >= 0
    assert used.sum() == 2  # 2 turns ago (the ko) and 1 turn ago (lifted): not one entry
    assert len(set(work.memo_hash[0][used])) == 1 and len(set(work.memo_tag[0][used])) == 2


def test_a_reused_work_space_encodes_as_a_fresh_one():
    """Random games encoded move after move with one work space, rows in groups of 4 sharing a
    memo, some rows skipped at each call and some moves passes (its memo filling, hitting,
    reading what a skipped row did not encode, and replacing entries): exactly the planes of a
    fresh work space each time."""
    games = 8
    b = new_boards(games, 9, PRESETS["chinese"], max_moves=200)
    work = F.new_work(b, share=4)
    rng = np.random.default_rng(3)
    first_reads = None
    for _ in range(90):
        legal = legal_all(b)
        legal[:, PASS] = False
        moves = np.array([rng.choice(np.flatnonzero(row)) if row.any() else PASS for row in legal])
        moves[rng.random(games) < 0.05] = PASS
        play_all(b, moves)
        which = rng.random(games) < 0.7
        reused = np.zeros((games, F.N_PLANES, 9, 9), np.float32)
        fresh = np.zeros((games, F.N_PLANES, 9, 9), np.float32)
        glob = np.zeros((games, F.N_GLOBALS), np.float32)
        F.encode_some(b, work, which, reused, glob)
        F.encode_some(b, F.new_work(b), which, fresh, glob)
        assert np.array_equal(reused[which], fresh[which])
        if first_reads is None:
            first_reads = work.past_reads.sum()
    assert (work.memo_tag >= 0).all()  # every entry used: 64 a group, 4 rows of 90 positions
    assert work.past_reads.sum() > first_reads  # skipped rows read later
    assert reused[:, F.LADDERED + 1 : F.LADDERED + 3].any()  # some ladders among them


def test_a_ladder_that_needs_a_ko_is_not_counted():
    # From a random game. Black J7 ataris the white stone J8; White captures J7 with H7, and
    # every black atari after that retakes a ko, which the reader gives to the defender (as
    # KataGo does). GNU Go's ladder_attack says "1 J7" here: the one kind of disagreement.
    diagram = """
        . O O O X X X O .
        . . X X X O X X O
        O . O X O O X . .
        . O . . X . . X {j6}
        O O O . . X X X .
        O O O X . . O O X
        O X X X X . O . X
        . O O O X X X X .
        . O . O O . . X .
        """
    j8 = parse_vertex("J8", 9)
    game = game_from_diagram(diagram.format(j6="O"), rules="chinese", to_move=WHITE)
    assert game.liberties(j8) == 2
    laddered, _ = F.ladders_all(game.b)
    assert not laddered[0, point(game.b.stride, *j8)]
    # With a black stone at J6, Black's J7 has two liberties, White has no capture and no ko,
    # and the ladder works.
    game = game_from_diagram(diagram.format(j6="X"), rules="chinese", to_move=WHITE)
    laddered, _ = F.ladders_all(game.b)
    assert laddered[0, point(game.b.stride, *j8)]


def test_the_policy_mask_follows_the_symmetry():
    game = _random_game(7, 25, 4)
    gb_legal = legal_all(game.b)[0]
    stride = game.b.stride
    for sym in range(8):
        legal = F.legal_tensor_all(game.b, 9, np.array([sym]))[0]
        assert legal[-1] == gb_legal[PASS]
        expected = np.zeros(82, np.bool_)
        for p in np.flatnonzero(gb_legal):
            if p == PASS:
                continue
            x, y = point_xy(stride, p)
            sx, sy = F.symmetric_xy(x, y, 7, sym)
            expected[sy * 9 + sx] = True
        assert np.array_equal(legal[:-1], expected[:-1]), sym
