"""KataGo's JSON analysis engine over tengen's search (play/analysis.py, `tengen analysis`): the
protocol's queries, actions, priorities, partial reports, termination, perspectives and errors,
in process with stand-in nets and through the command line with a real checkpoint."""

from __future__ import annotations

import io
import json
import math
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from play.analysis import AnalysisEngine, Settings, parse_config, parse_overrides
from play.netplayer import NetPlayer
from stages.params import MatchSearchSection
from tests.conftest import PUCT_ROOT

torch.set_num_threads(1)

SEARCH = MatchSearchSection(
    c_puct=1.1, puct_exponent=0.5, fpu_reduction=0.2, virtual_loss=1.0, score_utility=0.5,
    **PUCT_ROOT,
).params()  # fmt: skip


class BlackLosesNet:
    """Sure that Black loses by 5 points, whoever is to move (global input 5 is the komi from
    the mover's side: negative for Black); ownership all White's; a uniform policy."""

    def __call__(self, planes, glob, *, legal):
        b = len(planes)
        black = glob[:, 5] < 0
        value = np.where(black[:, None], [[0.05, 0.95, 0.0]], [[0.95, 0.05, 0.0]])
        mover = np.where(black, -1.0, 1.0).astype(np.float32)  # White owns, from the mover's side
        return {
            "policy": (legal / legal.sum(axis=1, keepdims=True)).astype(np.float32),
            "value": value.astype(np.float32),
            "score_mean": 5.0 * mover,
            "score_stdev": np.full(b, 3.0, np.float32),
            "ownership": (mover[:, None, None] * planes[:, 0]).astype(np.float32),
        }


def _engine(threads=1, perspective="BLACK", visits=16):
    out = io.StringIO()
    settings = Settings(max_visits=visits, max_time=None, perspective=perspective,
                        board_sizes=frozenset({5, 9}))  # fmt: skip
    player = NetPlayer(BlackLosesNet(), params=SEARCH, visits=visits, leaves_per_game=2)
    engine = AnalysisEngine(lambda i: player if i == 0 else player.fork(i), settings, out=out,
                            threads=threads, version="test")  # fmt: skip
    return engine, out


def _answers(engine, out) -> list[dict]:
    engine.close()
    return [json.loads(line) for line in out.getvalue().splitlines()]


def _query(qid, moves=(), size=5, **extra):
    return json.dumps({"id": qid, "moves": [list(m) for m in moves], "rules": "chinese",
                       "komi": 7.5, "boardXSize": size, "boardYSize": size, **extra})  # fmt: skip


def test_each_turn_gets_one_final_answer_with_what_katrain_reads():
    engine, out = _engine()
    engine.submit(_query("a", [("B", "C3"), ("W", "B2")], analyzeTurns=[0, 1, 2],
                         includeOwnership=True, includePolicy=True))  # fmt: skip
    answers = _answers(engine, out)
    assert sorted(a["turnNumber"] for a in answers) == [0, 1, 2]
    for a in answers:
        assert a["id"] == "a" and a["isDuringSearch"] is False
        root = a["rootInfo"]
        assert root["visits"] >= 16 and root["currentPlayer"] == "BW"[a["turnNumber"] % 2]
        infos = a["moveInfos"]
        assert [m["order"] for m in infos] == list(range(len(infos)))
        assert [m["visits"] for m in infos] == sorted((m["visits"] for m in infos), reverse=True)
        for m in infos:
            assert m["pv"][0] == m["move"] and m["scoreMean"] == m["scoreLead"]
            assert 0 <= m["winrate"] <= 1 and 0 <= m["prior"] <= 1
            assert not {"lcb", "utilityLcb", "scoreSelfplay", "pvVisits"} & set(m)
        assert len(a["ownership"]) == 25
        assert len(a["policy"]) == 26
        legal = [p for p in a["policy"] if p >= 0]
        assert math.isclose(sum(legal), 1.0, rel_tol=1e-4)
    after_two = next(a for a in answers if a["turnNumber"] == 2)
    # C3 (row 3 of 5, column C) and B2 hold stones: -1 in the policy, row-major from A5.
    assert after_two["policy"][(5 - 3) * 5 + 2] == -1 and after_two["policy"][(5 - 2) * 5 + 1] == -1


@pytest.mark.parametrize("perspective", ["BLACK", "WHITE", "SIDETOMOVE"])
def test_values_are_reported_from_the_configured_side(perspective):
    """The net says Black loses by 5: Black's win rate near 0.05, White's near 0.95."""
    engine, out = _engine(perspective=perspective)
    engine.submit(_query("p", [("B", "C3")], analyzeTurns=[0, 1], includeOwnership=True))
    for a in _answers(engine, out):
        white_to_move = a["rootInfo"]["currentPlayer"] == "W"
        view_white = perspective == "WHITE" or (perspective == "SIDETOMOVE" and white_to_move)
        winrate, lead = a["rootInfo"]["winrate"], a["rootInfo"]["scoreLead"]
        assert (winrate > 0.8 and lead > 3) if view_white else (winrate < 0.2 and lead < -3)
        assert all((v < 0) != view_white for v in a["ownership"] if v != 0)


def test_higher_priority_goes_first_then_arrival():
    engine, out = _engine(visits=400)
    # The thread is busy with this one (its first partial report says so) before the rest come.
    engine.submit(_query("long", maxVisits=400, reportDuringSearchEvery=0.01))
    deadline = time.monotonic() + 60
    while not out.getvalue() and time.monotonic() < deadline:
        time.sleep(0.005)
    engine.submit(_query("low", maxVisits=4, priority=-1))
    engine.submit(_query("first", maxVisits=4))
    engine.submit(_query("second", maxVisits=4))
    engine.submit(_query("high", maxVisits=4, priority=5))
    finals = [a["id"] for a in _answers(engine, out) if not a["isDuringSearch"]]
    assert finals == ["long", "high", "first", "second", "low"]


def test_terminate_stops_a_search_and_drops_queued_turns():
    engine, out = _engine(visits=10**6)
    engine.submit(_query("t", analyzeTurns=[0], maxVisits=10**6, reportDuringSearchEvery=0.01))
    deadline = time.monotonic() + 60
    while not out.getvalue() and time.monotonic() < deadline:
        time.sleep(0.005)  # "t" is being searched: its first partial report came
    engine.submit(_query("q", [("B", "C3")], analyzeTurns=[0, 1], maxVisits=10**6))
    engine.submit(json.dumps({"id": "stop", "action": "terminate", "terminateId": "q",
                              "turnNumbers": [1]}))  # fmt: skip
    engine.submit(json.dumps({"id": "stop2", "action": "terminate", "terminateId": "q"}))
    engine.submit(json.dumps({"id": "stop3", "action": "terminate", "terminateId": "t"}))
    answers = _answers(engine, out)
    acks = [a for a in answers if a.get("action") == "terminate"]
    assert [a["id"] for a in acks] == ["stop", "stop2", "stop3"]
    final = {(a["id"], a["turnNumber"]): a for a in answers if a.get("isDuringSearch") is False}
    assert final[("q", 1)] == {"id": "q", "isDuringSearch": False, "noResults": True,
                               "turnNumber": 1}  # fmt: skip
    searched = final[("t", 0)]
    assert searched["isDuringSearch"] is False and 0 < searched["rootInfo"]["visits"] < 10**6
    assert final[("q", 0)].get("noResults") is True


def test_partial_reports_come_before_exactly_one_final():
    engine, out = _engine()
    engine.submit(_query("r", maxVisits=3000, reportDuringSearchEvery=0.05))
    answers = _answers(engine, out)
    assert [a["isDuringSearch"] for a in answers][-1] is False
    assert sum(not a["isDuringSearch"] for a in answers) == 1 and len(answers) >= 3
    visits = [a["rootInfo"]["visits"] for a in answers]
    assert visits == sorted(visits)


@pytest.mark.parametrize(
    ("line", "error", "field"),
    [
        ("{", "could not parse input line as json request: {", None),
        ("[1, 2]", "was not an object", None),
        ('{"moves": []}', "did not specify an id", None),
        (_query("x", [("B", "C3"), ("W", "C3")]), "Illegal move 1: C3", "moves"),
        (_query("x", [("B", "Z9")]), "Could not parse board location: Z9", "moves"),
        (_query("x", [("X", "C3")]), "Could not parse player: X", "moves"),
        (_query("x", rules="go-moku"), "Could not parse rules: go-moku", "rules"),
        (_query("x", size=7), "trained on 5, 9", "boardXSize"),
        (_query("x", komi=7.25), "Must be a integer or half-integer", "komi"),
        (_query("x", analyzeTurns=[3]), "Invalid turn number: 3", "analyzeTurns"),
        (_query("x", maxVisits=0), "maxVisits", "maxVisits"),
        (json.dumps({"id": "x", "action": "dance"}), "'action' field must be", None),
        # Found by a review: each once stopped the engine.
        ("[" * 100_000, "could not parse input line as json request", None),
        (_query("x", [("B", "A\u00b2")]), "Could not parse board location", "moves"),
        (_query("x", rules={"komi": "x"}), 'Could not parse rules: {"komi": "x"}', "rules"),
        (_query("x", overrideSettings={"maxTime": float("nan")}), "maxTime", "overrideSettings"),
    ],
)
def test_bad_input_gets_katagos_error_and_the_engine_goes_on(line, error, field):
    engine, out = _engine()
    engine.submit(line)
    engine.submit(_query("after", maxVisits=4))
    first, after = _answers(engine, out)
    assert error in first["error"]
    assert first.get("field") == field
    if '"id": "x"' in line and "action" not in line:
        assert first["id"] == "x"
    assert after["id"] == "after" and after["moveInfos"]


def test_actions_version_and_cache():
    engine, out = _engine()
    engine.submit(json.dumps({"id": "v", "action": "query_version"}))
    engine.submit(json.dumps({"id": "c", "action": "clear_cache"}))
    version, cleared = _answers(engine, out)
    assert version == {"id": "v", "action": "query_version", "version": "test",
                       "git_hash": "<omitted>"}  # fmt: skip
    assert cleared == {"id": "c", "action": "clear_cache"}


def test_two_analysis_threads_answer_every_turn():
    engine, out = _engine(threads=2)
    for i in range(4):
        engine.submit(_query(f"g{i}", [("B", "C3")], analyzeTurns=[0, 1], maxVisits=8))
    answers = _answers(engine, out)
    assert sorted((a["id"], a["turnNumber"]) for a in answers) == [
        (f"g{i}", t) for i in range(4) for t in (0, 1)
    ]


def test_config_and_overrides_in_katagos_form():
    config = parse_config(
        "# a comment\nmaxVisits = 50   # trailing\n\nnnCacheSizePowerOfTwo=16\n"
        "numAnalysisThreads = 2\n"
    )
    config.update(parse_overrides("maxTime=2.5, reportAnalysisWinratesAs=SIDETOMOVE"))
    settings = Settings.from_config(config, [9])
    assert (settings.max_visits, settings.max_time, settings.perspective) == (50, 2.5, "SIDETOMOVE")
    assert settings.ignored == ("nnCacheSizePowerOfTwo",) and settings.board_sizes == {9}
    with pytest.raises(ValueError, match="config:2: expected `key = value`"):
        parse_config("a = 1\njust words\n")
    with pytest.raises(ValueError, match="reportAnalysisWinratesAs"):
        Settings.from_config({"reportAnalysisWinratesAs": "GREEN"}, [9])
    assert Settings.from_config({"tengenBoardSizes": "7,9"}, [9]).board_sizes == {7, 9}


def test_the_command_line_speaks_the_protocol(tiny_model, tmp_path):
    """`tengen analysis` as KaTrain starts it, a real checkpoint, a KataGo config file."""
    config = tmp_path / "analysis.cfg"
    config.write_text(
        "reportAnalysisWinratesAs = SIDETOMOVE\nnumSearchThreadsPerAnalysisThread = 1\n"
    )
    lines = [
        json.dumps({"id": "v", "action": "query_version"}),
        _query("a", [("B", "E5")], size=9, maxVisits=8, includeOwnership=True),
        _query("b", size=19),
    ]
    done = subprocess.run(
        [sys.executable, "-m", "flows.cli", "analysis", "-model", str(tiny_model), "-config",
         str(config), "-override-config", "maxVisits=8"],
        input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    answers = {a["id"]: a for a in map(json.loads, done.stdout.splitlines())}
    assert answers["v"]["version"].endswith("tiny")
    assert answers["a"]["rootInfo"]["currentPlayer"] == "W" and len(answers["a"]["ownership"]) == 81
    assert "trained on 9" in answers["b"]["error"]
    assert "ignored: numSearchThreadsPerAnalysisThread" in done.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "flows.cli", "analysis", "-model", str(tiny_model), "-config",
         str(tmp_path / "missing.cfg")],
        input="", capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert bad.returncode == 2 and "missing.cfg: no such file" in bad.stderr
    missing = tmp_path / "missing.pt"
    bad = subprocess.run(
        [sys.executable, "-m", "flows.cli", "analysis", "-model", str(missing)],
        input="", capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert bad.returncode == 2 and f"-model {missing}: no such file" in bad.stderr


def _run(argv: list[str], lines: list[str]) -> list[dict]:
    done = subprocess.run(argv, input="\n".join(lines) + "\n", capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return [json.loads(line) for line in done.stdout.splitlines()]


def _keyed(answers: list[dict]) -> dict:
    """Responses by (id, turn number) for analyses, by id (or the error text) otherwise."""
    return {(a.get("id"), a.get("turnNumber")) if "id" in a else a["error"][-40:]: a
            for a in answers}  # fmt: skip


def test_answers_have_katagos_shape_types_and_errors(katago, tiny_model):
    """The same queries to the real KataGo and to `tengen analysis`: every field tengen sends
    is one KataGo sends, with its type; the same turns answered, the same illegal points in
    the policy, the same lengths, the same errors in the same words. (The values differ:
    different nets.)"""
    import shlex

    lines = [
        json.dumps({"id": "v", "action": "query_version"}),
        _query(
            "a",
            [("B", "E5"), ("W", "C3")],
            size=9,
            analyzeTurns=[0, 1, 2],
            maxVisits=4,
            includeOwnership=True,
            includePolicy=True,
        ),  # fmt: skip
        "not json",
        _query("b", [("B", "E5"), ("W", "E5")], size=9),
        _query("c", [("X", "E5")], size=9),
        _query("d", size=9, rules="go-moku"),
        _query("e", size=9, analyzeTurns=[3]),
        json.dumps({"id": "f", "action": "dance"}),
        _query("g", size=9, komi=7.25),
        _query("h", [("B", "Z9")], size=9),
        json.dumps({"id": "t", "action": "terminate", "terminateId": "nothing"}),
        json.dumps({"id": "m", "action": "query_models"}),
    ]
    theirs = _keyed(_run(shlex.split(katago.analysis_command()), lines))
    tengen = [sys.executable, "-m", "flows.cli", "analysis", "-model", str(tiny_model),
              "-config", str(katago.analysis_config)]  # fmt: skip
    ours = _keyed(_run(tengen, lines))
    assert set(ours) == set(theirs)
    for key, kata in theirs.items():
        mine = ours[key]
        if "error" in kata:
            assert mine == kata or mine["error"].endswith(kata["error"].split(" - ")[-1]), key
            continue
        if key == ("v", None):
            assert set(mine) == set(kata)
            continue
        if key == ("m", None):
            _same_shape(mine["models"][0], kata["models"][0], key)
            assert mine["models"][0]["internalName"] == "tiny"
            continue
        if "action" in kata:
            assert mine == kata
            continue
        _same_shape(mine, kata, key)
        assert mine["rootInfo"]["currentPlayer"] == kata["rootInfo"]["currentPlayer"]
        assert len(mine["ownership"]) == len(kata["ownership"]) == 81
        assert len(mine["policy"]) == len(kata["policy"]) == 82
        illegal = [[i for i, p in enumerate(a["policy"]) if p == -1] for a in (mine, kata)]
        assert illegal[0] == illegal[1], key
        for info in mine["moveInfos"]:
            _same_shape(info, kata["moveInfos"][0], key)
        orders = [m["order"] for m in mine["moveInfos"]]
        assert orders == sorted(orders) == list(range(len(orders)))


def _same_shape(mine: dict, kata: dict, where) -> None:
    """Every key of `mine` is one of `kata`'s, its value of the same JSON type (ints where
    KataGo has ints; a float that happens to be whole is still a float)."""
    extra = set(mine) - set(kata)
    assert not extra, (where, extra)
    for k in mine:
        a, b = mine[k], kata[k]
        if isinstance(b, dict | list):
            assert type(a) is type(b), (where, k)
        else:
            assert isinstance(a, type(b)) or (isinstance(b, float) and isinstance(a, int)), (
                where, k, a, b)  # fmt: skip
