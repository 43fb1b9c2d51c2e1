"""GTP conversations: the required and tournament commands, and bad input of every kind."""

from __future__ import annotations

import os
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gocore.board import BLACK, WHITE
from gocore.rules import PRESETS
from play.gtp import GtpEngine, format_vertex, parse_vertex
from play.players import RandomPlayer
from play.sgf import read_sgf
from tests.conftest import SHARED_SGF, run_cli, tengen_command


@pytest.fixture
def engine():
    return GtpEngine(RandomPlayer(seed=1), rules=PRESETS["tromp-taylor"], size=19)


def talk(engine: GtpEngine, *lines: str) -> list[str]:
    """The responses to each line (None for lines that get none), as strings without the
    trailing blank line."""
    out = []
    for line in lines:
        response = engine.handle(line)
        if response is not None:
            assert response.endswith("\n\n") and "\n\n" not in response[:-2]
            out.append(response[:-2])
    return out


def test_required_commands(engine):
    assert talk(engine, "protocol_version", "name", "version") == ["= 2", "= tengen", "= 0.1.0"]
    assert talk(engine, "known_command play", "known_command fly") == ["= true", "= false"]
    commands = talk(engine, "list_commands")[0][2:].split("\n")
    required = {"protocol_version", "name", "version", "known_command", "list_commands", "quit",
                "boardsize", "clear_board", "komi", "play", "genmove"}  # fmt: skip
    tournament = {"fixed_handicap", "place_free_handicap", "set_free_handicap", "time_settings",
                  "time_left", "final_score", "final_status_list"}  # fmt: skip
    extra = {"loadsgf", "kgs-genmove_cleanup", "showboard", "list_stones", "kata-set-rules", "undo"}
    assert required | tournament | extra <= set(commands)


def test_ids_are_echoed(engine):
    assert talk(engine, "12 name", "13 foo", "14 play black 5E", "15 play black Z25") == [
        "=12 tengen",
        "?13 unknown command",
        "?14 syntax error: invalid vertex '5E'",
        "?15 illegal move: Z25 is off the 19x19 board",
    ]


def test_preprocessing_blank_lines_comments_and_control_characters(engine):
    assert talk(engine, "", "   ", "\t", "# a comment", "name # trailing comment") == ["= tengen"]
    assert talk(engine, "na\x01me\r") == ["= tengen"]
    assert talk(engine, "boardsize\t9") == ["= "]
    assert engine.game.size == 9


def test_play_and_genmove(engine):
    setup = ("boardsize 9", "clear_board", "komi 6.5", "play black D4", "play w pass")
    assert talk(engine, *setup) == ["= "] * 5
    assert engine.game.komi == 6.5
    assert engine.game.color_at(parse_vertex("D4", 9)) == BLACK
    reply = talk(engine, "genmove black")[0]
    assert reply.startswith("= ")
    move = parse_vertex(reply[2:], 9)
    assert engine.game.color_at(move) == BLACK
    assert len(engine.game.moves) == 3


@pytest.mark.parametrize(
    ("line", "answer"),
    [
        ("play black", "? syntax error: usage: play color vertex"),
        ("play purple D4", "? syntax error: invalid color 'purple'"),
        ("play black D", "? syntax error: invalid vertex 'D'"),
        ("play black I5", "? syntax error: invalid vertex 'I5'"),
        ("play black K5", "? illegal move: K5 is off the 9x9 board"),
        ("play black A10", "? illegal move: A10 is off the 9x9 board"),
        ("play black E5", "? illegal move: point occupied"),
        ("boardsize 1", "? unacceptable size (tengen plays 2..19)"),
        ("boardsize 25", "? unacceptable size (tengen plays 2..19)"),
        ("boardsize nine", "? syntax error: board size must be an integer (got 'nine')"),
        ("komi lots", "? syntax error: komi must be a number (got 'lots')"),
        ("komi 6.3", "? syntax error: komi must be a multiple of 0.5 within +-1000 (got 6.3)"),
        ("genmove", "? syntax error: usage: genmove color"),
        ("fixed_handicap 2", "? board not empty"),
        (
            "final_status_list maybe",
            "? syntax error: status must be alive, dead or seki (got 'maybe')",
        ),
        ("loadsgf /no/such/file.sgf", "? cannot load file: /no/such/file.sgf: cannot read"),
        ("kata-set-rules chess", "? unknown rules 'chess'"),
        ("frobnicate", "? unknown command"),
    ],
)
def test_bad_input_gets_the_right_error_and_changes_nothing(engine, line, answer):
    talk(engine, "boardsize 9", "play black E5", "play white C3")
    before = (engine.game.hash, list(engine.game.moves), engine.game.size, engine.game.komi)
    reply = talk(engine, line)[0]
    assert reply.startswith(answer), reply
    assert (engine.game.hash, engine.game.moves, engine.game.size, engine.game.komi) == before


def test_illegal_moves_by_rule(engine):
    talk(engine, "boardsize 5", "clear_board")
    for move in ("black B5", "white C5", "black A4", "white D4", "black B3", "white C3",
                 "black C4", "white B4"):  # fmt: skip
        assert talk(engine, f"play {move}") == ["= "]
    # White's B4 took the ko at C4: Black may not take back at once.
    assert talk(engine, "play black C4") == ["? illegal move: ko"]
    assert talk(engine, "is_legal black C4", "is_legal black A1", "is_legal black Z9") == [
        "= 0", "= 1", "= 0",
    ]  # fmt: skip
    assert talk(engine, "is_legal black 9Z") == ["? syntax error: invalid vertex '9Z'"]
    assert talk(engine, "kata-set-rules chinese") == ["= "]  # replayed: the ko ban stays
    assert talk(engine, "play black C4") == ["? illegal move: ko"]
    talk(engine, "play black D1", "play black E2")
    assert talk(engine, "play white E1") == ["? illegal move: suicide"]
    assert talk(engine, "play black C4") == ["= "]  # the ban has expired


def test_fixed_and_free_handicap(engine):
    assert talk(engine, "boardsize 19", "fixed_handicap 9") == [
        "= ",
        "= D4 Q16 D16 Q4 D10 Q10 K16 K4 K10",
    ]
    assert talk(engine, "list_stones black") == ["= D16 K16 Q16 D10 K10 Q10 D4 K4 Q4"]
    assert engine.game.to_move == WHITE and not engine.game.moves
    assert talk(engine, "fixed_handicap 4") == ["? board not empty"]
    engine.handle("clear_board")
    assert talk(engine, "fixed_handicap 1")[0].startswith("? invalid number of stones")
    assert talk(engine, "fixed_handicap 10")[0].startswith("? invalid number of stones")
    placed = talk(engine, "place_free_handicap 12")[0][2:].split()
    assert len(placed) == len(set(placed)) == 12
    assert set(placed) >= {"D4", "Q16", "D16", "Q4", "K10"}  # the fixed layout first
    engine.handle("clear_board")
    assert talk(engine, "set_free_handicap D4 D4") == [
        "? bad vertex list: 'D4' is a pass or repeated"
    ]
    assert talk(engine, "set_free_handicap D4") == ["? invalid number of stones (2..360 on 19x19)"]
    assert talk(engine, "set_free_handicap D4 pass")[0].startswith("? bad vertex list")
    assert engine.game.is_empty()
    assert talk(engine, "set_free_handicap D4 Q16 K10") == ["= "]
    assert talk(engine, "list_stones black") == ["= Q16 K10 D4"]


def test_time_commands(engine):
    assert talk(engine, "time_settings 300 30 5", "time_left black 120 3") == ["= ", "= "]
    assert engine.time_settings == (300, 30, 5) and engine.time_left[BLACK] == (120, 3)
    assert talk(engine, "time_settings 300 30")[0].startswith("? syntax error")
    assert talk(engine, "time_left purple 1 1")[0].startswith("? syntax error")


def test_final_score_and_status_after_a_played_out_game(engine):
    talk(engine, "boardsize 7", "komi 0.5", "set_random_seed 5")
    passes = 0
    while passes < 2:
        colour = "black" if engine.game.to_move == BLACK else "white"
        reply = talk(engine, f"genmove {colour}")[0]
        passes = passes + 1 if reply == "= pass" else 0
    # Played out by the random player: only eyes are left, no dead stones.
    assert talk(engine, "final_status_list dead") == ["= "]
    alive = talk(engine, "final_status_list alive")[0][2:].split()
    assert len(alive) == len(engine.game.stones(BLACK)) + len(engine.game.stones(WHITE))
    score = engine.game.score()
    expected = "0" if score == 0 else f"{'B' if score > 0 else 'W'}+{abs(score):g}"
    assert talk(engine, "final_score") == [f"= {expected}"]


def test_dead_stones_are_found_and_scored(engine):
    # A black stone in atari inside White's area, unable to escape: dead. White owns all 25.
    talk(engine, "boardsize 5", "komi 0.5", "play black D3")
    white = "B5 D5 A4 B4 C4 D4 E4 A3 B3 E3 A2 C2 D2 E2 B1 D1"
    for vertex in white.split():
        assert talk(engine, f"play white {vertex}") == ["= "]
    assert talk(engine, "final_status_list dead") == ["= D3"]
    assert talk(engine, "final_score") == ["= W+25.5"]
    alive = talk(engine, "final_status_list alive")[0][2:].split("\n")
    assert sorted(v for line in alive for v in line.split()) == sorted(white.split())


def test_loadsgf_and_showboard(engine):
    path = SHARED_SGF / "golaxy-fineart-2018-final1.sgf"
    assert talk(engine, f"loadsgf {path} 11") == ["= "]
    assert len(engine.game.moves) == 10
    assert talk(engine, f"loadsgf {path}") == ["= "]
    assert len(engine.game.moves) == len(read_sgf(path).moves)
    board = talk(engine, "showboard")[0]
    assert board.startswith("= \n   A B C D E F G H J K L M N O P Q R S T")
    assert "captures B 9 W 11" in board
    sgf = talk(engine, "printsgf")[0][2:]
    assert sgf.startswith("(;FF[4]")


def test_undo(engine):
    talk(engine, "boardsize 9", "play black C3", "play white D4")
    assert talk(engine, "undo") == ["= "]
    assert engine.game.moves == [(BLACK, (2, 6))] and engine.game.to_move == WHITE
    talk(engine, "undo")
    assert talk(engine, "undo") == ["? cannot undo"]


def test_kata_rules_round_trip(engine):
    talk(engine, "kata-set-rules japanese")
    assert (
        talk(engine, "kata-get-rules")[0]
        == '= {"ko": "SIMPLE", "scoring": "TERRITORY", "suicide": false, "komi": 7.5}'
    )
    talk(engine, "kata-set-rules koPOSITIONALscoreAREAsui1")
    assert engine.game.rules == PRESETS["tromp-taylor"]


def test_quit_stops_the_loop(engine):
    import io

    out = io.StringIO()
    engine.serve(io.StringIO("name\nquit\nname\n"), out)
    assert out.getvalue() == "= tengen\n\n= \n\n"


def test_vertex_helpers():
    assert parse_vertex("A1", 19) == (0, 18) and parse_vertex("t19", 19) == (18, 0)
    assert parse_vertex("J9", 9) == (8, 0) and parse_vertex("PASS", 9) is None
    assert format_vertex((8, 0), 9) == "J9" and format_vertex(None, 9) == "pass"


def test_the_cli_engine_speaks_gtp():
    """The real `tengen gtp` process: a whole conversation over pipes."""
    script = (
        "1 protocol_version\n2 boardsize 9\n3 genmove b\n4 play w A1\n5 play w A1\nfoo\n6 quit\n"
    )
    result = run_cli("gtp", "--seed", "3", input=script)
    assert result.returncode == 0, result.stderr
    blocks = result.stdout.split("\n\n")
    assert blocks[0] == "=1 2" and blocks[1] == "=2 "
    assert blocks[2].startswith("=3 ") and parse_vertex(blocks[2][3:], 9) is not None
    assert blocks[3] == "=4 " and blocks[4] == "?5 illegal move: point occupied"
    assert blocks[5] == "? unknown command" and blocks[6] == "=6 "


def test_the_cli_engine_survives_garbage():
    garbage = "\x00\x01\x02\n" + "play " * 1000 + "\n" + "genmove\n" * 3 + "\xff\xfe name\nname\n"
    env = {**os.environ, "LC_ALL": "C.UTF-8", "PYTHONIOENCODING": ""}
    proc = subprocess.run(
        tengen_command().split(), input=garbage.encode("utf-8", "surrogateescape"),
        capture_output=True, timeout=120, env=env,
    )  # fmt: skip
    assert proc.returncode == 0
    assert proc.stdout.decode().rstrip().endswith("= tengen")


def test_loadsgf_refuses_what_is_not_a_game_record_and_bad_move_numbers(engine, tmp_path):
    record = SHARED_SGF / "fanhui-alphago-2015-g1.sgf"
    moves = len(read_sgf(record).moves)
    before = talk(engine, "komi 6.5", "printsgf")[1]
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for bad, message in (
        (f"loadsgf {fifo}", "not a regular file"),
        ("loadsgf /dev/zero", "not a regular file"),
        (f"loadsgf {tmp_path}", "cannot read"),
        (f"loadsgf {record} -3", "move number must be >= 1"),
        (f"loadsgf {record} 0", "move number must be >= 1"),
        (f"loadsgf {record} {moves + 2}", f"no move {moves + 2}: the game has {moves}"),
    ):
        [answer] = talk(engine, bad)
        assert answer.startswith("? ") and message in answer, (bad, answer)
        assert talk(engine, "printsgf") == [before], bad  # the game is as it was
    big = tmp_path / "big.sgf"
    big.write_bytes(b"(;SZ[9]" + b" " * (9 << 20) + b")")
    assert "larger than 8 MB" in talk(engine, f"loadsgf {big}")[0]
    # The last move number there is: the position after every move.
    assert talk(engine, f"loadsgf {record} {moves + 1}") == ["= "]
    # A file without KM[] keeps the engine's komi; one with KM[] sets it.
    bare = tmp_path / "bare.sgf"
    bare.write_text("(;GM[1]FF[4]SZ[9];B[ee];W[cc])")
    assert talk(engine, "komi 3.5", f"loadsgf {bare}") == ["= ", "= "]
    assert engine.game.komi == 3.5 and "KM[3.5]" in talk(engine, "printsgf")[0]
    bare.write_text("(;GM[1]FF[4]SZ[9]KM[0.5];B[ee])")
    assert talk(engine, f"loadsgf {bare}") == ["= "] and engine.game.komi == 0.5


def _state(engine: GtpEngine) -> tuple:
    g = engine.game
    return (g.size, g.komi, g.to_move, g.board().tobytes(), list(g.moves), dict(g.captures))


COMMAND_WORDS = [
    "play", "genmove", "boardsize", "komi", "loadsgf", "undo", "fixed_handicap",
    "place_free_handicap", "set_free_handicap", "time_settings", "kgs-time_settings",
    "time_left", "final_score", "final_status_list", "is_legal", "list_stones",
    "clear_board", "showboard", "printsgf", "known_command", "reg_genmove", "kgs-genmove_cleanup",
    "kata-set-rules", "all_legal", "captures", "set_random_seed",
]  # fmt: skip
WORDS = ["b", "w", "black", "white", "pass", "resign", "a1", "t19", "j9", "z9", "d4", "-1", "0",
         "1", "7.5", "nan", "inf", "1e308", "99999999999999999999", "dead", "alive", "\x00", "",
         "none", "absolute", "canadian", "byoyomi", "chinese", "japanese"]  # fmt: skip


@given(
    line=st.one_of(
        st.text(max_size=60),
        st.tuples(
            st.one_of(st.none(), st.integers(0, 10**6)),
            st.sampled_from(COMMAND_WORDS),
            st.lists(st.one_of(st.sampled_from(WORDS), st.text(max_size=8)), max_size=4),
        ).map(lambda t: " ".join(([str(t[0])] if t[0] is not None else []) + [t[1], *t[2]])),
    )
)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_fuzzed_gtp_lines_always_get_an_answer_and_a_refusal_changes_nothing(line):
    """Random and half-right command lines: the engine always answers (= or ?), never dies,
    and a `?` leaves the game as it was."""
    engine = _FUZZ_ENGINE
    before = _state(engine)
    response = engine.handle(line)
    if response is None:
        return
    assert response.endswith("\n\n") and response[0] in "=?", (line, response)
    if response.startswith("?"):
        assert _state(engine) == before, (line, response)
    assert engine.handle("protocol_version") == "= 2\n\n"


_FUZZ_ENGINE = GtpEngine(RandomPlayer(seed=3), rules=PRESETS["chinese"], size=9,
                         dead_stone_playouts=4)  # fmt: skip


@given(data=st.data())
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
          HealthCheck.function_scoped_fixture])  # fmt: skip
def test_fuzzed_sgf_files_load_or_are_refused_and_a_refusal_changes_nothing(data, tmp_path):
    """Real game records cut short, with bytes changed or inserted: `loadsgf` loads them or
    answers `?`, and the engine goes on."""
    source = data.draw(st.sampled_from(sorted(SHARED_SGF.glob("*.sgf"))))
    raw = bytearray(source.read_bytes())
    for _ in range(data.draw(st.integers(0, 6))):
        at = data.draw(st.integers(0, len(raw) - 1))
        kind = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        if kind == "flip":
            raw[at] = data.draw(st.integers(0, 255))
        elif kind == "cut":
            del raw[at:]
            if not raw:
                break
        else:
            raw[at:at] = data.draw(st.sampled_from([b"(", b")", b";", b"[", b"]", b"\\", b"B[zz]",
                                                    b"SZ[25]", b"KM[x]", b"AB[aa]"]))  # fmt: skip
    path = tmp_path / "fuzzed.sgf"
    path.write_bytes(bytes(raw))
    engine = GtpEngine(RandomPlayer(seed=3), rules=PRESETS["chinese"], size=19)
    engine.handle("play b d4")
    before = _state(engine)
    number = data.draw(st.one_of(st.none(), st.integers(-2, 400)))
    response = engine.handle(f"loadsgf {path}" + ("" if number is None else f" {number}"))
    assert response[0] in "=?" and response.endswith("\n\n")
    if response.startswith("?"):
        assert _state(engine) == before
    assert engine.handle("genmove b")[0] == "="
