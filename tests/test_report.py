"""The run's report page and DVC's plots page: both draw every chart in a browser without a
network (headless Chromium, requests blocked), and the report says what the run's files say."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import (
    REPO,
    drawn_charts,
    make_run_repo,
    render_offline,
    run_cli,
    run_in,
)


def loaded(page: str) -> list[tuple[str, str]]:
    """What a page's elements load from elsewhere: (tag, URL) of every src, and of every
    stylesheet or icon link (scripts' own text is not parsed as tags, as in a browser)."""
    import html.parser

    class Loads(html.parser.HTMLParser):
        found: list[tuple[str, str]] = []

        def handle_starttag(self, tag, attrs):
            attrs = dict(attrs)
            if attrs.get("src"):
                self.found.append((tag, attrs["src"]))
            if tag == "link" and attrs.get("href"):
                self.found.append((tag, attrs["href"]))

    parser = Loads()
    parser.found = []
    parser.feed(page)
    return parser.found


def test_the_dvc_template_inlines_the_scripts_and_is_set_in_the_local_config(tmp_path):
    from stages.vega import install_dvc_template

    repo = tmp_path / "repo"
    repo.mkdir()
    run_in(repo, "git", "init", "-q")
    run_in(repo, "dvc", "init", "-q")
    path = install_dvc_template(repo)
    text = path.read_text()
    # DVC fills {plot_divs}; with no {scripts} in the page it adds none of its CDN tags.
    assert "{plot_divs}" in text and "{scripts}" not in text
    assert not loaded(text) and "cdn." not in text
    assert "window.vegaEmbed=" in text.replace(" ", "")
    # Nothing inside the inlined bundle closes its <script> early.
    body = text.split("<script>", 1)[1].split("</script>", 1)[0]
    assert "window.vegaLite" in body
    assert run_in(repo, "dvc", "config", "plots.html_template").strip() == "plots.html"
    assert "html_template" in (repo / ".dvc/config.local").read_text()
    # Git ignores the template (it is made from an installed package, not kept in git).
    assert ".dvc/plots.html" not in run_in(repo, "git", "status", "--porcelain", "-uall")
    # Installed again: the same file, the line in .gitignore once.
    install_dvc_template(repo)
    assert (repo / ".dvc/.gitignore").read_text().count("/plots.html") == 1
    # A template the user set in the repository's config is theirs: left as it is.
    run_in(repo, "dvc", "config", "--local", "--unset", "plots.html_template")
    run_in(repo, "dvc", "config", "plots.html_template", "mine.html")
    install_dvc_template(repo)
    assert run_in(repo, "dvc", "config", "plots.html_template").strip() == "mine.html"
    assert "html_template" not in (repo / ".dvc/config.local").read_text()


def test_a_game_s_frames_show_captures_and_who_won(tmp_path):
    from stages.report import _game, board_svg

    # Black captures White's corner stone with its third move, then White passes; the
    # champion (tengen, "A") plays Black and wins.
    sgf = tmp_path / "game.sgf"
    sgf.write_text("(;GM[1]FF[4]SZ[5]KM[0.5]RU[chinese]PB[tengen gen-1 (A)]PW[GNU Go 3.8 (B)]"
                   "RE[B+R];B[ba];W[aa];B[ab];W[])")  # fmt: skip
    game = _game(sgf, "gen-1")
    assert len(game["frames"]) == 5 and len(game["moves"]) == 4
    assert game["frames"][0] == "." * 25
    assert game["frames"][2][:2] == "wb" and game["frames"][2][5] == "."
    assert game["frames"][3][:2] == ".b" and game["frames"][3][5] == "b"  # captured
    assert game["frames"][4] == game["frames"][3] and game["moves"][3] == ["w", None, "pass"]
    assert game["moves"][2] == ["b", [0, 1], "A4"]  # GTP's name of the point, row 4 from below
    assert game["champion_black"] and game["champion_won"]
    svg = board_svg(5, game["frames"][3], [0, 1])
    assert svg.count('class="stone"') == 2 and svg.count("<line") == 10
    assert ">E</text>" in svg and ">5</text>" in svg  # coordinates: columns A-E, rows 1-5
    # A record that cannot be replayed is left out, not an error.
    (tmp_path / "bad.sgf").write_text("(;GM[1]SZ[5];B[aa];W[aa])")
    assert _game(tmp_path / "bad.sgf", "gen-1") is None


def test_tengen_report_says_what_is_wrong_and_exits_2(tmp_path):
    result = run_cli("report", str(tmp_path / "nowhere"))
    assert result.returncode == 2 and "nowhere does not exist" in result.stderr
    result = run_cli("report", str(tmp_path))
    assert result.returncode == 2
    assert "report:" in result.stderr and "not a run folder (no params.yaml)" in result.stderr
    (tmp_path / "params.yaml").write_text((REPO / "params.yaml").read_text())
    history = tmp_path / "reports/history/gen-0.json"
    history.parent.mkdir(parents=True)
    history.write_text('[{"generation": 0, "loss_total": 1.')  # cut short
    result = run_cli("report", str(tmp_path))
    assert result.returncode == 2
    assert f"{history} cannot be read" in result.stderr, result.stderr
    assert not (tmp_path / "reports/report").exists()
    assert history.read_text().endswith("1.")  # the file is left as it was
    # Valid JSON of the wrong shape: the same kind of message, not a traceback.
    history.write_text('{"generation": 0}')
    result = run_cli("report", str(tmp_path))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"{history} is not a list of rows" in result.stderr, result.stderr


@pytest.mark.slow
@pytest.mark.gnugo
def test_a_finished_run_has_a_report_and_plots_that_draw_offline(
    tmp_path, prefect_api, gnugo_path, chromium_path
):
    """`tengen run` on a tiny run with an evaluation: it ends by naming its report page; the
    page is logged to the loop's MLflow run; in Chromium with the network off every chart of
    the page and of `dvc plots show` draws its data, and the games stand on a board."""
    from mlflow import MlflowClient
    from prefect.settings import PREFECT_API_URL

    repo = make_run_repo(tmp_path / "run", code_deps=False, evaluate_every=2)
    env = dict(os.environ, PREFECT_API_URL=PREFECT_API_URL.value())
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    result = subprocess.run(
        [sys.executable, "-m", "flows.cli", "run", "--repo", str(repo)],
        env=env, capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    page = (repo / "reports/report/index.html").resolve()
    assert f"report:    {page}" in result.stdout

    client = MlflowClient(f"sqlite:///{repo}/mlflow.db")
    experiment = client.get_experiment_by_name("tengen")
    [loop_run] = client.search_runs(
        [experiment.experiment_id], "tags.`tengen.launcher` = 'tengen run'"
    )
    logged = {a.path for a in client.list_artifacts(loop_run.info.run_id, "report")}
    assert {"report/index.html", "report/elo-generation.png", "report/losses.png"} <= logged

    text = page.read_text()
    # Self-contained: nothing to load from anywhere; the only absolute links are the MLflow
    # UI's, one per run of the loop and of each stage.
    assert not loaded(text)
    links = re.findall(r'href="(https?://[^"]+)"', text)
    assert links and all(u.startswith("http://127.0.0.1:5000/#/experiments/") for u in links)
    assert loop_run.info.run_id in text
    stage_runs = client.search_runs([experiment.experiment_id], "tags.`tengen.stage` = 'train'")
    assert {r.info.run_id for r in stage_runs} <= set(re.findall(r"/runs/(\w+)", text))
    # The loop's run was FINISHED before its page was written, and the page says so.
    assert f'{loop_run.info.run_id}">{loop_run.info.run_name}</a> (FINISHED)' in text
    # The games shown: generation 1's against GNU Go, their SGFs copied beside the page.
    sgfs = re.findall(r'href="(games/gen-1-gnugo-0-(game-\d+\.sgf))"', text)
    assert sgfs and all(
        (page.parent / copy).read_bytes()
        == (repo / "reports/eval/gen-1/gnugo-0/games" / name).read_bytes()
        for copy, name in sgfs
    )
    assert {f"report/{copy}" for copy, _ in sgfs} <= {
        a.path for a in client.list_artifacts(loop_run.info.run_id, "report/games")
    }
    evaluation = json.loads((repo / "reports/eval/gen-1.json").read_text())
    assert f"Elo {evaluation['elo']:,.3g}" in text

    dom = render_offline(chromium_path, page, screenshot=tmp_path / "report.png")
    drawn = drawn_charts(dom)
    expected = {"elo-generation", "elo-compute", "win-rates", "losses", "rows", "data",
                "gate", "nets"}  # fmt: skip
    assert set(drawn) == {f"chart-{k}" for k in expected}, drawn
    assert all(drawn.values()), drawn  # every chart drew its data, not only its axes
    assert "chart-error" not in dom.split("<body", 1)[1].split("<script", 1)[0]
    # The boards, redrawn by the page's script at each game's last move.
    boards = re.findall(r'<svg class="board".*?</svg>', dom, flags=re.S)
    assert len(boards) == len(sgfs) and all('class="stone"' in b for b in boards)

    # DVC's own page, through the template the loop installed: every plot of dvc.yaml drawn.
    run_in(repo, "dvc", "plots", "show", "-o", "plots")
    dvc_page = repo / "plots/index.html"
    dvc_text = dvc_page.read_text()
    assert "cdn.jsdelivr" not in dvc_text and not loaded(dvc_text)
    divs = re.findall(r'<div id = "([^"]+)"', dvc_text)
    assert len(divs) >= 11  # the history's 7 and the evaluation's 4
    drawn = drawn_charts(render_offline(chromium_path, dvc_page))
    assert set(drawn) == set(divs) and all(drawn.values()), drawn
