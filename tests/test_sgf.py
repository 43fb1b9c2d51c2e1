"""SGF: the real game records replay, records round-trip, bad files get errors naming the place."""

from __future__ import annotations

import pytest

from gocore.board import BLACK, WHITE
from gocore.rules import PRESETS
from play.game import Game
from play.sgf import (
    GameRecord,
    SgfError,
    parse_sgf,
    read_sgf,
    record_from_game,
    replay,
    save_sgf,
    write_sgf,
)
from tests.conftest import SHARED_SGF

RECORDS = sorted(SHARED_SGF.glob("*.sgf"))


def test_the_shared_records_are_there():
    assert len(RECORDS) >= 3, f"expected the real game records in {SHARED_SGF}"


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.name)
def test_real_records_replay_without_an_illegal_move(path):
    record = read_sgf(path)
    assert record.size == 19 and len(record.moves) > 150
    game = replay(record)
    assert len(game.moves) == len(record.moves)
    # The records are strict alternation from Black, as real games are.
    assert [c for c, _ in record.moves[:4]] == [BLACK, WHITE, BLACK, WHITE]
    # They hold captures, so replay exercised more than stone placement.
    assert sum(game.captures.values()) > 0


def test_real_record_details():
    golaxy = read_sgf(SHARED_SGF / "golaxy-fineart-2018-final1.sgf")
    assert (golaxy.komi, golaxy.rules, golaxy.result) == (7.5, "Chinese", "W+R")
    assert (golaxy.black, golaxy.white) == ("Golaxy", "FineArt")
    assert golaxy.extra["GN"][0].startswith("2018腾讯")  # UTF-8 game name kept
    assert golaxy.moves[0] == (BLACK, (16, 3))  # B[qd]
    fanhui = read_sgf(SHARED_SGF / "fanhui-alphago-2015-g1.sgf")
    assert fanhui.komi == 7.5  # written as the non-standard KO[7.5]
    assert fanhui.result == "B+R"
    selfplay = read_sgf(SHARED_SGF / "alphago-selfplay-2016-g1.sgf")
    assert selfplay.result == "W+2.50" and selfplay.first_player == BLACK


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.name)
def test_records_round_trip(path, tmp_path):
    record = read_sgf(path)
    again = parse_sgf(write_sgf(record))
    for field in ("size", "komi", "rules", "moves", "result", "black", "white", "extra"):
        assert getattr(again, field) == getattr(record, field), field
    saved = save_sgf(record, tmp_path / "sub" / "copy.sgf")
    assert read_sgf(saved).moves == record.moves
    assert not list((tmp_path / "sub").glob(".*tmp"))  # the temporary file was renamed away


def test_passes_both_ways_and_handicap_setup():
    record = parse_sgf(
        b"(;GM[1]FF[4]SZ[9]KM[0.5]HA[2]AB[cg][gc]PL[W];W[ee];B[];W[tt];B[dd])", source="h.sgf"
    )
    assert record.handicap == 2 and record.first_player == WHITE
    assert record.setup == [(BLACK, (2, 6)), (BLACK, (6, 2))]
    assert record.moves == [(WHITE, (4, 4)), (BLACK, None), (WHITE, None), (BLACK, (3, 3))]
    game = replay(record)
    assert len(game.stones(BLACK)) == 3 and game.passes == 0
    out = write_sgf(record)
    assert b"AB[cg][gc]" in out and b"HA[2]" in out and b"B[]" in out


def test_game_record_from_a_game_round_trips():
    game = Game(9, PRESETS["japanese"])
    game.add_setup_stones(BLACK, [(2, 2)])
    game.set_to_move(WHITE)
    for colour, move in ((WHITE, (4, 4)), (BLACK, None), (WHITE, (3, 3))):
        game.play(colour, move)
    record = record_from_game(game, result="W+R", comments=["first", None, "last"])
    again = parse_sgf(write_sgf(record))
    assert again.rules == "japanese" and again.komi == 6.5
    assert again.moves == game.moves and again.comments == ["first", None, "last"]
    assert replay(again).hash == game.hash


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"(;GM[1]SZ[9];B[ee", "malformed SGF"),
        (b"no sgf here", "malformed SGF"),
        (b"(;SZ[30])", "size"),
        (b"(;SZ[1])", "size"),
        (b"(;SZ[9]KM[seven])", "bad komi KM[seven]"),
        (b"(;SZ[9];B[zz])", "node 1: bad move B[zz]"),
        (b"(;SZ[9];B[aa];W[ab]AB[cc])", "node 2 adds or removes stones"),
        (b"(;SZ[9]HA[x])", "bad HA"),
    ],
)
def test_malformed_records_name_the_file_and_the_problem(data, message):
    with pytest.raises(
        SgfError, match="^bad.sgf: .*" + message.replace("[", r"\[").replace("]", r"\]")
    ):
        parse_sgf(data, source="bad.sgf")


def test_an_illegal_move_names_its_number(tmp_path):
    path = tmp_path / "illegal.sgf"
    path.write_bytes(b"(;GM[1]FF[4]SZ[9];B[ee];W[dd];B[ee])")
    with pytest.raises(SgfError, match=r"illegal.sgf: move 3 \(B ee\) is illegal: point occupied"):
        replay(read_sgf(path))
    ko = b"(;SZ[5];B[ba];W[ca];B[ab];W[db];B[bc];W[cc];B[cb];W[bb];B[cb])"
    with pytest.raises(SgfError, match=r"move 9 \(B cb\) is illegal: ko"):
        replay(parse_sgf(ko, source="ko.sgf"))


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(SgfError, match="nope.sgf: cannot read"):
        read_sgf(tmp_path / "nope.sgf")


def test_replay_up_to_a_move():
    record = read_sgf(RECORDS[0])
    assert len(replay(record, upto=10).moves) == 10
    assert isinstance(record, GameRecord)
