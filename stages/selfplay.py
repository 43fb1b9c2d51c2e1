"""The self-play stage: the champion net (uniform priors at generation 0) plays `games` games
against itself; out come Parquet shards of training rows, one SGF per game and a metrics JSON.

    python -m stages.selfplay --generation N [--model models/gen-(N-1)/champion/champion.pt]
        [--out data/selfplay/gen-N] [--metrics reports/selfplay/gen-N.json] [--params params.yaml]

Everything lands in a temporary folder next to `--out` that is renamed into place at the end,
so a killed run leaves no half-written generation. The same seed and inputs give the same
shards on the CPU (params `selfplay.seed` with the generation number).
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np

from gocore.atomic import output_dir, write_json
from gocore.board import BLACK, PASS, point_xy
from gocore.selfplay import (
    CHEAP,
    FULL,
    KIND_NAMES,
    FinishedGame,
    SelfPlay,
)
from play.models import UNIFORM, load_evaluator
from play.sgf import GameRecord, save_sgf
from stages import cli, layout, tracking
from stages.champions import previous_champion
from stages.params import Device, ParamsError, Section, SelfPlayParams, read
from stages.rows import SCHEMA, list_shards, manifest_entries, table_from_columns, write_shard
from stages.spec import DvcStage, Plan, sections


class Params(Section):
    """What the self-play stage reads of params.yaml."""

    selfplay: SelfPlayParams
    device: Device


@dataclasses.dataclass(frozen=True)
class SelfPlayIO:
    generation: int
    out: Path  # data/selfplay/gen-N: part-K.parquet and sgf/
    metrics: Path  # reports/selfplay/gen-N.json
    model: Path | None = None  # the champion checkpoint; None: uniform priors (generation 0)


def dvc(n: int, plan: Plan) -> list[DvcStage]:
    """Generation n's self-play, from the champion after generation n - 1."""
    champion = (str(layout.champion_dir(n - 1)),) if n > 0 else ()
    return [
        DvcStage(
            f"selfplay-{n}", "stages.selfplay", f"--generation {n} --quiet", sections(Params),
            deps=champion, outs=(str(layout.selfplay_dir(n)),),
            metrics=(str(layout.selfplay_report(n)),),
        )
    ]  # fmt: skip


def prepare(
    params_path: str | Path,
    generation: int,
    *,
    model: str | Path | None = None,
    out: str | Path | None = None,
    metrics: str | Path | None = None,
    games: int | None = None,
) -> tuple[Params, SelfPlayIO]:
    """The stage's parameters and paths (defaults: stages.layout), checked before any game is
    played."""
    params = read(params_path, Params)
    if games is not None:
        if games < 1:
            raise ParamsError(f"selfplay: --games must be >= 1 (got {games})")
        params = params.model_copy(
            update={"selfplay": params.selfplay.model_copy(update={"games": games})}
        )
    if model is None:
        # The champion after the previous generation, if there is one yet.
        model = previous_champion(generation, "selfplay")
    elif str(model) == UNIFORM:
        model = None
    if model is not None and not Path(model).is_file():
        raise ParamsError(f"selfplay: model {model} does not exist (the promote stage writes it)")
    io = SelfPlayIO(
        generation=generation,
        out=Path(out or layout.selfplay_dir(generation)),
        metrics=Path(metrics or layout.selfplay_report(generation)),
        model=Path(model) if model is not None else None,
    )
    return params, io


def game_seed(seed: int, generation: int) -> int:
    """The run's seed for one generation: independent streams, fixed by (seed, generation)."""
    return int(np.random.SeedSequence([seed, generation]).generate_state(1, np.uint64)[0] >> 1)


def sgf_record(game: FinishedGame, game_id: str, model_id: str, generation: int) -> GameRecord:
    info = game.info
    n = info.size
    moves, comments = [], []
    for i, (color, p) in enumerate(zip(info.colors, info.moves, strict=True)):
        moves.append((int(color), None if p == PASS else point_xy(game.stride, int(p))))
        kind = int(info.kinds[i])
        text = KIND_NAMES[kind]
        if kind in (FULL, CHEAP):
            rate = float(info.winrates[i])
            black = rate if color == BLACK else 1.0 - rate
            text += f": {int(info.visits[i])} visits, Black wins {black:.1%}"
        comments.append(text)
    lead = info.black_lead
    if info.side_of >= 0:
        result = None  # a side position is not played out
    else:
        result = "0" if lead == 0 else f"B+{lead:g}" if lead > 0 else f"W+{-lead:g}"
    root = [f"tengen self-play, generation {generation}, game {game_id}, model {model_id}"]
    if info.side_of >= 0:
        root.append(f"side position of game {info.side_of} (not played out)")
    if info.fork_turn >= 0:
        root.append(f"early fork at turn {info.fork_turn}")
    if info.decided_at >= 0:
        root.append(f"decided at turn {info.decided_at} (fewer visits, rows down-weighted)")
    return GameRecord(
        size=n,
        komi=info.komi,
        rules=info.rules,
        handicap=info.handicap,
        setup=[(c, point_xy(game.stride, p)) for c, p in info.setup],
        moves=moves,
        comments=comments,
        result=result,
        black=f"tengen {model_id}",
        white=f"tengen {model_id}",
        root_comment="; ".join(root),
    )


class _Progress:
    """A progress line: games done, moves/s, visits/s (rich, when a terminal is attached)."""

    def __init__(self, games: int, enabled: bool):
        self.enabled = enabled and sys.stderr.isatty()
        self.start = time.perf_counter()
        self.last = 0.0
        self.bar = None
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

            self.bar = Progress(
                TextColumn("self-play"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[rates]}"),
                transient=False,
            )
            self.task = self.bar.add_task("games", total=games, rates="")
            self.bar.start()

    def __call__(self, sp: SelfPlay) -> None:
        now = time.perf_counter()
        if self.bar is None or now - self.last < 0.5:
            return
        self.last = now
        elapsed = now - self.start
        rates = f"{sp.moves_done / elapsed:,.0f} moves/s  {sp.visits_done / elapsed:,.0f} visits/s"
        self.bar.update(self.task, completed=sp.finished, rates=rates)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def run(params: Params, io: SelfPlayIO, *, progress: bool = True) -> dict:
    """Play the generation's games; write shards, SGFs and metrics. Returns the metrics."""
    device, params = params.device, params.selfplay
    seed = game_seed(params.seed, io.generation)
    net, model_id = load_evaluator(io.model, device=device, seed=seed)
    config = params.config()
    sp = SelfPlay(config, net, games=params.games, slots=params.slots, seed=seed)
    bar = _Progress(params.games, progress)
    sp.on_step = bar
    start = time.perf_counter()
    with output_dir(io.out) as tmp, contextlib.closing(bar):
        pending: list[tuple[FinishedGame, str]] = []
        pending_rows = 0
        shard = 0
        stats = _Stats()
        for game in sp.run():
            game_id = f"g{io.generation}-s{params.seed}-{game.info.index:06d}"
            record = sgf_record(game, game_id, model_id, io.generation)
            save_sgf(record, tmp / "sgf" / f"{game_id}.sgf")
            stats.add(game)
            pending.append((game, game_id))
            pending_rows += len(game.rows["turn"])
            if pending_rows >= params.rows_per_shard:
                _write(pending, tmp / f"part-{shard}.parquet", io.generation, model_id)
                shard, pending, pending_rows = shard + 1, [], 0
        if pending or shard == 0:
            _write(pending, tmp / f"part-{shard}.parquet", io.generation, model_id)
        shards = manifest_entries(list_shards(tmp))
        write_json({"generation": io.generation, "files": shards}, tmp / layout.MANIFEST)
        bar.last = 0.0
        bar(sp)  # the bar's last line: every game done
        seconds = time.perf_counter() - start
        metrics = stats.metrics(sp, seconds)
        metrics.update(generation=io.generation, model_id=model_id, seed=seed)
    write_json(metrics, io.metrics)
    return metrics


class _Stats:
    """The generation's metrics: games (side positions counted apart), rows, results."""

    def __init__(self):
        self.games = 0
        self.sides = 0
        self.rows = 0
        self.side_rows = 0
        self.full_rows = 0
        self.moves = 0
        self.black_wins = 0
        self.draws = 0
        self.forks = 0
        self.handicap = 0
        self.decided = 0

    def add(self, game: FinishedGame) -> None:
        info = game.info
        rows = len(game.rows["turn"])
        self.rows += rows
        self.full_rows += int((game.rows["policy_weight"] > 0).sum())
        if info.side_of >= 0:
            self.sides += 1
            self.side_rows += rows
            return
        self.games += 1
        self.moves += len(info.moves)
        self.black_wins += info.black_lead > 0
        self.draws += info.black_lead == 0
        self.forks += info.fork_turn >= 0
        self.handicap += info.handicap > 0
        self.decided += info.decided_at >= 0

    def metrics(self, sp: SelfPlay, seconds: float) -> dict:
        g = max(self.games, 1)
        return {
            "games": self.games,
            "rows": self.rows,
            "rows_with_policy_target": self.full_rows,
            "side_positions": self.sides,
            "side_position_rows": self.side_rows,
            "mean_game_length": round(self.moves / g, 2),
            "black_win_rate": round(self.black_wins / g, 4),
            "draw_rate": round(self.draws / g, 4),
            "early_fork_games": self.forks,
            "handicap_games": self.handicap,
            "decided_games": self.decided,
            "seconds": round(seconds, 2),
            "moves_per_s": round(sp.moves_done / seconds, 2),
            "visits_per_s": round(sp.visits_done / seconds, 2),
            "evaluations_per_s": round(sp.evaluations / seconds, 2),
        }


def game_columns(info) -> dict:
    """A finished game's own columns of its rows (stages.rows): how long it was, how it ended
    (two passes in a row, the move limit, or a side position's stop), its first pass."""
    moves = np.asarray(info.moves)
    passes = np.flatnonzero(moves == PASS)
    if info.side_of >= 0:
        end = "side"
    elif len(moves) >= 2 and moves[-1] == PASS and moves[-2] == PASS:
        end = "passes"
    else:
        end = "move_limit"
    return {
        "rules": info.rules,
        "komi": info.komi,
        "game_length": len(moves),
        "game_end": end,
        "first_pass": int(passes[0]) if len(passes) else -1,
        "handicap": info.handicap,
    }


def _write(pending, path: Path, generation: int, model_id: str) -> None:
    if not pending:  # a generation whose games left no row still has its (empty) shard
        write_shard(SCHEMA.empty_table(), path)
        return
    cols = {name: np.concatenate([g.rows[name] for g, _ in pending]) for name in pending[0][0].rows}
    lengths = [len(g.rows["turn"]) for g, _ in pending]
    per_game = [dict(game_columns(g.info), game_id=gid) for g, gid in pending]
    games = {k: np.repeat([c[k] for c in per_game], lengths) for k in per_game[0]}
    write_shard(table_from_columns(cols, games, generation=generation, model_id=model_id), path)


def main(argv: list[str] | None = None) -> int:
    p = cli.parser("selfplay", __doc__)
    p.add_argument(
        "--model",
        default=None,
        help="a checkpoint, or 'uniform' (default: the previous generation's champion)",
    )
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--metrics", type=Path, default=None)
    p.add_argument("--games", type=int, default=None, help="override selfplay.games")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)

    def work(tracked):
        params, io = prepare(
            args.params, args.generation, model=args.model, out=args.out,
            metrics=args.metrics, games=args.games,
        )  # fmt: skip
        cli.set_threads(params.selfplay.threads)
        metrics = run(params, io, progress=not args.quiet)
        if tracked is not None:
            track(tracked, io, metrics)
        return metrics

    return cli.finish("selfplay", work, Params, params=args.params, generation=args.generation)


def track(tracked, io: SelfPlayIO, metrics: dict) -> None:
    """Lineage: the model that played (its checkpoint's digest) and the data it made."""
    tracked.tag(
        {
            "tengen.model_sha256": tracking.model_digest(io.model),
            "tengen.model_id": metrics.get("model_id"),
            "tengen.data_sha256": tracking.data_digest(io.out),
            "tengen.data": str(io.out),
        }
    )
    tracked.log_artifact(io.metrics)


if __name__ == "__main__":
    sys.exit(main())
