"""`tengen gtp --model`: a net with the search through whole GTP conversations (both colours,
undo, loadsgf, handicap, a clock near zero), the analysis extensions parsed by a parser
written from KataGo's docs/GTP_Extensions.md, and the player's own judgement of dead stones."""

from __future__ import annotations

import queue
import re
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

from gocore.board import BLACK, WHITE
from gocore.rules import PRESETS
from nets.checkpoint import save
from nets.config import net_config
from nets.model import GoNet
from play.game import Game
from play.gtp import GtpEngine, parse_vertex
from play.match import GtpClient
from play.netplayer import NetPlayer
from play.sgf import read_sgf, replay
from stages.params import MatchSearchSection
from tests.conftest import PUCT_ROOT, REPO, SHARED_SGF, game_from_diagram

torch.set_num_threads(1)

SEARCH = MatchSearchSection(
    c_puct=1.1,
    puct_exponent=0.5,
    fpu_reduction=0.2,
    virtual_loss=1.0,
    score_utility=0.5,
    **PUCT_ROOT,
).params()
# What every NetPlayer here plays with: the search above, two leaves a batch.
ENGINE = dict(params=SEARCH, leaves_per_game=2)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("net") / "tiny.pt"
    return save(GoNet(net_config("b2c16")), path, {"model_id": "tiny"})


def engine_command(model, *extra: str) -> str:
    return f"{sys.executable} -m flows.cli gtp --model {model} --rules chinese " + " ".join(extra)


# -- a parser for the analysis lines, written from KataGo's docs/GTP_Extensions.md -----------

KATA_FLOATS = {"utility", "winrate", "scoreMean", "scoreStdev", "scoreLead", "scoreSelfplay",
               "prior", "lcb", "utilityLcb"}  # fmt: skip


def parse_analysis(line: str, *, size: int, kata: bool) -> tuple[list[dict], list[float] | None]:
    """One analysis line: `info` starts each move, followed by key-value pairs in any order,
    `pv` taking the rest of the move's tokens; `ownership` (kata only) takes size * size
    floats. lz fields are integers (10000 x probabilities)."""
    tokens = line.split()
    moves: list[dict] = []
    ownership = None
    i = 0
    while i < len(tokens):
        word = tokens[i]
        if word == "info":
            moves.append({})
            i += 1
        elif word == "ownership":
            assert kata, "lz-analyze has no ownership"
            ownership = [float(t) for t in tokens[i + 1 : i + 1 + size * size]]
            assert len(ownership) == size * size
            i += 1 + size * size
        elif word == "pv":
            j = i + 1
            while j < len(tokens) and tokens[j] not in ("info", "ownership"):
                j += 1
            moves[-1]["pv"] = tokens[i + 1 : j]
            i = j
        else:
            key, value = word, tokens[i + 1]
            if key in ("visits", "order"):
                moves[-1][key] = int(value)
            elif key == "move":
                moves[-1][key] = value
            elif kata and key in KATA_FLOATS:
                moves[-1][key] = float(value)
            elif not kata and key in ("winrate", "prior", "lcb"):
                assert re.fullmatch(r"\d+", value), f"lz {key} must be an integer: {value}"
                moves[-1][key] = int(value)
            i += 2
    for m in moves:
        assert parse_vertex(m["move"], size) is not None or m["move"] == "pass"
    return moves, ownership


def check_analysis(moves: list[dict], *, kata: bool) -> None:
    assert moves, "no move in the analysis line"
    assert [m["order"] for m in moves] == list(range(len(moves)))
    visits = [m["visits"] for m in moves]
    assert visits == sorted(visits, reverse=True) and visits[0] > 0
    top = 1.0 if kata else 10000
    for m in moves:
        assert 0 <= m["winrate"] <= top and 0 <= m["prior"] <= top and m["lcb"] <= m["winrate"]
        assert m["pv"][0] == m["move"]
        if kata:
            assert m["scoreMean"] == m["scoreLead"]


class Engine:
    """`tengen gtp` in a subprocess, its output read line by line with arrival times."""

    def __init__(self, command: str):
        self.proc = subprocess.Popen(
            command.split(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True, bufsize=1, cwd=REPO,
        )  # fmt: skip
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def send(self, text: str) -> None:
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def response(self, timeout: float = 120) -> list[str]:
        """The lines of the next response, up to its blank line."""
        out = []
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                pytest.fail(f"no complete response within {timeout} s; got {out}")
            if line == "" and out:
                return out
            if line != "" or out:
                out.append(line)

    def close(self) -> None:
        self.send("quit")
        self.proc.wait(timeout=30)


@pytest.mark.slow
def test_a_whole_conversation_with_the_net(tiny):
    """genmove for both colours, undo, a handicap game, a loaded SGF, and a clock near zero:
    every move legal (replayed by our own rules), every answer in time."""
    client = GtpClient(engine_command(tiny, "--visits", "24"), label="net", timeout=120)
    try:
        assert client.name.startswith("tengen") and "tiny" in client.name
        game = Game(7, PRESETS["chinese"])
        client.send("boardsize 7")
        client.send("clear_board")
        for color in (BLACK, WHITE, BLACK, WHITE):
            reply = client.send(f"genmove {'b' if color == BLACK else 'w'}")
            game.play(color, parse_vertex(reply, 7))
        client.send("undo")
        game.undo()
        # The colour not to move (White is): Black again, as a GUI may ask.
        reply = client.send("genmove b")
        game.play(BLACK, parse_vertex(reply, 7))
        assert client.send("list_stones black").split() != []

        client.send("boardsize 9")
        client.send("clear_board")
        assert sorted(client.send("fixed_handicap 2").split()) == ["C3", "G7"]
        reply = client.send("genmove w")
        assert parse_vertex(reply, 9) not in ((6, 2), (2, 6))  # not on a handicap stone

        record = SHARED_SGF / "fanhui-alphago-2015-g1.sgf"
        client.send(f"loadsgf {record} 40")
        loaded = replay(read_sgf(record), upto=39)
        reply = client.send("genmove " + ("b" if loaded.to_move == BLACK else "w"))
        loaded.play(loaded.to_move, parse_vertex(reply, 19))

        # One second left for the rest of the game: still a move (its budget is checked
        # against hand values in test_time_shares_against_hand_values).
        client.send("boardsize 9")
        client.send("clear_board")
        client.send("time_settings 60 0 0")
        client.send("time_left b 1 0")
        reply = client.send("genmove b")
        assert parse_vertex(reply, 9) is not None or reply == "pass"
        # A game already over (two passes) still gets a move.
        client.send("play w pass")
        client.send("play b pass")
        reply = client.send("genmove w")
        assert reply == "pass" or parse_vertex(reply, 9) is not None
        # Scoring by the net's ownership head: the three lists cover every stone once.
        stones = set(
            client.send("list_stones black").split() + client.send("list_stones white").split()
        )
        listed = []
        for status in ("alive", "dead", "seki"):
            listed += client.send(f"final_status_list {status}").split()
        assert sorted(listed) == sorted(stones)
        assert re.fullmatch(r"0|[BW]\+\d+(\.5)?", client.send("final_score"))
    finally:
        client.close()


def test_time_shares_against_hand_values(tiny):
    from play.models import load_evaluator

    net, _ = load_evaluator(tiny)
    engine = GtpEngine(NetPlayer(net, **ENGINE, visits=8), rules=PRESETS["chinese"], size=9)
    assert engine.move_seconds(BLACK) is None  # no time settings: no limit
    engine.handle("time_settings 0 30 5")  # Canadian: 30 s for 5 stones from the start
    assert engine.move_seconds(BLACK) == pytest.approx(0.8 * 30 / 5)
    engine.handle("time_left b 10 2")
    assert engine.move_seconds(BLACK) == pytest.approx(0.8 * 10 / 2)
    engine.handle("time_settings 81 0 0")  # absolute: 81 s for the game, 40.5 moves left
    assert engine.move_seconds(BLACK) == pytest.approx(81 / 40.5)
    engine.handle("time_left w 0.2 0")  # nearly out: nothing left to spend
    assert engine.move_seconds(WHITE) == 0.0
    engine.handle("time_settings 0 5 0")  # GTP: byo-yomi time with no stones is no limit
    assert engine.move_seconds(BLACK) is None
    engine.handle("kgs-time_settings byoyomi 0 10 3")  # Japanese: each move has a 10 s period
    engine.handle("time_left b 10 3")
    assert engine.move_seconds(BLACK) == pytest.approx(8.0)
    assert engine.handle("kgs-time_settings hourglass 5").startswith("? syntax error")
    assert engine.handle("time_left b -3 0").startswith("? syntax error")


@pytest.mark.slow
def test_lz_and_kata_analyze_stream_until_the_next_command(tiny):
    engine = Engine(engine_command(tiny))
    try:
        engine.send("boardsize 9")
        assert engine.response() == ["= "]
        engine.send("play b E5")
        engine.response()
        for command, kata in (("lz-analyze 10", False), ("kata-analyze 10 ownership true", True)):
            engine.send(command)
            first = engine.lines.get(timeout=120)
            assert first == "="
            # Three lines (the first search loads the compiled kernels), then the next command.
            body = [engine.lines.get(timeout=120) for _ in range(3)]
            engine.send("name")
            # The stream's rest up to its blank line, which may come at once (`name` arrived
            # before a fourth line: Engine.response would skip that leading blank line).
            while (line := engine.lines.get(timeout=120)) != "":
                body.append(line)
            assert engine.response() == ["= tengen"]  # the next command, answered after
            assert len(body) >= 3, body  # a line every 0.1 s
            visits = []
            for line in body:
                moves, ownership = parse_analysis(line, size=9, kata=kata)
                check_analysis(moves, kata=kata)
                assert "E5" not in [m["move"] for m in moves]  # occupied
                visits.append(sum(m["visits"] for m in moves))
                if kata:
                    assert ownership is not None and all(-1 <= v <= 1 for v in ownership)
            assert visits == sorted(visits) and visits[-1] > visits[0]  # it goes on searching
        # A blank line ends an analysis too.
        engine.send("lz-analyze 20")
        assert engine.lines.get(timeout=60) == "="
        time.sleep(0.5)
        engine.send("")
        engine.response()
        engine.send("protocol_version")
        assert engine.response() == ["= 2"]
    finally:
        engine.close()


def test_genmove_analyze_and_raw_nn(tiny):
    from play.models import load_evaluator

    net, _ = load_evaluator(tiny)
    player = NetPlayer(net, **ENGINE, visits=64)
    engine = GtpEngine(player, rules=PRESETS["chinese"], size=9)
    for command, kata in (("lz-genmove_analyze b 1", False), ("kata-genmove_analyze w 1", True)):
        response = engine.handle(command)
        lines = response.strip("\n").split("\n")
        assert lines[0] == "=" and lines[-1].startswith("play ")
        for line in lines[1:-1]:
            check_analysis(parse_analysis(line, size=9, kata=kata)[0], kata=kata)
    assert len(engine.game.moves) == 2  # both moves were played
    raw = engine.handle("kata-raw-nn 0")[2:].split()
    values = {}
    i = 0
    while i < len(raw):
        key = raw[i]
        count = 81 if key in ("policy", "whiteOwnership") else 1
        values[key] = raw[i + 1 : i + 1 + count]
        i += 1 + count
    assert set(values) >= {"symmetry", "whiteWin", "whiteLoss", "noResult", "whiteLead",
                           "policy", "policyPass", "whiteOwnership"}  # fmt: skip
    policy = np.array([float(v) for v in values["policy"]])
    assert np.isnan(policy).sum() == 2  # the two stones
    total = np.nansum(policy) + float(values["policyPass"][0])
    assert total == pytest.approx(1.0, abs=1e-4)
    win = float(values["whiteWin"][0]) + float(values["whiteLoss"][0])
    assert win + float(values["noResult"][0]) == pytest.approx(1.0, abs=1e-4)
    assert engine.handle("kata-raw-nn 9").startswith("? syntax error")
    assert len(engine.handle("kata-raw-nn all").split("symmetry")) == 9


class MajorityNet:
    """A stand-in net whose ownership says the side with more stones owns the whole board
    (the same under every symmetry), with a uniform policy and an even game."""

    def __call__(self, planes, glob, *, legal):
        b = len(planes)
        own = planes[:, 1].sum(axis=(1, 2)) - planes[:, 2].sum(axis=(1, 2))
        ownership = np.broadcast_to(np.sign(own)[:, None, None], planes[:, 0].shape)
        policy = legal / legal.sum(axis=1, keepdims=True)
        value = np.tile(np.array([0.5, 0.5, 0.0], np.float32), (b, 1))
        return {"policy": policy.astype(np.float32), "value": value,
                "score_mean": np.zeros(b, np.float32), "score_stdev": np.ones(b, np.float32),
                "ownership": (ownership * planes[:, 0]).astype(np.float32)}  # fmt: skip


DEAD_WHITE = """
    . X . . .
    X X X X X
    . X O . .
    X X . . X
    . X . X .
"""


def test_dead_stones_and_score_from_the_ownership_head():
    game = game_from_diagram(DEAD_WHITE, rules="chinese", to_move=WHITE)
    engine = GtpEngine(NetPlayer(MajorityNet(), **ENGINE, visits=8), rules=PRESETS["chinese"],
                       size=5)  # fmt: skip
    engine.game = game
    assert engine.handle("final_status_list dead") == "= C3\n\n"
    assert engine.handle("final_status_list seki") == "= \n\n"
    # Black's 25 points minus komi 7.5, the white stone counted dead.
    assert engine.handle("final_score") == "= B+17.5\n\n"


def test_cleanup_captures_dead_stones_before_passing():
    """kgs-genmove_cleanup: Black does not pass while the net judges a white stone dead; it
    fills that stone's liberties until it is captured."""
    game = game_from_diagram(DEAD_WHITE, rules="chinese", to_move=BLACK)
    engine = GtpEngine(NetPlayer(MajorityNet(), **ENGINE, visits=32), rules=PRESETS["chinese"],
                       size=5)  # fmt: skip
    engine.game = game
    for _ in range(6):
        if not engine.game.stones(WHITE):
            break
        reply = engine.handle("kgs-genmove_cleanup b")
        assert reply != "= pass\n\n"
        engine.handle("play w pass")
    assert not engine.game.stones(WHITE)


class BlackLosesNet(MajorityNet):
    """Sure that Black loses, whoever is to move (global input 5 is the komi from the mover's
    side: negative for Black)."""

    def __call__(self, planes, glob, *, legal):
        out = super().__call__(planes, glob, legal=legal)
        black = glob[:, 5] < 0
        out["value"] = np.where(black[:, None], [[0.01, 0.99, 0.0]], [[0.99, 0.01, 0.0]])
        out["value"] = out["value"].astype(np.float32)
        return out


def test_resignation_is_an_option_after_some_moves():
    game = Game(5, PRESETS["chinese"])
    keeps_on = NetPlayer(BlackLosesNet(), **ENGINE, visits=16)
    resigns = NetPlayer(
        BlackLosesNet(),
        params=SEARCH,
        leaves_per_game=2,
        visits=16,
        resign_below=0.05,
        resign_after=2,
    )
    assert resigns.genmove(game, BLACK) != "resign"  # move 0: too early
    game.play(BLACK, (2, 2))
    game.play(WHITE, (1, 1))
    assert resigns.genmove(game, BLACK) == "resign"
    assert keeps_on.genmove(game, BLACK) != "resign"


def test_a_spent_clock_still_gets_the_policys_move(tiny):
    """A budget already spent ends the search after the root's own evaluation (one visit):
    the move is the policy's favourite among the legal moves, not a pass for want of a
    search."""
    from play.models import load_evaluator

    net, _ = load_evaluator(tiny)
    player = NetPlayer(net, **ENGINE, visits=400)
    game = Game(9, PRESETS["chinese"])
    move = player.genmove(game, BLACK, seconds=0.0)
    assert player.last.visits == 1 and len(player.last.moves) == 82  # the root expanded
    favourite = max(player.last.moves, key=lambda m: m.prior)
    assert move == favourite.move


def test_an_obvious_move_stops_the_search_early(tiny):
    """A single legal move other than pass, or one the visits cannot overturn, ends the
    search well before its cap."""
    from play.models import load_evaluator

    net, _ = load_evaluator(tiny)
    player = NetPlayer(net, **ENGINE, visits=400)
    player.genmove(Game(9, PRESETS["chinese"]), BLACK)
    full = player.last.visits
    assert full < 400  # the leader was out of reach before the cap
    assert player.last.moves[0].visits - player.last.moves[1].visits > 400 - full


def test_a_gumbel_root_spends_its_budget_on_its_considered_moves(tiny):
    """considered > 0: genmove's root is a deterministic Gumbel root (no draw: the considered
    moves are those of the largest priors). It spends the whole visit budget (sequential
    halving has no early stop, where PUCT stopped well short of it above), every visit goes to
    a considered move, and the move played is one of the most visited of them."""
    from play.models import load_evaluator

    net, _ = load_evaluator(tiny)
    player = NetPlayer(net, **ENGINE, visits=64, considered=4)
    game = Game(9, PRESETS["chinese"])
    move = player.genmove(game, BLACK)
    result = player.last
    assert result.visits == 64 and result.chose and move == result.best()
    by_prior = sorted(result.moves, key=lambda m: -m.prior)
    considered = {m.move for m in by_prior[:4]}
    visited = [m for m in result.moves if m.visits > 0]
    assert {m.move for m in visited} == considered
    assert sum(m.visits for m in visited) == 63  # the walks after the root's own evaluation
    most = max(m.visits for m in visited)
    assert move in {m.move for m in visited if m.visits == most}
    # No Gumbel draw: the same seed (the net's random symmetries) gives the same search.
    assert NetPlayer(net, **ENGINE, visits=64, considered=4).genmove(game, BLACK) == move
    with pytest.raises(ValueError, match="considered"):
        NetPlayer(net, **ENGINE, visits=64, considered=-1)


def test_warming_up_leaves_a_seeds_moves_as_they_were(tiny):
    """`tengen gtp` warms the player up (numba's kernels) before it answers anything; the
    random symmetries it draws after that are those of a player that never warmed up."""
    from play.models import load_evaluator

    net, _ = load_evaluator(tiny)

    def moves(warm: bool) -> list:
        player = NetPlayer(net, **ENGINE, visits=16, seed=3)
        if warm:
            player.warm_up(9)
        game, out = Game(9, PRESETS["chinese"]), []
        for color in (BLACK, WHITE, BLACK, WHITE):
            out.append(player.genmove(game, color))
            game.play(color, out[-1])
            out.append(player.last.moves[0].visits)  # the symmetries move the visit counts
        return out

    assert moves(True) == moves(False)


@pytest.mark.slow
@pytest.mark.parametrize("bad", ["/nonexistent/model.pt", "models:/no-such-model@champion"])
def test_a_bad_model_is_refused_with_status_2(tmp_path, bad):
    result = subprocess.run(
        [sys.executable, "-m", "flows.cli", "gtp", "--model", bad], input="quit\n",
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 2
    assert "--model" in result.stderr and bad.split("@")[0] in result.stderr


@pytest.mark.parametrize(
    ("args", "hint"),
    [(["--visits", "0"], "--visits"), (["--threads", "0"], "--threads"),
     (["--seconds", "0"], "--seconds"), (["--resign-below", "1.5"], "--resign-below")],
)  # fmt: skip
def test_bad_search_options_name_the_option(tiny, args, hint):
    result = subprocess.run(
        [sys.executable, "-m", "flows.cli", "gtp", "--model", str(tiny), *args],
        input="quit\n", capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 2 and f"Invalid value for {hint}" in result.stderr
