"""A run's report: one self-contained HTML page (no network needed) that shows how a run went.

    tengen report                 # the run here: reports/report/index.html
    tengen report runs/hour       # another run folder

The page, from the run folder's JSON reports, promotion records, SGF files and MLflow store:
strength (the evaluate stage's Elo against generation and against self-play compute, with
error bars, and the win rate against each fixed opponent with its 95% interval), the training
losses per term, the window and self-play rows, the self-play data figures per generation
(stages.data), the gate's results, the nets over the run, a few games of the latest evaluated
champion against GNU Go on a board that steps through the moves, and links to the MLflow runs
and the SGF files. Charts are vega-lite specs drawn by the inlined scripts (stages.vega); each
is also written as a PNG beside the page. The loop writes the page when a run ends and logs it
to the loop's MLflow run (artifacts under report/).
"""

from __future__ import annotations

import datetime
import html
import json
import re
from pathlib import Path

from play.programs import HERE, REFEREE
from stages import layout
from stages.cli import InputError, read_report
from stages.tracking import LOCAL_UI

OUT = layout.REPORTS / "report"  # in the run folder: index.html, a PNG per chart, games/
CHART_KEYS = ("elo-generation", "elo-compute", "win-rates", "losses", "rows", "nets", "gate",
              "data")  # fmt: skip
PAGE = "index.html"
GAMES = 4  # games of the latest champion against GNU Go shown on the board
LOSS_TERMS = (
    "total",
    "policy",
    "opponent_policy",
    "outcome",
    "ownership",
    "score_pdf",
    "score_cdf",
    "score_mean",
    "score_stdev",
)
# stages.data's headline figures, as the promote stage copies them into the run's history.
DATA_FIGURES = {
    "data_game_length": "game length (moves)",
    "data_black_win_rate": "Black's win rate (even games)",
    "data_early_end_games": "games ended by two early passes",
    "data_value_calibration_error": "value calibration error",
    "data_policy_entropy": "policy target entropy (nats)",
    "data_policy_top": "policy target's largest entry",
    "data_full_rows_per_game": "full-search rows per game",
}


def _read_json(path: Path, kind: type = dict):
    """A report file's JSON, which must be a `kind` (a list: of rows, each with its
    generation); InputError naming the file otherwise."""
    value = read_report(path, "report", "the stage that wrote it")
    rows_ok = kind is not list or all(
        isinstance(r, dict) and isinstance(r.get("generation"), int) for r in value
    )
    if not isinstance(value, kind) or not rows_ok:
        what = "a list of rows with a generation each" if kind is list else "a JSON object"
        raise InputError(f"report: {path} is not {what}; rerun the stage that wrote it")
    return value


def _by_generation(folder: Path, prefix: str = "gen-") -> dict[int, Path]:
    """<prefix>N.json files of a folder by N, in order."""
    pattern = re.compile(rf"{re.escape(prefix)}(\d+)\.json")
    found = {}
    if folder.is_dir():
        for path in folder.iterdir():
            if m := pattern.fullmatch(path.name):
                found[int(m.group(1))] = path
    return dict(sorted(found.items()))


def _latest(folder: Path, prefix: str = "gen-") -> Path | None:
    found = _by_generation(folder, prefix)
    return found[max(found)] if found else None


def _by_generation_and_net(folder: Path) -> dict[tuple[int, str], dict]:
    """gen-N[-<net>].json reports by (N, net), net '' for train.net's (stages.layout)."""
    found = {}
    for path in sorted(folder.glob("gen-*.json")):
        if m := re.fullmatch(r"gen-(\d+)(?:-(.+))?\.json", path.name):
            found[(int(m.group(1)), m.group(2) or "")] = _read_json(path)
    return dict(sorted(found.items()))


# --- what the page shows ---------------------------------------------------------------


def collect(repo: Path) -> dict:
    """Everything the page shows, read from the run folder (InputError naming a file that
    cannot be read)."""
    from stages.params import ParamsError, load_params

    repo = Path(repo)
    if not repo.is_dir():
        raise InputError(f"report: {repo} does not exist")
    if not (repo / layout.PARAMS).is_file():
        raise InputError(f"report: {repo} is not a run folder (no params.yaml)")
    try:
        params = load_params(repo / layout.PARAMS)
    except ParamsError as e:
        raise InputError(f"report: {e}") from None
    reports = repo / layout.REPORTS
    history_path = _latest(reports / "history")
    history = _read_json(history_path, list) if history_path else []
    ladder_path = _latest(reports / "eval", "history-gen-")
    ladder = _read_json(ladder_path, list) if ladder_path else []
    evals = {n: _read_json(p) for n, p in _by_generation(reports / "eval").items()}
    selfplay = {n: _read_json(p) for n, p in _by_generation(reports / "selfplay").items()}
    train = _by_generation_and_net(reports / "train")
    gates = _by_generation_and_net(reports / "gate")
    promotions = {}
    n = 0
    while (repo / layout.promotion(n)).is_file():
        promotions[n] = _read_json(repo / layout.promotion(n))
        n += 1
    return {
        "repo": repo.resolve(),
        "params": params,
        "history": history,
        "ladder": ladder,
        "evals": evals,
        "selfplay": selfplay,
        "train": train,
        "gates": gates,
        "promotions": promotions,
    }


def _fixed_opponents(facts: dict) -> list[str]:
    return list((facts["params"].get("evaluate") or {}).get("opponents") or {})


def _anchor(facts: dict) -> str:
    for report in reversed(list(facts["evals"].values())):
        if report.get("anchor"):
            return report["anchor"]
    return (facts["params"].get("evaluate") or {}).get("anchor") or "the anchor"


# --- charts (vega-lite specs) ------------------------------------------------------------

SCHEMA = "https://vega.github.io/schema/vega-lite/v6.json"  # a name; nothing is fetched


def _spec(title: str, values: list[dict], layers: list[dict], **extra) -> dict:
    return {
        "$schema": SCHEMA,
        "title": title,
        "width": 420,
        "height": 260,
        "data": {"values": values},
        "layer": layers,
        **extra,
    }


def _q(field: str, title: str, **more) -> dict:
    return {"field": field, "type": "quantitative", "title": title, **more}


def _generation_axis(last: int) -> dict:
    """x: the generation, 0 to `last`, ticks on whole generations only (vega's tickMinStep
    does not stop a 0-1 axis from labelling 0.5)."""
    step = max(1, -(-(last + 1) // 12))
    return _q("generation", "generation", scale={"domain": [0, max(last, 1)]},
              axis={"values": list(range(0, last + 1, step)), "format": "d"})  # fmt: skip


def _lines(title: str, values: list[dict], x: dict, y: dict, *, color: dict | None = None,
           bars: tuple[str, str] | None = None, rule: float | None = None,
           tooltip: tuple = ()) -> dict:  # fmt: skip
    """A line chart with points; `bars` (low, high fields) draws an error bar at each point,
    `rule` a dashed level line."""
    colored = {"color": color} if color else {}
    layers = []
    if bars:
        low = {**y, "field": bars[0]}
        high = {"field": bars[1]}
        layers.append({"mark": {"type": "rule", "opacity": 0.6},
                       "encoding": {"x": x, "y": low, "y2": high, **colored}})  # fmt: skip
    tips = [t for t in (color, x if x["field"] == "generation" else None, y, *tooltip) if t]
    layers.append({"mark": {"type": "line", "point": True},
                   "encoding": {"x": x, "y": y, **colored, "tooltip": tips}})  # fmt: skip
    if rule is not None:
        layers.append({"mark": {"type": "rule", "strokeDash": [4, 4], "color": "gray"},
                       "encoding": {"y": {"datum": rule}}})  # fmt: skip
    return _spec(title, values, layers)


def _numbers(rows: list[dict], columns: dict[str, str], name: str, value: str) -> list[dict]:
    """Long form of the history's columns: {generation, name: label, value: row[column]}."""

    def number(v) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    return [{"generation": row["generation"], name: label, value: row[column]}
            for row in rows for column, label in columns.items()
            if number(row.get(column))]  # fmt: skip


def charts(facts: dict) -> list[tuple[str, dict]]:
    """(key, vega-lite spec) of every chart the run has data for, in the page's order."""
    out: list[tuple[str, dict]] = []
    history = facts["history"]
    last = max([len(facts["promotions"]) - 1, *(r["generation"] for r in history),
                *(r["generation"] for r in facts["ladder"]), 0])  # fmt: skip
    x = _generation_axis(last)
    anchor = _anchor(facts)
    ladder = [{**row, "low": row["elo"] - (row.get("elo_stderr") or 0.0),
               "high": row["elo"] + (row.get("elo_stderr") or 0.0),
               "evaluations_m": (row.get("selfplay_evaluations") or 0.0) / 1e6,
               "selfplay_minutes": (row.get("selfplay_seconds") or 0.0) / 60}
              for row in facts["ladder"] if isinstance(row.get("elo"), (int, float))]  # fmt: skip
    if ladder:
        elo = _q("elo", "Elo")
        more = (_q("elo_stderr", "standard error"), _q("generation", "generation"),
                _q("evaluations_m", "self-play evaluations (M)", format=".2f"),
                _q("selfplay_minutes", "self-play minutes", format=".1f"))  # fmt: skip
        out.append(("elo-generation", _lines(
            f"Elo against generation ({anchor} = 0; bars: one standard error)", ladder, x, elo,
            bars=("low", "high"), rule=0.0, tooltip=more)))  # fmt: skip
        compute = _q("evaluations_m", "self-play network evaluations (millions)")
        out.append(("elo-compute", _lines(
            f"Elo against self-play compute ({anchor} = 0)", ladder, compute, elo,
            bars=("low", "high"), rule=0.0, tooltip=more)))  # fmt: skip
    fixed = _fixed_opponents(facts)
    # Each opponent's points a little apart along x, so that lines at the same rate (every
    # game won against the easy rungs) and their intervals stay visible.
    spread = {name: (i - (len(fixed) - 1) / 2) * min(0.12, 0.5 / max(len(fixed), 1))
              for i, name in enumerate(fixed)}  # fmt: skip
    rates = [{"generation": n, "at": n + spread[p["opponent"]], "opponent": p["opponent"],
              "win_rate": p["a_win_rate"], "low": (p.get("a_win_rate_95ci") or [None, None])[0],
              "high": (p.get("a_win_rate_95ci") or [None, None])[1],
              "games": p["games"], "wins": p.get("a_wins")}
             for n, report in facts["evals"].items() for p in report.get("pairings") or []
             if p.get("opponent") in spread and p.get("games")]  # fmt: skip
    if rates:
        out.append(("win-rates", _lines(
            "win rate against each fixed opponent (bars: 95% interval)", rates,
            {**x, "field": "at"}, _q("win_rate", "win rate", scale={"domain": [0, 1]}),
            color={"field": "opponent", "type": "nominal", "title": "opponent", "sort": fixed},
            bars=("low", "high"),
            tooltip=(_q("generation", "generation"), _q("wins", "wins"),
                     _q("games", "games")))))  # fmt: skip
    losses = _numbers(history, {f"loss_{t}": t for t in LOSS_TERMS}, "term", "loss")
    losses = [row for row in losses if row["loss"] > 0]  # a log scale
    if losses:
        out.append(("losses", _lines(
            "training loss per term (the last snapshot's, log scale)", losses, x,
            _q("loss", "loss", scale={"type": "log"}),
            color={"field": "term", "type": "nominal", "sort": list(LOSS_TERMS)})))  # fmt: skip
    rows = _numbers(history, {"window_rows": "window", "selfplay_rows": "new self-play rows"},
                    "what", "rows")  # fmt: skip
    if rows:
        out.append(("rows", _lines(
            "training window and each generation's self-play rows", rows, x, _q("rows", "rows"),
            color={"field": "what", "type": "nominal", "title": ""})))  # fmt: skip
    figures = _numbers(history, DATA_FIGURES, "figure", "value")
    if figures:
        out.append(("data", {
            "$schema": SCHEMA, "title": "self-play data per generation (stages.data)",
            "data": {"values": figures}, "columns": 3,
            "facet": {"field": "figure", "type": "nominal", "title": None,
                      "sort": list(DATA_FIGURES.values())},
            "spec": {"width": 200, "height": 120, "mark": {"type": "line", "point": True},
                     "encoding": {"x": x, "y": _q("value", None, scale={"zero": False}),
                                  "tooltip": [x, _q("value", "value", format=".4")]}},
            "resolve": {"scale": {"y": "independent"}},
        }))  # fmt: skip
    main_net = (facts["params"].get("train") or {}).get("net", "train.net")
    gated = [{"generation": n, "net": net or main_net, "win_rate": g.get("win_rate"),
              "games": g.get("games"), "passed": bool(g.get("passed"))}
             for (n, net), g in facts["gates"].items() if g.get("games")]  # fmt: skip
    if gated:
        need = (facts["params"].get("gate") or {}).get("win_fraction", 0.5)
        win_rate = _q("win_rate", "win rate", scale={"domain": [0, 1]})
        out.append(("gate", _spec(
            f"gate: the candidate's win rate against the champion (passes at {need:g})", gated,
            [{"mark": {"type": "point", "filled": True, "size": 80},
              "encoding": {"x": x, "y": win_rate,
                           "color": {"field": "passed", "type": "nominal"},
                           "shape": {"field": "net", "type": "nominal"},
                           "tooltip": [x, {"field": "net"}, _q("games", "games"), win_rate]}},
             {"mark": {"type": "rule", "strokeDash": [4, 4], "color": "gray"},
              "encoding": {"y": {"datum": need}}}])))  # fmt: skip
    nets = [{"generation": n, "net": p["champion"].get("net", "?"),
             "parameters": p["champion"].get("parameters")}
            for n, p in facts["promotions"].items()
            if p.get("champion") and p["champion"].get("parameters")]  # fmt: skip
    if nets:
        out.append(("nets", _lines(
            "the champion's net: parameters per generation", nets, x,
            _q("parameters", "parameters", scale={"zero": False}),
            color={"field": "net", "type": "nominal"})))  # fmt: skip
    return out


# --- games on a board --------------------------------------------------------------------


def pick_games(facts: dict, count: int = GAMES) -> list[tuple[Path, dict]]:
    """Up to `count` SGFs of the latest evaluation's even games against GNU Go (any opponent
    whose command runs gnugo; handicap games if there are no even ones): wins and losses
    alternately, so the page shows both when there are both."""
    if not facts["evals"] or count <= 0:
        return []
    n, report = list(facts["evals"].items())[-1]
    folder = facts["repo"] / layout.eval_games(n)
    pairings = [p for p in report.get("pairings") or [] if "gnugo" in p.get("command", "")]
    pairings.sort(key=lambda p: (p.get("handicap", 0) != 0, p.get("handicap", 0)))
    from play.sgf import SgfError, read_sgf

    champion = report.get("champion", "")
    wins, losses = [], []  # sorted by the records' results alone: only the shown are replayed
    for pairing in pairings:
        for path in sorted((folder / pairing["opponent"] / "games").glob("*.sgf")):
            try:
                record = read_sgf(path)
            except (SgfError, OSError, ValueError):
                continue
            (wins if _sides(record, champion)[1] else losses).append(path)
        if len(wins) + len(losses) >= count:
            break
    picked = []
    while len(picked) < count and (wins or losses):
        for pool in (wins, losses):
            while pool and len(picked) < count:
                path = pool.pop(0)
                if (game := _game(path, champion)) is not None:
                    picked.append((path, game))
                    break
    return picked


def _sides(record, champion: str) -> tuple[bool, bool]:
    """(the champion played Black, the champion won), from the record's names and result."""
    # The champion plays as "A" in tengen's matches; its id is in the player's name.
    black = record.black or ""
    champion_black = "(A)" in black or bool(champion and champion in black)
    won = (record.result or "?")[:1].upper() == ("B" if champion_black else "W")
    return champion_black, won


def _game(path: Path, champion: str) -> dict | None:
    """A game's frames: the board after each move (a string of '.', 'b', 'w' a point, rows
    from the top), its moves and who won; None for a record that cannot be replayed."""
    from gocore.board import BLACK, WHITE
    from play.sgf import SgfError, read_sgf, replay

    try:
        record = read_sgf(path)
        game = replay(record, upto=0)
    except (SgfError, OSError, ValueError):
        return None
    symbols = {BLACK: "b", WHITE: "w"}

    def frame() -> str:
        return "".join(symbols.get(int(c), ".") for c in game.board().ravel())

    frames, moves = [frame()], []
    for color, move in record.moves:
        try:
            game.play(color, move)
        except ValueError:  # IllegalMoveError: not a game our referee wrote; left out
            return None
        frames.append(frame())
        where = _gtp_point(move, record.size) if move else "pass"
        moves.append(["b" if color == BLACK else "w", list(move) if move else None, where])
    champion_black, won = _sides(record, champion)
    return {
        "size": record.size,
        "frames": frames,
        "moves": moves,
        "black": record.black or "Black",
        "white": record.white or "White",
        "result": record.result or "?",
        "komi": record.komi,
        "handicap": record.handicap,
        "champion_black": champion_black,
        "champion_won": won,
    }


COLUMNS = "ABCDEFGHJKLMNOPQRSTUVWXYZ"  # GTP's column letters: no I


def _gtp_point(p: tuple[int, int], size: int) -> str:
    """(x, y), y = 0 the top row, as GTP writes it: the column letter, the row from below."""
    return f"{COLUMNS[p[0]]}{size - p[1]}"


def board_svg(size: int, frame: str, last: list | None = None) -> str:
    """A static SVG of one position, with GTP's coordinates (what the page shows before its
    script runs, and where scripts do not run: MLflow's artifact view)."""
    cell, pad = 32, 30
    width = pad * 2 + cell * (size - 1)
    parts = [
        f'<svg class="board" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} '
        f'{width}" width="{width}" height="{width}" font-size="11" font-family="sans-serif">',
        f'<rect width="{width}" height="{width}" fill="#dcb35c"/>',
    ]
    for i in range(size):
        a = pad + i * cell
        parts.append(f'<line x1="{pad}" y1="{a}" x2="{width - pad}" y2="{a}" stroke="#000"/>')
        parts.append(f'<line x1="{a}" y1="{pad}" x2="{a}" y2="{width - pad}" stroke="#000"/>')
        parts.append(f'<text x="{a}" y="{width - 8}" text-anchor="middle">{COLUMNS[i]}</text>')
        parts.append(f'<text x="10" y="{a + 4}" text-anchor="middle">{size - i}</text>')
    for index, c in enumerate(frame):
        if c == ".":
            continue
        x, y = pad + (index % size) * cell, pad + (index // size) * cell
        fill, stroke = ("#111", "#000") if c == "b" else ("#f8f8f8", "#333")
        parts.append(
            f'<circle class="stone" cx="{x}" cy="{y}" r="{cell * 0.47:.1f}" '
            f'fill="{fill}" stroke="{stroke}"/>'
        )
    if last:
        x, y = pad + last[0] * cell, pad + last[1] * cell
        parts.append(
            f'<circle cx="{x}" cy="{y}" r="{cell * 0.18:.1f}" fill="none" '
            f'stroke="#d22" stroke-width="3"/>'
        )
    parts.append("</svg>")
    return "".join(parts)


# --- MLflow ------------------------------------------------------------------------------


def mlflow_links(facts: dict, ui: str = LOCAL_UI) -> dict:
    """The run folder's MLflow runs: {"loops": [(name, url, status)], "stages": {name: url},
    "ui": ..., "store": ...}, or {"error": why} when the store cannot be read. Read only:
    nothing is created in the store."""
    from stages.params import ParamsError
    from stages.tracking import (
        answering_quickly,
        run_url,
        runs_url,
        settings,
        store_exists,
        store_uri,
        ui_of,
        workspace_key,
    )

    try:
        params = settings(facts["params"], facts["repo"] / layout.PARAMS)
    except ParamsError as e:
        return {"error": str(e)}
    if params is None:
        return {"error": "MLflow tracking is off (mlflow.enabled: false)"}
    uri = store_uri(params, facts["repo"])
    if not store_exists(uri):
        return {"error": f"no MLflow store yet ({uri})"}
    ui = ui_of(uri, ui)
    try:
        with answering_quickly():
            from mlflow import MlflowClient

            client = MlflowClient(uri)
            experiment = client.get_experiment_by_name(params.experiment)
            if experiment is None:
                return {"error": f"no experiment {params.experiment!r} in {uri}"}
            runs = client.search_runs(
                [experiment.experiment_id],
                f"tags.`tengen.workspace_key` = '{workspace_key(facts['repo'])}'",
                max_results=5000,
                order_by=["attributes.start_time ASC"],
            )
    except Exception as e:  # noqa: BLE001 - any store failure: the page says so, without links
        return {"error": f"MLflow store {uri} cannot be read: {e}"}

    def url(run) -> str:
        return run_url(ui, experiment.experiment_id, run.info.run_id)

    loops, stages = [], {}
    for run in runs:
        if run.data.tags.get("tengen.launcher") in ("tengen run", "dvc"):
            loops.append((run.info.run_name, url(run), run.info.status))
        elif run.info.status == "FINISHED":  # the newest finished run of each stage
            stages[run.info.run_name] = url(run)
    return {
        "loops": loops,
        "stages": stages,
        "ui": ui,
        "store": uri,
        "experiment": runs_url(ui, experiment.experiment_id),
    }


# --- the page ----------------------------------------------------------------------------


def _e(value) -> str:
    return html.escape(str(value), quote=True)


def _json_script(value) -> str:
    """JSON to put inside a <script> element."""
    return json.dumps(value, separators=(",", ":")).replace("</", "<\\/").replace("<!--", "<\\!--")


def _fmt(value, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}g}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _yes(flag) -> str:
    return "-" if flag is None else "yes" if flag else "no"


def _link(text: str, href: str | None) -> str:
    return f'<a href="{_e(href)}">{_e(text)}</a>' if href else _e(text)


def _summary(facts: dict) -> str:
    promotions, evals = facts["promotions"], facts["evals"]
    items = [
        ("run folder", _e(facts["repo"])),
        (
            "generations done",
            f"{len(promotions)} of {facts['params'].get('run', {}).get('generations', '?')}",
        ),
    ]
    if promotions:
        last = promotions[max(promotions)]
        champion = last.get("champion")
        items.append(
            (
                "champion",
                _e(
                    f"{champion['id']} ({champion.get('net', '?')}, "
                    f"{_fmt(champion.get('parameters'))} parameters)"
                )
                if champion
                else "none yet (no candidate passed its gate)",
            )
        )
    evaluations = sum(  # as the evaluate stage counts them (compute_spent)
        r.get("evaluations", (r.get("evaluations_per_s") or 0) * (r.get("seconds") or 0))
        for r in facts["selfplay"].values()
    )
    seconds = sum(r.get("seconds", 0) for r in facts["selfplay"].values())
    if facts["selfplay"]:
        items.append(
            (
                "self-play",
                f"{_fmt(sum(r.get('games', 0) for r in facts['selfplay'].values()))} "
                f"games, {evaluations / 1e6:.2f} M network evaluations, "
                f"{seconds / 60:.1f} min",
            )
        )
    if evals:
        n, report = list(evals.items())[-1]
        stderr = report.get("elo_stderr")
        items.append(
            (
                "latest evaluation",
                _e(
                    f"generation {n}: Elo {_fmt(report.get('elo'))}"
                    + (f" ± {_fmt(stderr)}" if stderr is not None else "")
                    + f" ({report.get('anchor', 'anchor')} = 0)"
                ),
            )
        )
    return "<dl>" + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in items) + "</dl>"


def _ladder_table(facts: dict) -> str:
    if not facts["evals"]:
        every = (facts["params"].get("evaluate") or {}).get("every", 0)
        return (
            f"<p>No evaluation yet (evaluate.every: {_e(every)}; the evaluate stage plays "
            "the champion against GNU Go and the random player).</p>"
        )
    rows = []
    for n, report in facts["evals"].items():
        for p in report.get("pairings", []):
            low, high = p.get("a_win_rate_95ci") or (None, None)
            interval = f"{low:.2f}-{high:.2f}" if low is not None else "-"
            rows.append(
                f"<tr><td>{n}</td><td>{_e(p.get('opponent'))}</td>"
                f"<td>{_e(p.get('handicap', 0))}</td><td>{_e(p.get('komi'))}</td>"
                f"<td>{_e(p.get('a_wins'))}/{_e(p.get('games'))}</td>"
                f"<td>{interval}</td></tr>"
            )
    return (
        "<table><tr><th>generation</th><th>opponent</th><th>handicap</th><th>komi</th>"
        "<th>champion's wins</th><th>95% interval</th></tr>"
        + "".join(rows)
        + "</table>"
        + _left_out_note(facts)
    )


def _left_out_note(facts: dict) -> str:
    """What the evaluations left out for want of a program (stages.evaluate's `left_out`),
    and the anchor the Elo took instead of evaluate.anchor."""
    items = []
    for n, report in facts["evals"].items():
        left_out = report.get("left_out") or []
        if not left_out:
            continue
        names = ", ".join(
            "the referee" if e["opponent"] == REFEREE else e["opponent"] for e in left_out
        )
        programs = sorted({(e["program"], e.get("install") or "", e["where"]) for e in left_out})
        why = "; ".join(
            f"<code>{_e(p)}</code> is not installed"
            + ("" if where == HERE else f" on {_e(where)}")
            + (f" (<code>{_e(install)}</code>)" if install else "")
            for p, install, where in programs
        )
        anchor = (
            f" Its Elo is relative to {_e(report['anchor'])}: the anchor "
            f"{_e(report['anchor_wanted'])} did not play."
            if report.get("anchor_wanted")
            else ""
        )
        items.append(f"<li>generation {n}: {_e(names)} left out: {why}.{anchor}</li>")
    if not items:
        return ""
    return (
        '<p class="note">Left out of the evaluations for want of a program; the next '
        "<code>tengen run</code> plays them once it is installed:</p><ul>"
        + "".join(items) + "</ul>"
    )  # fmt: skip


def _generation_table(facts: dict, links: dict) -> str:
    stages = links.get("stages", {})
    history = {row["generation"]: row for row in facts["history"]}
    gens = sorted(set(facts["promotions"]) | set(facts["selfplay"]) | set(history))
    rows = []
    for n in gens:
        promotion = facts["promotions"].get(n, {})
        champion = (promotion.get("champion") or {}).get("id", "-")
        decisions = promotion.get("decisions") or (
            {"": promotion["decision"]} if promotion.get("decision") else {}
        )
        gate = (
            "; ".join(
                (f"{line}: " if len(decisions) > 1 else "")
                + (
                    "no gate"
                    if d.get("skipped")
                    else f"{_fmt(d.get('candidate_wins'))}/{d.get('games', 0)} won, "
                    + ("passed" if d.get("passed") else "failed")
                )
                for line, d in decisions.items()
            )
            or "-"
        )
        sp = facts["selfplay"].get(n, {})
        row = history.get(n, {})
        trained = sorted(
            net or facts["params"].get("train", {}).get("net", "")
            for (k, net) in facts["train"]
            if k == n
        )
        runs = " ".join(
            _link(name.rsplit("-", 1)[0], url)
            for name, url in stages.items()
            if name.rsplit("-", 1)[-1] == str(n)
        )
        rows.append(
            f"<tr><td>{n}</td><td>{_e(champion)}</td><td>{_e(', '.join(trained) or '-')}</td>"
            f"<td>{_yes(row.get('promoted'))}</td>"
            f"<td>{_e(gate)}</td><td>{_fmt(sp.get('games'))}</td><td>{_fmt(sp.get('rows'))}</td>"
            f"<td>{_fmt(sp.get('seconds'))}</td><td>{_fmt(row.get('window_rows'))}</td>"
            f"<td>{_fmt(row.get('loss_total'))}</td><td>{runs or '-'}</td></tr>"
        )
    return (
        "<table><tr><th>generation</th><th>champion</th><th>nets trained</th>"
        "<th>promoted</th><th>gate (candidate's wins)</th><th>self-play games</th>"
        "<th>self-play rows</th><th>self-play seconds</th>"
        "<th>window rows</th><th>loss</th><th>MLflow runs</th></tr>" + "".join(rows) + "</table>"
    )


def _games_html(
    games: list[tuple[Path, dict]], out_dir: Path, generation: int | None
) -> tuple[str, list[dict]]:
    """The games' blocks (their SGFs copied into games/ beside the page, so the links hold
    wherever the folder goes: MLflow's artifacts, a copy) and the frames for the script."""
    import shutil

    blocks, data = [], []
    for i, (path, game) in enumerate(games):
        copy = Path("games") / f"gen-{generation}-{path.parent.parent.name}-{path.name}"
        (out_dir / copy).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, out_dir / copy)
        side = "Black" if game["champion_black"] else "White"
        outcome = "won" if game["champion_won"] else "lost"
        last_move = next((m[1] for m in reversed(game["moves"]) if m[1]), None)
        count = len(game["moves"])
        blocks.append(
            f'<div class="game" id="game-{i}"><h3>the champion ({side}) {outcome}: '
            f"{_e(game['result'])}</h3>"
            f"<p>Black: {_e(game['black'])}<br>White: {_e(game['white'])}<br>"
            f"komi {_e(game['komi'])}"
            + (f", handicap {_e(game['handicap'])}" if game["handicap"] else "")
            + f'; {count} moves; <a href="{_e(copy.as_posix())}">SGF</a></p>'
            f'<div class="viewer">{board_svg(game["size"], game["frames"][-1], last_move)}</div>'
            f'<div class="controls"><button data-step="-1000">|&lt;</button>'
            f'<button data-step="-1">&lt;</button>'
            f'<input type="range" min="0" max="{count}" value="{count}">'
            f'<button data-step="1">&gt;</button><button data-step="1000">&gt;|</button>'
            f' <span class="move">move {count}</span></div></div>'
        )
        data.append({"size": game["size"], "frames": game["frames"], "moves": game["moves"]})
    return "".join(blocks), data


BOARD_SCRIPT = """
// The boards: each game's frames (the position after each move), drawn as SVG on demand,
// as stages.report.board_svg draws them.
(function () {
  const NS = "http://www.w3.org/2000/svg", COLUMNS = "ABCDEFGHJKLMNOPQRSTUVWXYZ";
  function draw(holder, game, k) {
    const n = game.size, cell = 32, pad = 30, w = pad * 2 + cell * (n - 1);
    const svg = document.createElementNS(NS, "svg");
    for (const [key, value] of Object.entries({class: "board", viewBox: `0 0 ${w} ${w}`,
        width: w, height: w, "font-size": 11, "font-family": "sans-serif"}))
      svg.setAttribute(key, value);
    function add(name, attrs, text) {
      const el = document.createElementNS(NS, name);
      for (const [key, value] of Object.entries(attrs)) el.setAttribute(key, value);
      if (text !== undefined) el.textContent = text;
      svg.appendChild(el); return el;
    }
    add("rect", {width: w, height: w, fill: "#dcb35c"});
    for (let i = 0; i < n; i++) {
      const a = pad + i * cell;
      add("line", {x1: pad, y1: a, x2: w - pad, y2: a, stroke: "#000"});
      add("line", {x1: a, y1: pad, x2: a, y2: w - pad, stroke: "#000"});
      add("text", {x: a, y: w - 8, "text-anchor": "middle"}, COLUMNS[i]);
      add("text", {x: 10, y: a + 4, "text-anchor": "middle"}, String(n - i));
    }
    const frame = game.frames[k];
    for (let i = 0; i < frame.length; i++) {
      if (frame[i] === ".") continue;
      add("circle", {class: "stone", cx: pad + (i % n) * cell, cy: pad + Math.floor(i / n) * cell,
                     r: cell * 0.47, fill: frame[i] === "b" ? "#111" : "#f8f8f8",
                     stroke: frame[i] === "b" ? "#000" : "#333"});
    }
    const move = k > 0 ? game.moves[k - 1] : null;
    if (move && move[1]) add("circle", {cx: pad + move[1][0] * cell, cy: pad + move[1][1] * cell,
                                        r: cell * 0.18, fill: "none", stroke: "#d22",
                                        "stroke-width": 3});
    holder.replaceChildren(svg);
  }
  GAMES.forEach(function (game, i) {
    const root = document.getElementById("game-" + i);
    const holder = root.querySelector(".viewer"), range = root.querySelector("input");
    const label = root.querySelector(".move");
    function show(k) {
      k = Math.max(0, Math.min(game.moves.length, k));
      range.value = k; draw(holder, game, k);
      const move = k > 0 ? game.moves[k - 1] : null;
      label.textContent = k === 0 ? "the start" :
        `move ${k}: ${move[0] === "b" ? "Black" : "White"} ${move[2]}`;
    }
    range.addEventListener("input", () => show(Number(range.value)));
    root.querySelectorAll("button").forEach(b => b.addEventListener("click",
      () => show(Number(range.value) + Number(b.dataset.step))));
    show(game.moves.length);
  });
})();
"""

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
h1 { font-size: 1.6em; } h2 { margin-top: 2em; border-bottom: 1px solid #ccc; }
dl { display: grid; grid-template-columns: max-content auto; gap: 0.3em 1.5em; }
dt { font-weight: bold; }
table { border-collapse: collapse; font-size: 0.9em; }
td, th { border: 1px solid #ddd; padding: 0.25em 0.6em; text-align: right; }
th { background: #f4f4f4; }
.charts { display: flex; flex-wrap: wrap; gap: 1.5em; }
.chart { min-height: 100px; }
.games { display: flex; flex-wrap: wrap; gap: 2em; }
.game h3 { font-size: 1em; max-width: 330px; }
.controls button { min-width: 2.5em; }
.chart-error { color: #b00; }
"""


def render(
    facts: dict,
    specs: list[tuple[str, dict]],
    games: list[tuple[Path, dict]],
    links: dict,
    out_dir: Path,
) -> str:
    from stages.vega import scripts

    name = facts["repo"].name
    when = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    sections = {"strength": CHART_KEYS[:3], "training": CHART_KEYS[3:7], "self-play data": ["data"]}
    by_key = dict(specs)
    parts = [f"<h1>tengen run {_e(name)}</h1><p>report written {_e(when)}</p>", _summary(facts)]
    for title, keys in sections.items():
        present = [k for k in keys if k in by_key]
        parts.append(f"<h2>{_e(title)}</h2>")
        if title == "training" and "gate" not in present:
            gate_games = (facts["params"].get("gate") or {}).get("games")
            parts.append("<p>No gate (gate.games: 0): every candidate is promoted.</p>"
                         if gate_games == 0 else "<p>No gate games played yet.</p>")  # fmt: skip
        if title == "self-play data" and not present:
            parts.append("<p>No self-play data figures yet (the shuffle stage writes them).</p>")
        if present:
            parts.append(
                '<div class="charts">'
                + "".join(
                    f'<div class="chart" id="chart-{k}" data-chart="{k}"></div>' for k in present
                )
                + "</div>"
            )
        if title == "strength":
            parts.append(_ladder_table(facts))
    parts.append("<h2>generations</h2>" + _generation_table(facts, links))
    shown = list(facts["evals"])[-1] if facts["evals"] else None
    games_html, games_data = _games_html(games, out_dir, shown)
    parts.append(
        f"<h2>generation {shown}'s champion (the latest evaluated) against GNU Go</h2>"
        if shown is not None
        else "<h2>games against GNU Go</h2>"
    )
    parts.append(
        f'<div class="games">{games_html}</div>'
        if games
        else "<p>No evaluated games against GNU Go yet.</p>"
    )
    parts.append("<h2>MLflow</h2>")
    if "error" in links:
        parts.append(f"<p>{_e(links['error'])}</p>")
    else:
        parts.append(
            f"<p>Store {_e(links['store'])}; open its UI with <code>tengen ui --repo "
            f"{_e(facts['repo'])}</code>, then the {_link('experiment', links['experiment'])}. "
            + (
                "The loop runs:</p><ul>"
                + "".join(f"<li>{_link(n, u)} ({_e(s)})</li>" for n, u, s in links["loops"])
                + "</ul><p>Each stage's run is linked from its generation's row above.</p>"
                if links["loops"]
                else "No runs of this folder in the store: runs are found by the folder's "
                "absolute path (tag tengen.workspace), so a moved or copied folder's runs are "
                "under its old path.</p>"
            )
        )
    charts_json = _json_script({k: s for k, s in specs})
    body = "\n".join(parts)
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>tengen run {_e(name)}</title>
<style>{STYLE}</style>
{scripts()}
</head>
<body>
{body}
<script>
const CHARTS = {charts_json};
const GAMES = {_json_script(games_data)};
for (const [key, spec] of Object.entries(CHARTS)) vegaEmbed("#chart-" + key, spec);
{BOARD_SCRIPT}
</script>
</body>
</html>
"""


def write_report(
    repo: Path,
    out: Path | None = None,
    *,
    games: int = GAMES,
    mlflow_ui: str = LOCAL_UI,
    pngs: bool = True,
) -> Path:
    """Write the run's page (and a PNG per chart) to `out` (default reports/report/ in the
    run folder). Returns the page's path."""
    from gocore.atomic import write_bytes, write_text
    from stages.vega import png

    repo = Path(repo)
    facts = collect(repo)  # first: a folder that is no run leaves nothing behind
    out_dir = Path(out) if out is not None else repo / OUT
    out_dir.mkdir(parents=True, exist_ok=True)
    specs = charts(facts)
    picked = pick_games(facts, games)
    links = mlflow_links(facts, mlflow_ui)
    for old in (out_dir / "games").glob("*.sgf"):  # an earlier report's: this one copies its own
        old.unlink()
    page = write_text(render(facts, specs, picked, links, out_dir.resolve()), out_dir / PAGE)
    made = {f"{key}.png" for key, _ in specs}
    for old in out_dir.glob("*.png"):  # charts an earlier report drew that this run has not
        if old.name not in made and old.stem in CHART_KEYS:
            old.unlink()
    if pngs:
        for key, spec in specs:
            write_bytes(png(spec), out_dir / f"{key}.png")
    return page
