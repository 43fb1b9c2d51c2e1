"""The data report: what a folder of self-play rows says about the games they came from,
computed with polars lazy queries over the shards (any folder: a generation's self-play, a
shuffled window).

    tengen data data/selfplay/gen-3          # a table, from the shards
    tengen data reports/data/gen-3.json      # the same table, from the shuffle's report

The shuffle stage writes generation N's report to reports/data/gen-N.json (a DVC metric,
logged to its MLflow run; the promote stage adds its headline figures to the run's history,
which DVC plots beside the losses) and the loop logs a warning for each figure outside its
sane range (`SANE`). The figures:

- games (played out; side positions counted apart) and rows; rows per game by kind: full
  searches (with a policy target), cheap searches (value only), and rows per side position;
- game length: mean, quantiles, and the mean per board area; how games ended: two passes in
  a row, the move limit, and two passes before move 2 x the board's width (`early_end_games`:
  both sides passing almost at once); games with any pass that early (`early_pass_games`);
- Black's win rate (`black_win_rate`), draws and mean final score in even games (handicap
  games left out, so it can differ from the self-play stage's figure over all games), and
  per komi and per rules;
- the policy targets: mean entropy (nats, and as a share of a uniform target's over every
  point and pass), mean largest entry, mean mass on pass;
- value calibration: the search's root win value (binned) against the game's outcome, in
  played-out rows, and its expected calibration error (the bins' mean |predicted - observed|,
  weighted by rows);
- duplicates: the extra copies of rows whose (game id, turn) appears more than once, and the
  games they are in.

Rows only exist for recorded searches, so a game with none (all cheap searches) is not seen.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import polars as pl

from stages.cli import InputError
from stages.layout import MANIFEST
from stages.rows import ShardError, list_shards, manifest_shards, read_shard

VERSION = 1
CALIBRATION_BINS = 10
MIN_GAMES = 20  # fewer games than this: the rates are reported, not warned about

# Sane ranges: (figure, low, high, what leaving it means). None: no bound on that side.
SANE = (
    ("game_length.per_area", 1.0, None,
     "games shorter than the board's area on average (both sides pass early?)"),
    ("ends.move_limit", None, 0.05, "games stopped by the move limit (no one passes?)"),
    ("early_end_games", None, 0.10, "games ended by two passes before move 2 x the width"),
    ("black_win_rate", 0.20, 0.80, "Black's win rate in even games far from even (komi?)"),
    ("draw_rate", None, 0.20, "many drawn games (integer komi; scoring?)"),
    ("policy.pass_mass", None, 0.20, "policy targets putting much mass on pass"),
    ("value_calibration.error", None, 0.15, "root values far from the games' outcomes"),
    ("duplicate_rows", None, 0, "rows present more than once (a shard copied twice?)"),
)  # fmt: skip


def shards_of(path: Path, what: str = "data") -> list[Path]:
    """The shards of a path: a shard itself; a folder's part-K.parquet; or those of its gen-N
    folders (a run's data/selfplay). A folder with a manifest (a generation's self-play, a
    window) has its shards checked against it; any other shard is read whole once, checking
    its pages' checksums. InputError naming what is wrong."""
    path = Path(path)
    if path.is_file() and path.suffix == ".parquet":
        folders, single = [], [path]
    elif path.is_dir():
        folders, single = [path], []
        if not list_shards(path):
            folders = sorted(
                (p for p in path.glob("gen-*") if p.name[4:].isdigit()),
                key=lambda p: int(p.name[4:]),
            )
    else:
        raise InputError(f"{what}: {path} is neither a folder of self-play shards nor a shard")
    shards = []
    try:
        for folder in folders:
            if not (folder / MANIFEST).exists():
                single += list_shards(folder)
                continue
            listed, manifest = manifest_shards(folder)
            if folder != path and "window_rows" in manifest:
                raise InputError(
                    f"{what}: {folder} is a window, and the windows of {path} overlap (each "
                    "holds rows of the ones before); pass one window's folder"
                )
            shards += [shard for shard, _ in listed]
        for shard in single:
            read_shard(shard)
            shards.append(shard)
    except ShardError as e:
        raise InputError(f"{what}: {e}") from None
    if not shards:
        raise InputError(f"{what}: {path} holds no shards (part-K.parquet)")
    return shards


def _games(rows: pl.LazyFrame) -> pl.DataFrame:
    """One row per game id: its own columns and its rows counted by kind."""
    black = pl.when(pl.col("to_move") == 1).then(1.0).otherwise(-1.0)
    full = pl.col("policy_weight") > 0
    played = pl.col("score_weight") > 0
    return (
        rows.group_by("game_id")
        .agg(
            rows=pl.len(),
            full_rows=full.sum(),
            cheap_rows=(~full & played).sum(),
            turns=pl.col("turn").n_unique(),
            board_size=pl.col("board_size").first(),
            rules=pl.col("rules").first(),
            komi=pl.col("komi").first(),
            handicap=pl.col("handicap").first(),
            game_length=pl.col("game_length").first(),
            game_end=pl.col("game_end").first(),
            first_pass=pl.col("first_pass").first(),
            black_score=(pl.col("final_score") * black).first(),
        )
        .collect()
    )


def _rate(frame: pl.DataFrame, expr: pl.Expr) -> float | None:
    return None if frame.height == 0 else float(frame.select(expr.mean()).item())


def _round(x, digits: int = 4):
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(x, digits)


def _by(frame: pl.DataFrame, key: str) -> list[dict]:
    """Black's results per value of `key` (komi, rules), in its order."""
    if frame.height == 0:
        return []
    table = (
        frame.group_by(key)
        .agg(
            games=pl.len(),
            black_win_rate=(pl.col("black_score") > 0).mean(),
            mean_black_score=pl.col("black_score").mean(),
            mean_length=pl.col("game_length").mean(),
        )
        .sort(key)
    )
    return [
        {k: (_round(float(v), 4) if isinstance(v, float) else v) for k, v in row.items()}
        for row in table.iter_rows(named=True)
    ]


def report(shards: list[Path], what: str = "data") -> dict:
    """The figures of these shards (see the module's doc); a JSON-ready dict. InputError if
    polars cannot read them."""
    if not shards:
        raise InputError(f"{what}: no shards to report on (a manifest that lists none?)")
    try:
        return _report(shards)
    except pl.exceptions.PolarsError as e:
        raise InputError(f"{what}: the shards of {shards[0].parent} cannot be read ({e})") from None


def _report(shards: list[Path]) -> dict:
    rows = pl.scan_parquet([str(s) for s in shards], glob=False)
    games = _games(rows)
    played = games.filter(pl.col("game_end") != "side")
    sides = games.filter(pl.col("game_end") == "side")
    even = played.filter(pl.col("handicap") == 0)
    length = played["game_length"].cast(pl.Float64)
    area = (played["board_size"].cast(pl.Float64)) ** 2
    out: dict = {
        "version": VERSION,
        "shards": len(shards),
        "rows": int(games["rows"].sum()) if games.height else 0,
        "games": played.height,
        "side_positions": sides.height,
        "board_sizes": sorted(int(n) for n in played["board_size"].unique()),
        "rows_per_game": {
            "full": _round(_rate(played, pl.col("full_rows"))),
            "cheap": _round(_rate(played, pl.col("cheap_rows"))),
            "side_position": _round(_rate(sides, pl.col("rows"))),
        },
        "game_length": {
            "mean": _round(length.mean(), 2) if played.height else None,
            **{
                f"p{q}": (float(length.quantile(q / 100, "nearest")) if played.height else None)
                for q in (10, 50, 90)
            },
            "min": int(length.min()) if played.height else None,
            "max": int(length.max()) if played.height else None,
            "per_area": _round((length / area).mean(), 4) if played.height else None,
        },
        "ends": {
            end: _round(_rate(played, pl.col("game_end") == end))
            for end in ("passes", "move_limit")
        },
        "early_end_games": _round(
            _rate(
                played,
                (pl.col("game_end") == "passes")
                & (pl.col("game_length").cast(pl.Int32) < 2 * pl.col("board_size").cast(pl.Int32)),
            )
        ),
        # first_pass is the pass's turn (0-based): move first_pass + 1
        "early_pass_games": _round(
            _rate(
                played,
                (pl.col("first_pass") >= 0)
                & (pl.col("first_pass") + 1 < 2 * pl.col("board_size").cast(pl.Int32)),
            )
        ),
        "even_games": even.height,
        "black_win_rate": _round(_rate(even, pl.col("black_score") > 0)),
        "draw_rate": _round(_rate(even, pl.col("black_score") == 0)),
        "mean_black_score": _round(_rate(even, pl.col("black_score")), 3),
        "by_komi": _by(even, "komi"),
        "by_rules": _by(even, "rules"),
        "policy": _policy(rows),
        "value_calibration": _calibration(rows),
        "duplicate_rows": int((games["rows"] - games["turns"]).sum()) if games.height else 0,
        "duplicate_game_ids": int((games["rows"] > games["turns"]).sum()) if games.height else 0,
    }
    out["warnings"] = warnings(out)
    return out


def _policy(rows: pl.LazyFrame) -> dict:
    """Mean entropy, largest entry and pass mass of the policy targets of full searches."""
    p = pl.element()
    figures = (
        rows.filter(pl.col("policy_weight") > 0)
        .select(
            entropy=pl.col("policy_target")
            .list.eval(pl.when(p > 0).then(-p * p.log()).otherwise(0.0))
            .list.sum(),
            top=pl.col("policy_target").list.max(),
            pass_mass=pl.col("policy_target").list.last(),
            most=(pl.col("board_size").cast(pl.Float64) ** 2 + 1).log(),
        )
        .select(
            rows=pl.len(),
            entropy=pl.col("entropy").mean(),
            uniform_share=(pl.col("entropy") / pl.col("most")).mean(),
            top=pl.col("top").mean(),
            pass_mass=pl.col("pass_mass").mean(),
        )
        .collect()
        .row(0, named=True)
    )
    return {
        "rows": int(figures["rows"]),
        "entropy": _round(figures["entropy"]),
        "entropy_of_uniform_share": _round(figures["uniform_share"]),
        "top": _round(figures["top"]),
        "pass_mass": _round(figures["pass_mass"]),
    }


def _calibration(rows: pl.LazyFrame) -> dict:
    """The root win value against the outcome in played-out rows (score_weight > 0), in
    CALIBRATION_BINS equal bins of predicted win probability."""
    predicted = (1 + pl.col("root_value").cast(pl.Float64)) / 2
    bins = (
        rows.filter(pl.col("score_weight") > 0)
        .select(
            bin=(predicted * CALIBRATION_BINS).floor().clip(0, CALIBRATION_BINS - 1).cast(pl.Int32),
            predicted=predicted,
            observed=(1 + pl.col("outcome").cast(pl.Float64)) / 2,
        )
        .group_by("bin")
        .agg(
            rows=pl.len(), predicted=pl.col("predicted").mean(), observed=pl.col("observed").mean()
        )
        .sort("bin")
        .collect()
    )
    total = int(bins["rows"].sum()) if bins.height else 0
    error = None
    if total:
        error = float(((bins["predicted"] - bins["observed"]).abs() * bins["rows"]).sum() / total)
    return {
        "rows": total,
        "error": _round(error),
        "bins": [
            {
                "bin": f"{b / CALIBRATION_BINS:.1f}-{(b + 1) / CALIBRATION_BINS:.1f}",
                "rows": int(n),
                "predicted": _round(p),
                "observed": _round(o),
            }
            for b, n, p, o in bins.select("bin", "rows", "predicted", "observed").iter_rows()
        ],  # fmt: skip
    }


def load_report(path: Path) -> dict:
    """A report written by `report` (reports/data/gen-N.json); InputError if it is not one."""
    try:
        loaded = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"data: {path} cannot be read as JSON ({e})") from None
    keys = set(_report_keys())
    if not isinstance(loaded, dict) or loaded.get("version") != VERSION or keys - set(loaded):
        raise InputError(f"data: {path} is not a data report (version {VERSION})")
    return loaded


def _report_keys() -> tuple[str, ...]:
    return (
        "version", "shards", "rows", "games", "side_positions", "board_sizes", "rows_per_game",
        "game_length", "ends", "early_end_games", "early_pass_games", "even_games",
        "black_win_rate", "draw_rate", "mean_black_score", "by_komi", "by_rules", "policy",
        "value_calibration", "duplicate_rows", "duplicate_game_ids", "warnings",
    )  # fmt: skip


def figure(report: dict, name: str):
    """A report's figure by its dotted name ("game_length.mean")."""
    value = report
    for part in name.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def warnings(report: dict) -> list[str]:
    """A line for each figure outside its sane range (rates only with MIN_GAMES games)."""
    out = []
    for name, low, high, meaning in SANE:
        value = figure(report, name)
        if value is None:
            continue
        if name in ("black_win_rate", "draw_rate") and report.get("even_games", 0) < MIN_GAMES:
            continue
        if name in ("ends.move_limit", "early_end_games", "game_length.per_area") and (
            report.get("games", 0) < MIN_GAMES
        ):
            continue
        if low is not None and value < low:
            out.append(f"{name} = {value:g} is below {low:g}: {meaning}")
        elif high is not None and value > high:
            out.append(f"{name} = {value:g} is above {high:g}: {meaning}")
    return out


def history_row(report: dict) -> dict:
    """The report's headline figures, for the run's history and its plots."""
    return {
        "data_game_length": figure(report, "game_length.mean"),
        "data_black_win_rate": report.get("black_win_rate"),
        "data_early_end_games": report.get("early_end_games"),
        "data_policy_entropy": figure(report, "policy.entropy"),
        "data_policy_top": figure(report, "policy.top"),
        "data_value_calibration_error": figure(report, "value_calibration.error"),
        "data_full_rows_per_game": figure(report, "rows_per_game.full"),
    }


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.4g}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def _pct(value) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _games_n(n: int) -> str:
    return f"{n:,} game" + ("" if n == 1 else "s")


MIN_GAMES_SHOWN = 5  # per komi or rules: fewer games than this are summed up in one line


def format_report(report: dict, title: str = "") -> str:
    """The report as a plain-text table."""
    g, p, c = report["game_length"], report["policy"], report["value_calibration"]
    per, ends = report["rows_per_game"], report["ends"]
    lines = [title] if title else []

    def add(label: str, text: str) -> None:
        lines.append(f"{label:<42}{text}")

    add("shards", f"{report['shards']:,}")
    add("rows", f"{report['rows']:,}")
    add("games (side positions)", f"{report['games']:,} ({report['side_positions']:,})")
    add("board sizes", ", ".join(map(str, report["board_sizes"])) or "-")
    add("rows per game: full, cheap searches", f"{_fmt(per['full'])}, {_fmt(per['cheap'])}")
    add("rows per side position", _fmt(per["side_position"]))
    add(
        "game length: mean (p10 p50 p90)",
        f"{_fmt(g['mean'])} ({_fmt(g['p10'])} {_fmt(g['p50'])} {_fmt(g['p90'])}) moves, "
        f"{_fmt(g['per_area'])} x the board's area",
    )
    add("games ended by two passes", _pct(ends["passes"]))
    add("games stopped by the move limit", _pct(ends["move_limit"]))
    add("games ended before move 2 x width", _pct(report["early_end_games"]))
    add("games with a pass before move 2 x width", _pct(report["early_pass_games"]))
    add(
        "even games: Black wins, draws",
        f"{_pct(report['black_win_rate'])}, {_pct(report['draw_rate'])} of "
        f"{_games_n(report['even_games'])}; Black's mean score {_fmt(report['mean_black_score'])}",
    )
    for key, label in (("by_komi", "komi"), ("by_rules", "rules")):
        shown = [row for row in report[key] if row["games"] >= MIN_GAMES_SHOWN]
        for row in shown:
            add(
                f"  {label} {row[key[3:]]}",
                f"{_games_n(row['games'])}, Black wins {_pct(row['black_win_rate'])}, "
                f"mean score {_fmt(row['mean_black_score'])}, {_fmt(row['mean_length'])} moves",
            )
        rest = [row for row in report[key] if row["games"] < MIN_GAMES_SHOWN]
        if rest:
            games = sum(r["games"] for r in rest)
            add(
                f"  other {label} values",
                f"{len(rest)}, {_games_n(games)} (under {MIN_GAMES_SHOWN} each; all in --json)",
            )
    add(
        "policy targets: entropy",
        f"{_fmt(p['entropy'])} nats ({_pct(p['entropy_of_uniform_share'])} of a uniform "
        f"target's), largest entry {_fmt(p['top'])}, on pass {_fmt(p['pass_mass'])}",
    )
    add("value calibration error", f"{_fmt(c['error'])} over {c['rows']:,} rows")
    for b in c["bins"]:
        add(f"  predicted {b['bin']}", f"{b['rows']:>7,} rows, observed {_fmt(b['observed'])}")
    add(
        "duplicate rows (games)",
        f"{report['duplicate_rows']:,} ({report['duplicate_game_ids']:,})",
    )
    for w in report["warnings"]:
        lines.append(f"warning: {w}")
    return "\n".join(lines)
