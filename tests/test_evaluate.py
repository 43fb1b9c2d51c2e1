"""The evaluate stage: its schedule in dvc.yaml, engine command lines, and real evaluations
through GTP against GNU Go and the random player, rated with earlier champions in one fit;
`tengen eval` outside a run."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
import yaml

from flows import pipeline
from gocore.board import BLACK
from nets.checkpoint import save
from nets.config import net_config
from nets.model import GoNet
from play.programs import install_command
from play.sgf import read_sgf
from stages import evaluate
from stages.cli import InputError
from stages.spec import Evaluation, Plan, plan_of
from tests.conftest import REPO, run_cli

torch.set_num_threads(1)


def test_the_schedule_every_k_generations_and_after_the_last():
    assert [n for n in range(7) if Plan(7, evaluation=Evaluation(3)).evaluated(n)] == [2, 5, 6]
    assert not any(Plan(7, evaluation=Evaluation(0)).evaluated(n) for n in range(7))
    schedule = Plan(5, evaluation=Evaluation(every=2, past_champions=1))
    stages = pipeline.pipeline(schedule)["stages"]
    assert [s for s in stages if s.startswith("evaluate")] == ["evaluate-1", "evaluate-3",
                                                               "evaluate-4"]  # fmt: skip
    last = stages["evaluate-4"]
    assert last["cmd"] == "python -m stages.evaluate --generation 4 --earlier 1,3"
    # Its champion, the one past champion it plays, the earlier reports it is fitted with,
    # and the self-play reports its compute comes from; each made by an earlier stage.
    for dep in ("models/gen-4/champion", "models/gen-3/champion", "reports/eval/gen-1.json",
                "reports/eval/gen-3.json", "reports/selfplay/gen-0.json"):  # fmt: skip
        assert dep in last["deps"]
    assert "models/gen-1/champion" not in last["deps"]
    order = list(stages)
    assert order.index("evaluate-4") > order.index("promote-4")
    plotted = {f for plot in pipeline.plots(schedule) for f in next(iter(plot.values()))["y"]}
    assert "reports/eval/history-gen-4.json" in plotted
    # The committed dvc.yaml has the schedule params.yaml gives.
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    committed = yaml.safe_load((REPO / "dvc.yaml").read_text())
    assert committed == pipeline.pipeline(plan_of(raw, "params.yaml"))
    # Generations listed in evaluate.at are evaluated too (tengen ablate's compute points), and
    # the schedule is no params dep: adding a generation to it redoes no evaluation.
    listed = Plan(7, evaluation=Evaluation(every=0, at=(1, 4)))
    assert [n for n in range(7) if listed.evaluated(n)] == [1, 4]
    # Its plots read the newest evaluation's history (generation 6 has none).
    read = {f for plot in pipeline.plots(listed) for f in next(iter(plot.values()))["y"]}
    assert (
        "reports/eval/history-gen-4.json" in read and "reports/eval/history-gen-6.json" not in read
    )
    assert [n for n in range(7) if Plan(7, evaluation=Evaluation(3, at=(0,))).evaluated(n)] == [
        0, 2, 5, 6]  # fmt: skip
    raw["evaluate"].update(every=0, at=[1])
    first = pipeline.pipeline(plan_of(raw, "params.yaml"))["stages"]["evaluate-1"]
    raw["evaluate"]["at"] = [1, 2]
    second = pipeline.pipeline(plan_of(raw, "params.yaml"))["stages"]
    assert second["evaluate-1"] == first and "evaluate-2" in second
    assert "evaluate.games" in first["params"] and "device" in first["params"]
    assert not {"evaluate", "evaluate.every", "evaluate.at"} & set(first["params"])


def test_engine_command_lines(monkeypatch):
    import sys

    tengen = evaluate.engine_command("{tengen} gtp --player random")
    assert tengen.split()[:3] == [sys.executable, "-m", "flows.cli"]
    with pytest.raises(InputError, match="`no-such-engine` is not installed"):
        evaluate.engine_command("no-such-engine --mode gtp")
    if shutil.which("gnugo") is None and Path("/usr/games/gnugo").exists():
        assert evaluate.engine_command("gnugo --level 1").startswith("/usr/games/gnugo ")
    monkeypatch.setenv("PATH", "/nonexistent")
    if not Path("/usr/games/gnugo").exists():
        with pytest.raises(InputError, match=r"apt-get install -y gnugo"):
            evaluate.engine_command("gnugo --mode gtp")


def _params(tmp: Path, **evaluate_keys) -> Path:
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    raw["evaluate"].update(
        games=2, board_size=5, komi=0.5, visits=4, workers=2, timeout=60,
        opponents={"gnugo-0": "gnugo --mode gtp --level 0 --chinese-rules",
                   "random": "{tengen} gtp --player random --seed 1"},
        anchor="gnugo-0", past_champions=1,
    )  # fmt: skip
    raw["evaluate"].update(evaluate_keys)
    path = tmp / "params.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _champion(tmp: Path, generation: int, seed: int) -> Path:
    torch.manual_seed(seed)
    folder = tmp / "models" / f"gen-{generation}" / "champion"
    folder.mkdir(parents=True)
    return save(GoNet(net_config("b2c16")), folder / "champion.pt", {"model_id": f"g{generation}"})


def _score_from_sgfs(folder: Path) -> float:
    """The champion's score in a pairing's games, read back from the SGFs alone."""
    score = 0.0
    for path in sorted((folder / "games").glob("*.sgf")):
        record = read_sgf(path)
        champion_black = record.black.endswith("(A)")
        if record.result == "0":
            score += 0.5
        elif record.result[0] == ("B" if champion_black else "W"):
            score += 1
    return score


@pytest.mark.slow
@pytest.mark.gnugo
def test_two_evaluations_rated_in_one_fit(tmp_path, monkeypatch, gnugo_path):
    monkeypatch.chdir(tmp_path)
    params_path = _params(tmp_path)
    (tmp_path / "reports" / "selfplay").mkdir(parents=True)
    for k, seconds in ((0, 10.0), (1, 20.0)):
        (tmp_path / "reports" / "selfplay" / f"gen-{k}.json").write_text(
            json.dumps({"seconds": seconds, "evaluations": 100 * (k + 1), "visits_per_s": 50})
        )
    _champion(tmp_path, 0, 0)
    _champion(tmp_path, 1, 1)

    params, io = evaluate.prepare(params_path, 0)
    first = evaluate.run(params, io)
    assert [p["opponent"] for p in first["pairings"]] == ["gnugo-0", "random"]
    for p in first["pairings"]:
        assert p["games"] + p["void"] == 2
        assert p["a_score"] == _score_from_sgfs(Path("reports/eval/gen-0") / p["opponent"])
    assert first["ratings"]["gnugo-0"] == {"elo": 0.0, "stderr": 0.0}
    assert first["selfplay_evaluations"] == 100 and first["selfplay_seconds"] == 10
    assert (Path("reports/eval/gen-0") / "elo.png").stat().st_size > 10_000

    params, io = evaluate.prepare(params_path, 1, earlier=[0])
    second = evaluate.run(params, io)
    # The past champion plays too, and the fit takes every game of both evaluations.
    assert [p["opponent"] for p in second["pairings"]] == ["gnugo-0", "random", "gen-0"]
    assert set(second["ratings"]) == {"gen-0", "gen-1", "gnugo-0", "random"}
    assert second["selfplay_evaluations"] == 300 and second["selfplay_seconds"] == 30
    history = json.loads(Path("reports/eval/history-gen-1.json").read_text())
    assert [row["generation"] for row in history] == [0, 1]
    assert (
        history[1]["elo"] == second["elo"]
        and history[0]["elo"] == second["ratings"]["gen-0"]["elo"]
    )
    assert set(history[0]) >= {"win_rate_gnugo-0", "win_rate_random", "selfplay_evaluations"}

    # A missing earlier report is named with the stage that makes it.
    Path("reports/eval/gen-0.json").unlink()
    with pytest.raises(InputError, match="run evaluate-0 first"):
        evaluate.run(*evaluate.prepare(params_path, 1, earlier=[0]))


@pytest.mark.gnugo
def test_a_handicap_rung_gives_the_champion_black_and_the_stones(tmp_path, monkeypatch):
    # GNU Go level 1 giving stones: a rung below the even game that a weak champion can climb.
    # Here a 7x7 board's two stones, against the random player to stay quick; the even
    # pairing next to it alternates colours at evaluate.komi as before.
    monkeypatch.chdir(tmp_path)
    params_path = _params(
        tmp_path, board_size=7, komi=7.5, workers=1, past_champions=0, anchor="random",
        opponents={
            "random": "{tengen} gtp --player random --seed 1",
            "random-h2": {"command": "{tengen} gtp --player random --seed 2", "handicap": 2,
                          "komi": 0.5},
        },
    )  # fmt: skip
    (tmp_path / "reports" / "selfplay").mkdir(parents=True)
    (tmp_path / "reports" / "selfplay" / "gen-0.json").write_text('{"evaluations": 1}')
    _champion(tmp_path, 0, 0)
    report = evaluate.run(*evaluate.prepare(params_path, 0))
    even, rung = report["pairings"]
    assert (even["handicap"], even["komi"], rung["handicap"], rung["komi"]) == (0, 7.5, 2, 0.5)
    records = [read_sgf(p) for p in sorted(Path("reports/eval/gen-0/random-h2/games").glob("*"))]
    assert len(records) == 2
    for record in records:
        assert record.black.endswith("(A)") and record.handicap == 2 and record.komi == 0.5
        # GTP's fixed points on 7x7: the opposite corners' 3-3 points (x, y from the top).
        assert sorted(p for _, p in record.setup) == [(2, 4), (4, 2)]
        assert record.moves[0][0] == 2  # White moves first
    assert rung["a_wins_as_black"] == rung["a_wins"]
    colours = [read_sgf(p).black.endswith("(A)")
               for p in sorted(Path("reports/eval/gen-0/random/games").glob("*"))]  # fmt: skip
    assert colours == [True, False]
    assert set(report["ratings"]) == {"gen-0", "random", "random-h2"}


def test_a_handicap_rung_the_board_cannot_hold_is_refused():
    from stages.params import EvaluateParams, ParamsError, section

    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    gnugo = "gnugo --mode gtp --level 1 --chinese-rules"
    for stones, size in ((1, 9), (10, 9), (5, 7)):
        raw["evaluate"].update(
            board_size=size,
            opponents={
                "gnugo-1": gnugo,
                "gnugo-1-h": {"command": gnugo, "handicap": stones, "komi": 0.5},
            },
        )
        with pytest.raises(
            ParamsError,
            match=rf"evaluate.opponents: gnugo-1-h.handicap: 2..\d stones on {size}x{size}, "
            rf"or 0 \(got {stones}\)",
        ):
            section(raw, "evaluate", EvaluateParams, source="params.yaml")
    raw["evaluate"]["board_size"] = 5
    with pytest.raises(ParamsError, match="no fixed handicap on 5x5"):
        section(raw, "evaluate", EvaluateParams, source="params.yaml")
    raw["evaluate"]["board_size"] = 9
    # A mapping is checked as a rung only: its own keys named, not "a valid string" too.
    raw["evaluate"]["opponents"]["gnugo-1-h"] = {"command": gnugo, "stones": 3, "komi": 0.5}
    with pytest.raises(ParamsError) as bad:
        section(raw, "evaluate", EvaluateParams, source="params.yaml")
    assert "gnugo-1-h.rung.stones: Extra inputs are not permitted" in str(bad.value)
    assert "valid string" not in str(bad.value)
    raw["evaluate"]["opponents"]["gnugo-1-h"] = {"command": gnugo, "handicap": 3, "komi": 0.5}
    rungs = section(raw, "evaluate", EvaluateParams, source="params.yaml").rungs()
    assert (rungs["gnugo-1"].handicap, rungs["gnugo-1"].komi) == (0, raw["evaluate"]["komi"])
    assert rungs["gnugo-1-h"].handicap == 3


def test_a_missing_champion_or_unknown_anchor_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    params_path = _params(tmp_path, opponents={"random": "{tengen} gtp --player random"},
                          anchor="gnugo-1")  # fmt: skip
    with pytest.raises(InputError, match="run promote-0 first"):
        evaluate.run(*evaluate.prepare(params_path, 0))
    _champion(tmp_path, 0, 0)
    with pytest.raises(InputError, match="evaluate.anchor: 'gnugo-1' is not among"):
        evaluate.run(*evaluate.prepare(params_path, 0))
    assert not Path("reports/eval/gen-0").exists()


def test_an_opponent_that_does_not_start_fails_the_stage_not_its_games(tmp_path, monkeypatch):
    # A program that exits on its arguments (a mistyped flag): before, every game was its
    # forfeit, and the champion's Elo a fiction.
    monkeypatch.chdir(tmp_path)
    exits = f"{sys.executable} -c \"import sys; sys.exit('unknown option --levle')\""
    params_path = _params(tmp_path, opponents={"typo": exits}, anchor="typo", workers=1)
    (tmp_path / "reports" / "selfplay").mkdir(parents=True)
    (tmp_path / "reports" / "selfplay" / "gen-0.json").write_text('{"evaluations": 1}')
    _champion(tmp_path, 0, 0)
    with pytest.raises(InputError, match="pairing typo: engine B exited while answering 'name'"):
        evaluate.run(*evaluate.prepare(params_path, 0))
    assert not Path("reports/eval/gen-0").exists() and not Path("reports/eval/gen-0.json").exists()


@pytest.mark.slow
def test_tengen_eval_outside_a_run(tmp_path):
    champion = _champion(tmp_path, 0, 0)
    out = tmp_path / "eval"
    result = run_cli(
        "eval", "--model", str(champion), "--opponent", "random={tengen} gtp --player random",
        "--games", "2", "--size", "5", "--komi", "0.5", "--visits", "4", "--out", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    summary = json.loads((out / "summary.json").read_text())
    [pairing] = summary["pairings"]
    assert pairing["opponent"] == "random" and pairing["games"] + pairing["void"] == 2
    assert pairing["a_score"] == _score_from_sgfs(out / "games" / "random")
    assert "random" in result.stdout and "net" in result.stdout
    bad = run_cli("eval", "--model", str(tmp_path / "none.pt"), "--games", "1")
    assert bad.returncode == 2 and "--model" in bad.stderr


def test_a_pairing_won_or_lost_whole_without_prior_draws_names_the_key(tmp_path, monkeypatch):
    # One decided game is always a perfect record: with prior_draws 0 no rating is finite, and
    # the refusal names the key to change (hypothesis found a message without it).
    monkeypatch.chdir(tmp_path)
    params_path = _params(tmp_path, opponents={"random": "{tengen} gtp --player random"},
                          anchor="random", games=1, workers=1, prior_draws=0)  # fmt: skip
    (tmp_path / "reports" / "selfplay").mkdir(parents=True)
    (tmp_path / "reports" / "selfplay" / "gen-0.json").write_text('{"evaluations": 1}')
    _champion(tmp_path, 0, 0)
    with pytest.raises(InputError, match=r"won or lost every game.*evaluate.prior_draws is 0"):
        evaluate.run(*evaluate.prepare(params_path, 0))


def _without_gnugo(monkeypatch) -> None:
    """GNU Go unfindable: off PATH (this interpreter's folder and the system's basics only)
    and outside the folders looked in after it (/usr/games)."""
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:/usr/bin:/bin")
    monkeypatch.setenv("TENGEN_PROGRAM_DIRS", "")
    if shutil.which("gnugo"):
        pytest.skip(f"GNU Go is in {shutil.which('gnugo')}, which this test cannot leave out")


def test_an_opponent_whose_program_is_missing_is_left_out_and_the_rest_rated(tmp_path, monkeypatch):
    # GNU Go missing: its rung and the referee are left out with one warning, the anchor
    # falls to the next opponent that played, and the report records what was left out, so
    # that a later run can play it (replays()).
    monkeypatch.chdir(tmp_path)
    _without_gnugo(monkeypatch)
    params_path = _params(tmp_path, workers=1, referee="gnugo --mode gtp --chinese-rules")
    (tmp_path / "reports" / "selfplay").mkdir(parents=True)
    (tmp_path / "reports" / "selfplay" / "gen-0.json").write_text('{"evaluations": 1}')
    _champion(tmp_path, 0, 0)
    settings = evaluate.read(params_path, evaluate.Params).evaluate
    assert evaluate.missing_programs(settings) == {"gnugo": ["gnugo-0", "referee"]}
    said = []
    report = evaluate.run(*evaluate.prepare(params_path, 0), log=said.append)
    assert [p["opponent"] for p in report["pairings"]] == ["random"]
    assert report["left_out"] == [
        {"opponent": "gnugo-0", "program": "gnugo", "install": install_command("gnugo"),
         "where": "here"},
        {"opponent": "referee", "program": "gnugo", "install": install_command("gnugo"),
         "where": "here"},
    ]  # fmt: skip
    assert (report["anchor"], report["anchor_wanted"]) == ("random", "gnugo-0")
    assert report["ratings"]["random"]["elo"] == 0.0 and report["elo"] is not None
    [warning] = said
    assert warning.startswith("warning: GNU Go (`gnugo`) is not installed: the evaluations leave "
                              "out gnugo-0 and score without a referee")  # fmt: skip
    assert warning.endswith(f"install it with `{install_command('gnugo')}`")
    # Nothing to play again while GNU Go is missing; once it is found, generation 0's is.
    plan = Plan(1, evaluation=Evaluation(every=1))
    assert evaluate.replays(tmp_path, plan) == {}
    games = tmp_path / "games"
    games.mkdir()
    fake = games / "gnugo"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("TENGEN_PROGRAM_DIRS", str(games))
    assert evaluate.replays(tmp_path, plan) == {0: report["left_out"]}
    # `tengen eval` names its opponents itself: a missing one is an error there.
    monkeypatch.setenv("TENGEN_PROGRAM_DIRS", "")
    with pytest.raises(evaluate.MissingProgram, match="`gnugo` is not installed"):
        evaluate.run(*evaluate.prepare(params_path, 0), leave_out_missing=False)


def test_an_evaluation_with_every_opponent_left_out_rates_nothing_and_fails_nothing(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    _without_gnugo(monkeypatch)
    params_path = _params(tmp_path, past_champions=0, referee=None,
                          opponents={"gnugo-0": "gnugo --mode gtp --level 0"})  # fmt: skip
    (tmp_path / "reports" / "selfplay").mkdir(parents=True)
    (tmp_path / "reports" / "selfplay" / "gen-0.json").write_text('{"evaluations": 1}')
    _champion(tmp_path, 0, 0)
    report = evaluate.run(*evaluate.prepare(params_path, 0))
    assert report["pairings"] == [] and report["elo"] is None and report["ratings"] == {}
    assert [e["opponent"] for e in report["left_out"]] == ["gnugo-0"]
    assert json.loads(Path("reports/eval/history-gen-0.json").read_text()) == []


KATAGO_RUNG = {"command": "{katago} -override-config maxVisits=1", "handicap": 2, "komi": 0.5}


def test_a_katago_rung_without_katago_is_left_out_with_its_installer(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TENGEN_KATAGO_HOME", str(tmp_path / "no-katago"))
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:/usr/bin:/bin")
    if shutil.which("katago"):
        pytest.skip(f"KataGo is in {shutil.which('katago')}, which this test cannot leave out")
    params_path = _params(tmp_path, workers=1, board_size=9, opponents={
        "katago-h2": KATAGO_RUNG, "random": "{tengen} gtp --player random --seed 1"},
        anchor="random")  # fmt: skip
    (tmp_path / "reports" / "selfplay").mkdir(parents=True)
    (tmp_path / "reports" / "selfplay" / "gen-0.json").write_text('{"evaluations": 1}')
    _champion(tmp_path, 0, 0)
    settings = evaluate.read(params_path, evaluate.Params).evaluate
    assert evaluate.missing_programs(settings).get("katago") == ["katago-h2"]
    said = []
    report = evaluate.run(*evaluate.prepare(params_path, 0), log=said.append)
    assert [p["opponent"] for p in report["pairings"]] == ["random"]
    assert {"opponent": "katago-h2", "program": "katago", "where": "here",
            "install": "tengen engines install katago"} in report["left_out"]  # fmt: skip
    expected = ("KataGo (`katago`) is not installed: the evaluations leave out katago-h2; "
                "install it with `tengen engines install katago`")  # fmt: skip
    assert any(expected in line for line in said), said


@pytest.mark.slow
def test_katago_plays_its_handicap_rung(katago, gnugo_path, tmp_path, monkeypatch):
    """The real KataGo at 1 visit, giving 2 stones on 9x9 to a random-init champion: the
    champion takes Black with the stones, KataGo answers every move, and the game is rated."""
    monkeypatch.chdir(tmp_path)
    params_path = _params(tmp_path, games=1, workers=1, board_size=9, anchor="katago-h2",
                          opponents={"katago-h2": KATAGO_RUNG})  # fmt: skip
    (tmp_path / "reports" / "selfplay").mkdir(parents=True)
    (tmp_path / "reports" / "selfplay" / "gen-0.json").write_text('{"evaluations": 1}')
    _champion(tmp_path, 0, 0)
    report = evaluate.run(*evaluate.prepare(params_path, 0))
    [pairing] = report["pairings"]
    assert pairing["opponent"] == "katago-h2" and pairing["games"] == 1
    [game] = (tmp_path / "reports" / "eval" / "gen-0" / "katago-h2" / "games").glob("*.sgf")
    record = read_sgf(game)
    assert record.black.endswith("(A)") and "KataGo" in record.white
    assert [c for c, _ in record.setup] == [BLACK, BLACK] and record.komi == 0.5
