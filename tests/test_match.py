"""`tengen match`: real engines over GTP, games written as SGF, a summary with its interval."""

from __future__ import annotations

import json
import sys

import pytest

from gocore.rules import PRESETS
from play.match import EngineStartError, Match, MatchConfig, wilson_interval
from play.programs import find_program
from play.sgf import read_sgf, replay
from tests.conftest import REPO, run_cli, tengen_command

STUBBORN = f"{sys.executable} {REPO / 'tests' / 'engines' / 'stubborn.py'}"
LIAR = f"{sys.executable} {REPO / 'tests' / 'engines' / 'liar.py'} 2"


def test_wilson_interval_known_values():
    assert wilson_interval(0, 0) == (0.0, 1.0)
    low, high = wilson_interval(5, 10)
    assert low == pytest.approx(0.2366, abs=1e-4) and high == pytest.approx(0.7634, abs=1e-4)
    low, high = wilson_interval(0, 2)
    assert low == 0.0 and high == pytest.approx(0.6576, abs=1e-4)


def check_games(out, summary):
    for result in summary["results"]:
        record = read_sgf(out / result["sgf"])
        assert record.result == result["result"]
        game = replay(record)  # every game is legal under the match rules
        assert len(game.moves) == result["moves"]
        if result["reason"] == "score":
            assert game.is_over


@pytest.mark.slow
@pytest.mark.gnugo
def test_tengen_against_gnugo_through_the_cli(gnugo_path, tmp_path):
    out = tmp_path / "match"
    result = run_cli(
        "match", tengen_command() + " --seed 7", f"{gnugo_path} --mode gtp --level 1",
        "--games", "2", "--size", "9", "--rules", "chinese", "--out", str(out), "--show",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["games_played"] == 2
    assert summary["engines"]["A"]["name"] == "tengen 0.1.0"
    assert summary["engines"]["B"]["name"] == "GNU Go 3.8"
    assert summary["wins"]["A"] + summary["wins"]["B"] + summary["draws"] + summary["void"] == 2
    # The random player cannot beat GNU Go.
    assert summary["wins"]["B"] == 2 and summary["a_win_rate"] == 0.0
    assert summary["a_win_rate_95ci"][1] == pytest.approx(0.6576, abs=1e-3)
    assert [(r["black"], r["white"]) for r in summary["results"]] == [("A", "B"), ("B", "A")]
    for r in summary["results"]:
        assert r["reason"] in ("score", "resign")
        if r["reason"] == "score":
            assert r["scoring"] == "dead stones agreed by both engines" or "referee" in r["scoring"]
    check_games(out, summary)
    assert "game 1: black A white B" in result.stderr and "A's win rate 0.000" in result.stderr


@pytest.mark.gnugo
def test_disagreement_on_dead_stones_goes_to_the_referee(gnugo_path, tmp_path):
    # The liar calls every stone dead; tengen calls none (the game is played out); GNU Go
    # referees, agreeing with tengen, so the score is the plain area count.
    config = MatchConfig(
        games=2, size=7, rules=PRESETS["chinese"], referee=f"{gnugo_path} --mode gtp"
    )
    summary = Match(tengen_command() + " --seed 1", LIAR, config, tmp_path).run()
    for result in summary["results"]:
        assert result["reason"] == "score"
        assert result["scoring"] == "dead stones from the referee (GNU Go 3.8)"
        game = replay(read_sgf(tmp_path / result["sgf"]))
        assert result["score"] == game.score()
    check_games(tmp_path, summary)


def test_without_a_referee_disagreement_scores_every_stone(tmp_path):
    config = MatchConfig(games=1, size=7, rules=PRESETS["chinese"])
    summary = Match(tengen_command() + " --seed 1", LIAR, config, tmp_path).run()
    (result,) = summary["results"]
    assert result["scoring"].startswith("Tromp-Taylor (no dead stones): the engines disagree")
    assert result["score"] == replay(read_sgf(tmp_path / result["sgf"])).score()


def test_an_illegal_move_forfeits_the_game(tmp_path):
    config = MatchConfig(games=2, size=5, rules=PRESETS["chinese"], timeout=60)
    summary = Match(STUBBORN, tengen_command() + " --seed 3", config, tmp_path).run()
    first, second = summary["results"]
    # Game 1: the stubborn engine is Black, plays A1, then A1 again on its next turn.
    assert (first["reason"], first["winner"], first["result"]) == ("illegal move", "B", "W+F")
    assert first["moves"] == 2
    assert second["winner"] == "B" and second["reason"] == "illegal move"
    assert summary["wins"] == {"A": 0, "B": 2}
    check_games(tmp_path, summary)


def test_an_engine_that_dies_forfeits_and_is_restarted(tmp_path):
    dies = f"{sys.executable} -c \"import sys; sys.stdin.readline(); print('= x'); print()\""
    config = MatchConfig(games=2, size=5, rules=PRESETS["chinese"], timeout=20)
    summary = Match(dies, tengen_command(), config, tmp_path).run()
    assert [r["reason"] for r in summary["results"]] == ["engine failure", "engine failure"]
    assert summary["wins"] == {"A": 0, "B": 2}


def test_a_command_that_does_not_start_is_refused_before_any_game(tmp_path):
    config = MatchConfig(games=2, size=5)
    with pytest.raises(EngineStartError, match="engine A: cannot start '/no/such/engine --gtp'"):
        Match("/no/such/engine --gtp", tengen_command(), config, tmp_path).run()
    assert not (tmp_path / "games").exists() and not (tmp_path / "summary.json").exists()
    # Through the CLI: exit status 2, the engine named, no game scored as a forfeit.
    out = tmp_path / "cli"
    result = run_cli("match", tengen_command(), "no-such-gtp-engine", "--out", str(out))
    assert result.returncode == 2
    assert "engine B: cannot start 'no-such-gtp-engine'" in result.stderr
    assert "no game played" in result.stderr and not (out / "summary.json").exists()
    # A program that exits before answering `name` is no engine either; its stderr is kept.
    exits = f"{sys.executable} -c \"import sys; sys.exit('no net here')\""
    with pytest.raises(EngineStartError, match="engine B exited while answering 'name'") as e:
        Match(tengen_command(), exits, config, tmp_path / "exits").run()
    assert str(e.value).endswith(f"its stderr: {tmp_path / 'exits' / 'logs' / 'B.stderr.log'}")
    assert (tmp_path / "exits" / "logs" / "B.stderr.log").read_text().strip() == "no net here"
    with pytest.raises(EngineStartError, match="engine B: cannot read .*No closing quotation"):
        Match(tengen_command(), "gnugo --mode 'gtp", config, tmp_path / "quote").run()
    # A referee that does not start is refused the same way (scoring would change silently).
    config = MatchConfig(games=1, size=5, referee="no-such-referee --mode gtp")
    with pytest.raises(EngineStartError, match="engine referee: cannot start"):
        Match(tengen_command(), tengen_command(), config, tmp_path / "ref").run()


@pytest.mark.gnugo
def test_gnugo_is_found_in_usr_games_off_path(gnugo_path, tmp_path, monkeypatch):
    if not gnugo_path.startswith("/usr/games/"):
        pytest.skip("GNU Go is not in /usr/games here")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert find_program("gnugo --mode gtp") == [gnugo_path, "--mode", "gtp"]
    config = MatchConfig(games=1, size=5, rules=PRESETS["chinese"])
    summary = Match(tengen_command() + " --seed 2", "gnugo --mode gtp", config, tmp_path).run()
    assert summary["engines"]["B"]["name"] == "GNU Go 3.8"
    assert summary["results"][0]["reason"] in ("score", "resign")


def test_an_engine_may_take_its_start_up_time_before_its_first_answer(tmp_path):
    # An engine that loads (or compiles numba's kernels, as `tengen gtp` does on a fresh
    # install) before it reads its first command: `name` waits for start_timeout, every later
    # command for the per-command timeout only.
    from play.match import EngineFailure, GtpClient

    slow = tmp_path / "slow.py"
    slow.write_text(
        "import sys, time\n"
        "time.sleep(2.0)\n"
        "for line in sys.stdin:\n"
        "    if line.startswith('genmove'):\n"
        "        time.sleep(60.0)\n"
        "    print('= slow\\n', flush=True)\n"
        "    if line.startswith('quit'):\n"
        "        break\n"
    )
    command = f"{sys.executable} {slow}"
    with pytest.raises(EngineStartError, match="did not answer 'name' within 1 s"):
        GtpClient(command, label="A", timeout=1.0, start_timeout=1.0)
    client = GtpClient(command, label="A", timeout=1.0, start_timeout=60.0)
    try:
        assert client.name == "slow slow"
        with pytest.raises(EngineFailure, match="did not answer 'genmove b' within 1 s"):
            client.send("genmove b")
    finally:
        client.proc.kill()
